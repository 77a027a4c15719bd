"""cloud-agent init and serve."""

import logging
import os
import signal
import socket
from pathlib import Path

import click

from agent.common import Options, command_options, emit
from controller.audit import request_ids
from controller.config import load_config, sandbox_values, write_config
from controller.errors import ControllerError, InvalidInput
from controller.security.crypto import generate_key_file
from controller.store import Store


def _ensure_network(config) -> str:
    """Create, start and autostart the private network when missing; what happened, in words.

    A hypervisor that cannot be reached is not fatal here (init also runs before the
    service starts): `cloud-agent check` reports it.
    """
    from host_adapters.factory import build_hypervisor

    name = config.network.name
    try:
        made = build_hypervisor(config).ensure_network()
    except ControllerError as e:
        logging.getLogger("cloud_agent").warning("network %s not checked: %s", name, e.message)
        return f"not checked ({e.message})"
    return "created" if made else "present"


def _record_config_host(config, store) -> None:
    """The config's [libvirt] uri is a hypervisor host from the start: a single node needs no `host add`."""
    from host_adapters.factory import config_host

    spec = config_host(config)
    store.upsert_config_host({"name": spec.name, "uri": spec.uri, "storage_pool": spec.storage_pool,
                              "network": spec.network})


def _prepare(config) -> tuple[str, bool]:
    """Create or migrate the database and make the secret key file if missing."""
    key_file = config.auth.secret_key_file
    made_key = False
    if not Path(key_file).exists():
        generate_key_file(key_file)
        made_key = True
    if Path(config.database_path).exists():
        # Before it is opened: its -wal, -shm and -mark files take its mode (a new one is made 0600).
        os.chmod(config.database_path, 0o600)
    store = Store(config.database_path, create=True)
    try:
        store.migrate()
        _record_config_host(config, store)
    finally:
        store.close()
    return config.database_path, made_key


@click.command("init")
@click.option("--sandbox", "sandbox_dir", type=click.Path(file_okay=False), default=None,
              help="Write a sandbox config with all state under DIR, then create its database.")
@command_options
def init(opts: Options, sandbox_dir):
    """Create or migrate the database of a config; with --sandbox DIR, write a sandbox config first.

    Examples:
      cloud-agent --config ./state/controller.ini init --sandbox ./state
      cloud-agent init
    """
    if sandbox_dir:
        state = Path(sandbox_dir).resolve()
        values = sandbox_values(str(state))
        for sub in ("home",):
            (state / sub).mkdir(parents=True, exist_ok=True)
        from host_adapters.accounts.sysroot import make_sysroot

        make_sysroot(str(values["unix"]["root"]))
        write_config(values, opts.path)
        config = load_config(opts.path)
        _prepare(config)
        _ensure_network(config)
        emit(opts, {"config": str(Path(opts.path).resolve())}, f"wrote sandbox config {opts.path}")
        return
    config = opts.config()
    path, _ = _prepare(config)
    network = _ensure_network(config)
    emit(opts, {"database": str(Path(path).resolve())},
         f"database ready: {path}\nnetwork {config.network.name}: {network}")


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about readiness; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(addr)
        sock.sendall(message.encode())


@click.command("serve")
@click.option("--host", default=None, help="Address to listen on (default: [server] host).")
@click.option("--port", type=int, default=None, help="Port to listen on (default: [server] port).")
@click.option("--metrics-port", type=int, default=None,
              help="Serve the metrics on this port of [metrics] listen_host, even where [metrics] enabled is false.")
