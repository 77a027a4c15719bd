"""The HTTP server around the app: waitress's connection settings, the open-files limit
they need, and a deadline on requests that never finish arriving.

waitress reads requests on one event loop and hands only complete ones to its
threads, so idle and half-sent connections cost a slot and a descriptor, not a
thread. Its defaults (100 slots, idle connections kept 120 s) let a few hundred
such connections, which any user of the head node can open, stop it accepting
anyone else. The `[server]` keys below size the slots, close idle connections
soon, and close a request that has been arriving for too long, however slowly
it trickles in (waitress's own idle timeout restarts at every byte).
See docs/decisions.md, "Slow and idle clients".
"""

import json
import logging
import resource
import time

from waitress.channel import HTTPChannel
from waitress.task import ErrorTask

from api.envelopes import controller_body, is_user_interface, user_body
from controller.audit import request_ids
from controller.config import Config

log = logging.getLogger(__name__)

# Each connection holds one descriptor, and up to two more while a large body or
# reply is spooled to a temporary file (waitress's inbuf/outbuf overflow).
DESCRIPTORS_PER_CONNECTION = 3
# Descriptors beside the connections: the database, libvirt, LDAP, logs, command pipes.
DESCRIPTORS_RESERVED = 256


# waitress refuses a body over this many times [server] max_body_bytes itself, before
# buffering it; the app refuses smaller ones over the limit.
WAITRESS_BODY_FACTOR = 4


def waitress_settings(config: Config, *, connection_limit: int) -> dict:
    """waitress keyword arguments for the `[server]` connection keys."""
    max_body = config.server.max_body_bytes
    return {
        "connection_limit": connection_limit,
        "channel_timeout": config.server.channel_timeout_seconds,
        "cleanup_interval": config.server.cleanup_interval_seconds,
        "backlog": config.server.backlog,
        "max_request_header_size": config.server.max_header_bytes,
        # Bodies a little over the limit reach the app, which refuses them with 413 in
        # the interface's envelope; waitress refuses far larger ones itself before
        # buffering them, in the envelope too (EnvelopedErrorTask).
        "max_request_body_size": WAITRESS_BODY_FACTOR * max_body + 1,
        # select() cannot watch a descriptor numbered 1024 or more (FD_SETSIZE): with
        # more connections than that waitress's loop would fail. poll() has no such bound.
        "asyncore_use_poll": True,
        "ident": "cloud-controller",
    }


def fit_open_files(connection_limit: int) -> int:
    """Raise this process's soft open-files limit to what connection_limit needs,
    within the hard limit; the number of connections that fit.

    A connection accepted past the limit fails with EMFILE and waitress retries
    accept() in a loop: better to accept fewer, and say so at start.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connection_limit * DESCRIPTORS_PER_CONNECTION + DESCRIPTORS_RESERVED
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    if soft == resource.RLIM_INFINITY:
        return connection_limit
    fits = max(1, (soft - DESCRIPTORS_RESERVED) // DESCRIPTORS_PER_CONNECTION)
    if fits < connection_limit:
        log.warning("open-files limit %d (hard %s) fits %d connections, not [server] connection_limit %d: "
                    "raise LimitNOFILE", soft, hard, fits, connection_limit)
        return fits
    return connection_limit


class RequestDeadline:
    """Closes a connection whose request (line, headers and body) has been arriving for
    longer than `seconds`, as a reverse proxy's header and body timeouts would.

    Runs in waitress's own maintenance pass (every cleanup_interval, on the event loop
    thread that also reads the requests, so nothing here races the parser). Only a
    request still arriving counts: one being served, however long it takes, does not.
    """

    def __init__(self, seconds: float, clock=time.time):
        self.seconds = seconds
        self._clock = clock
        self._arriving: dict[int, tuple[object, float]] = {}  # channel id -> (its parser, first seen)

    @classmethod
    def attach(cls, server, seconds: float, *, clock=time.time) -> None:
        """One deadline in the maintenance of each listening socket of a waitress server
        (each has its own channels, so each keeps its own clocks). `serve` calls this once for
        its server, so each listener's refusals are put in the envelope here too
        (answer_refusals_in_envelopes)."""
        for listener in _listeners(server):
            deadline = cls(seconds, clock=clock)
            listener.maintenance = deadline._wrap(listener)
        answer_refusals_in_envelopes(server)

    def _wrap(self, listener):
        original = listener.maintenance

        def maintenance(now):
            original(now)
            self.sweep(listener.active_channels.values())

        return maintenance

    def sweep(self, channels) -> list:
        """Mark the channels past their deadline to be closed; the ones marked."""
        now = self._clock()
        seen: dict[int, tuple[object, float]] = {}
        closed = []
        for channel in channels:
            parser = channel.request  # the request still arriving, if any
            if parser is None or parser.completed or channel.requests or channel.will_close:
                continue
            before = self._arriving.get(id(channel))
            since = before[1] if before is not None and before[0] is parser else now
            if now - since >= self.seconds:
                channel.will_close = True  # the loop closes it at its next pass
                closed.append(channel)
                continue
            seen[id(channel)] = (parser, since)
        self._arriving = seen  # channels gone or served drop out here
        if closed:
            log.info("closed %d connection(s) whose request took over %g s to arrive", len(closed), self.seconds)
        return closed


def _listeners(server) -> list:
    # create_server returns one listener, or a MultiSocketServer holding several (e.g. a
    # host name with IPv4 and IPv6 addresses) in its map.
    if hasattr(server, "active_channels"):
        return [server]
    return [d for d in server.map.values() if hasattr(d, "active_channels")]


# -- waitress's own refusals, in the API's envelope ------------------------------------------------
class EnvelopedErrorTask(ErrorTask):
    """What waitress answers itself, never asking the app (a body far over the limit: 413;
    header fields too large: 431; a request it cannot parse: 400), as the app answers every
    error: JSON in the envelope of the interface the path belongs to, with an X-Request-Id."""

    def execute(self):
        error = self.request.error
        path = self.request.path or ""
        if error.code == 413:
            # The app's own limit, as its 413 says it (waitress's is a multiple of it).
            limit = (self.channel.server.adj.max_request_body_size - 1) // WAITRESS_BODY_FACTOR
            message = f"request body over {limit} bytes"
        else:
            message = f"{error.reason.lower()}: {error.body}"
        envelope = (user_body(message=message, success=False) if is_user_interface(path)
                    else controller_body([], msg=message, success=False))
        body = json.dumps(envelope).encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.extend([("Content-Type", "application/json"), ("X-Request-Id", request_ids.new())])
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class EnvelopedChannel(HTTPChannel):
    error_task_class = EnvelopedErrorTask


def answer_refusals_in_envelopes(server) -> None:
    """Each listener of a waitress server answers waitress's own refusals in the envelope
    (EnvelopedErrorTask)."""
    for listener in _listeners(server):
        listener.channel_class = EnvelopedChannel
