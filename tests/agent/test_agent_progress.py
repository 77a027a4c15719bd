"""Long agent commands show progress on a terminal and print only their JSON document with --json."""

import json
import os
import subprocess

import pexpect
import pytest

from controller.config import load_config, write_config
from tests.fixtures.agent import AGENT
from tests.fixtures.api import config_values_for

def spawn(*args, env=None):
    child = pexpect.spawn(str(AGENT), list(args), env=env or dict(os.environ), encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus, child.before


@pytest.fixture
def sandbox_with_accounts(tmp_path):
    config = str(tmp_path / "controller.ini")
    subprocess.run([AGENT, "--config", config, "init", "--sandbox", str(tmp_path / "state")], check=True,
                   capture_output=True)
    from controller.users.accounts import enable_account
    from controller.context import build_context
    from controller.users.users import insert_user
    from host_adapters.factory import build_adapters

    cfg = load_config(config)
    ctx = build_context(cfg, adapters=build_adapters(cfg))
    ctx.passwords = type(ctx.passwords)(time_cost=1, memory_kib=1024)
    for i in range(3):
        insert_user(ctx, email=f"u{i}@example.org", password="User-pass-2026!")
        enable_account(ctx, f"u{i}@example.org", username=f"u{i}")
    return config


@pytest.mark.real_commands
def test_reconcile_shows_progress_on_a_terminal_only(sandbox_with_accounts):
    config = sandbox_with_accounts
    status, out = spawn("--config", config, "reconcile")
    assert status == 0, out
    assert "reconcile: accounts 1/3" in out and "reconcile: accounts 3/3" in out
    assert "no drift" in out
    status, out = spawn("--config", config, "--json", "reconcile")
    assert status == 0
    assert json.loads(out) == {"drift": []}  # nothing but the document, even on a terminal


@pytest.mark.integration
@pytest.mark.real_commands
def test_image_upload_shows_progress_and_json_stays_clean(tmp_path, libvirt_dir_pool):
    values = config_values_for(tmp_path)
    values["controller"]["profile"] = "production"
    values["libvirt"].update(uri=libvirt_dir_pool.uri, storage_pool=libvirt_dir_pool.name, domain_prefix="prog-")
    config = str(tmp_path / "controller.ini")
    write_config(values, config)
    (tmp_path / "home").mkdir(exist_ok=True)
    subprocess.run([AGENT, "--config", config, "init"], check=True, capture_output=True)
    source = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(source), "1G"], check=True)
    # Some real content, so the upload takes more than one chunk.
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 8M", str(source)], check=True,
                   capture_output=True)
    args = ["--config", config, "image", "add", "--name", "up", "--os-name", "debian", "--os-major", "12",
            "--os-minor", "7", "--min-disk", "1", "--min-ram", "64", "--source", str(source)]
    try:
        status, out = spawn(*args)
        assert status == 0, out
        assert "uploading:" in out and "100%" in out
        status, out = spawn("--json", *args[:5], "up2", *args[6:])
        assert status == 0, out
        assert "uploading" not in out
        image = json.loads(out)
        assert image["name"] == "up2" and image["min-disk"] == 1
        volumes = os.listdir(libvirt_dir_pool.path)
        assert f"prog-base-{image['id']}.qcow2" in volumes
    finally:
        import libvirt

        conn = libvirt.open(libvirt_dir_pool.uri)
        pool = conn.storagePoolLookupByName(libvirt_dir_pool.name)
        pool.refresh(0)
        for vol in pool.listAllVolumes(0):
            if vol.name().startswith("prog-"):
                vol.delete(0)
        conn.close()