@command_options
def serve(opts: Options, host, port, metrics_port):
    """Run the API on waitress until stopped (and the Prometheus metrics on their own address).

    Example: cloud-agent --config ./state/controller.ini serve --host 127.0.0.1 --port 8080 --metrics-port 9180
    """
    from waitress import create_server

    from api.admission import server_threads
    from api.app import build_context_for, create_app, interfaces_of
    from api.server import RequestDeadline, fit_open_files, waitress_settings

    # Each line names the request it was logged for ("-" outside one), as its answer's X-Request-Id does.
    request_ids.stamp_log_records()
    logging.basicConfig(level=logging.INFO, format=request_ids.LOG_FORMAT)
    # waitress warns on every queued request; under load that floods the log and costs throughput.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    log = logging.getLogger("cloud_controller")
    config = opts.config()
    try:
        interfaces = interfaces_of(config)
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    ctx = build_context_for(config, interfaces)
    from controller.cloud_auth.client import CloudAuthDown
    from controller.cloud_auth.follower import follower_for

    # A controller following a cloud auth: its copy of users is brought up to date before the
    # first request (when cloud auth answers), then kept by a thread of its own.
    ctx.cloud_auth = follower_for(ctx)
    if ctx.cloud_auth is not None:
        try:
            ctx.cloud_auth.poll()
        except CloudAuthDown as e:
            log.warning("cloud auth: %s; serving tokens already seen for the offline grace", e.message)
        ctx.cloud_auth.start()
    if ctx.adapters is not None:
        from controller.hosts.host_routing import record_config_host

        record_config_host(ctx)
    if ctx.adapters is not None and ctx.adapters.hypervisor_in_process:
        # The libvirt test driver keeps nothing between processes: rebuild its
        # base disks and domains from the database before serving.
        from controller.maintenance.reconcile import reconcile

        for item in reconcile(ctx, fix=True):
            log.info("sandbox reconcile: %s %s %s", "fixed" if item["fixed"] else "left", item["kind"], item["target"])
    if ctx.adapters is not None:
        from controller.background import Background, run_later
        from controller.storage.volumes import purge_retired

        ctx.background = Background()
        # Homes deleted before a crash or a restart, whose removal did not finish.
        for path in ctx.adapters.homes.list_retired():
            run_later(ctx, f"removing deleted home {path}", lambda p=path: purge_retired(ctx, p))
    app = create_app(ctx, interfaces=interfaces)
    connection_limit = fit_open_files(config.server.connection_limit)
    server = create_server(
        app,
        host=host or config.server.host,
        port=port if port is not None else config.server.port,
        threads=server_threads(config),  # reads keep [server] threads whatever host work holds
        **waitress_settings(config, connection_limit=connection_limit),
    )
    RequestDeadline.attach(server, config.server.request_timeout_seconds)
    log.info("serving on http://%s:%s", server.effective_host, server.effective_port)
    from api.metrics_server import start_metrics

    try:
        metrics = start_metrics(ctx, port=metrics_port, api_address=(server.effective_host, server.effective_port))
    except InvalidInput:
        server.close()
        raise
    from controller.audit.trail import Housekeeper

    # Anonymous-failure counts on time, and [audit] retention_days applied hourly.
    housekeeper = Housekeeper(store=ctx.store, anonymous=ctx.anonymous_failures,
                              retention_days=config.audit.retention_days)
    housekeeper.start()
    sweeper = None
    if ctx.adapters is not None:
        from controller.instances.leases import LeaseSweeper

        # Leases: warnings, power-offs and deletes due, at once (those due while this
        # controller was down) and every [leases] check_seconds.
        sweeper = LeaseSweeper(ctx)
        sweeper.start()
    # The first round of health checks is in before the first probe can arrive; later
    # rounds run on the monitor's own thread, never on a request thread.
    from controller.monitoring.health import monitor_of

    monitor_of(ctx).start(wait=True)
    def stop(signum, frame):
        raise KeyboardInterrupt  # leaves server.run() through the same clean path as Ctrl-C

    # systemd stops services with SIGTERM.
    signal.signal(signal.SIGTERM, stop)
    try:
        _sd_notify("READY=1")
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        _sd_notify("STOPPING=1")
        server.close()
        monitor_of(ctx).stop()
        if ctx.cloud_auth is not None:
            ctx.cloud_auth.stop()
        if sweeper is not None:
            sweeper.stop()
        housekeeper.stop()  # writes the anonymous failures still counted
        if metrics is not None:
            metrics.stop()


@click.group("sandbox")
def sandbox():
    """Sandbox-only tools (profile = sandbox)."""


@sandbox.command("load")
@click.option("--users", type=int, default=10_000, show_default=True, help="Users in all.")
@click.option("--owners", type=int, default=100, show_default=True, help="Users that own managed users.")
@click.option("--managed-per-owner", type=int, default=50, show_default=True)
@click.option("--instances", type=int, default=10_000, show_default=True)
@click.option("--owner-instances", type=int, default=49, show_default=True,
              help="Instances of each owner; managed users get 1 each, plain users the rest.")
@click.option("--groups", type=int, default=1_000, show_default=True)
@click.option("--members-per-group", type=int, default=5, show_default=True)
@command_options
def sandbox_load(opts: Options, users, owners, managed_per_owner, instances, owner_instances, groups,
                 members_per_group):
    """Load the sandbox with users, accounts, homes, groups and instances in bulk
    (agent/sandbox_load.py); prints counts, the loaded users' shared password and
    the credentials of a few of them. The next `serve` makes the instances' domains.

    Example: cloud-agent --config ./state/controller.ini --json sandbox load --users 1000 --owners 10 --instances 1000 --groups 100
    """
    from agent.sandbox_load import Shape, load

    ctx = opts.context(adapters=True)
    shape = Shape(users=users, owners=owners, managed_per_owner=managed_per_owner, instances=instances,
                  owner_instances=owner_instances, groups=groups, members_per_group=members_per_group)
    show = (lambda m: click.echo(f"load: {m}", err=True)) if not opts.as_json else (lambda _m: None)
    result = load(ctx, shape, progress=show)
    emit(opts, result, "\n".join(f"{k}: {v}" for k, v in result.items() if k not in ("sample", "instance_ids")))


def register(cli) -> None:
    cli.add_command(init)
    cli.add_command(serve)
    cli.add_command(sandbox)
