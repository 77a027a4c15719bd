"""The HTTP server's connection settings (issue 16, finding 1): the [server] keys reach
waitress, the open-files limit is raised to fit them, and a request that keeps arriving
is closed after its deadline. The server itself is exercised in test_slow_clients.py.
"""

import configparser
import logging
import resource
import time
from pathlib import Path

import pytest

from api import server
from api.server import DESCRIPTORS_PER_CONNECTION, DESCRIPTORS_RESERVED, RequestDeadline
from controller.config import DEFAULTS, config_from_dict
from controller.errors import InvalidInput


def test_the_server_keys_reach_waitress(config_values):
    values = dict(config_values, server=dict(config_values["server"], channel_timeout_seconds=7, backlog=64,
                                             cleanup_interval_seconds=3, max_header_bytes=4096))
    settings = server.waitress_settings(config_from_dict(values), connection_limit=500)
    assert settings["connection_limit"] == 500
    assert (settings["channel_timeout"], settings["cleanup_interval"], settings["backlog"]) == (7, 3, 64)
    assert settings["max_request_header_size"] == 4096
    assert settings["max_request_body_size"] == 4 * 1048576 + 1
    # More than 1024 descriptors: select() cannot watch them, poll() can.
    assert settings["asyncore_use_poll"] is True
    from waitress.adjustments import Adjustments

    Adjustments(**settings)  # every key is one waitress knows


@pytest.mark.parametrize("key", ["connection_limit", "channel_timeout_seconds", "request_timeout_seconds",
                                 "cleanup_interval_seconds", "backlog", "max_header_bytes"])
def test_a_server_key_below_one_is_refused(config_values, key):
    values = dict(config_values, server=dict(config_values["server"], **{key: 0}))
    with pytest.raises(InvalidInput, match=f"\\[server\\] {key}"):
        config_from_dict(values)


class Limits:
    """Stands in for getrlimit/setrlimit of RLIMIT_NOFILE."""

    def __init__(self, soft, hard):
        self.soft, self.hard = soft, hard

    def getrlimit(self, which):
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which, limits):
        assert which == resource.RLIMIT_NOFILE and limits[1] == self.hard and limits[0] <= self.hard
        self.soft = limits[0]


def test_the_soft_open_files_limit_is_raised_to_fit_the_connections(monkeypatch):
    limits = Limits(1024, 524288)
    monkeypatch.setattr(server.resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(server.resource, "setrlimit", limits.setrlimit)
    assert server.fit_open_files(1000) == 1000
    assert limits.soft == 1000 * DESCRIPTORS_PER_CONNECTION + DESCRIPTORS_RESERVED


def test_a_short_hard_limit_means_fewer_connections_and_a_warning(monkeypatch, caplog):
    limits = Limits(1024, 2048)
    monkeypatch.setattr(server.resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(server.resource, "setrlimit", limits.setrlimit)
    with caplog.at_level(logging.WARNING, logger="api.server"):
        fits = server.fit_open_files(1000)
    assert limits.soft == 2048
    assert fits == (2048 - DESCRIPTORS_RESERVED) // DESCRIPTORS_PER_CONNECTION < 1000
    assert "raise LimitNOFILE" in caplog.text


def test_the_unit_allows_the_default_connections():
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(Path(__file__).resolve().parents[2] / "systemd" / "cloud-controller.service")
    wanted = int(DEFAULTS["server"]["connection_limit"]) * DESCRIPTORS_PER_CONNECTION + DESCRIPTORS_RESERVED
    assert int(parser["Service"]["LimitNOFILE"]) >= wanted


class Parser:
    completed = False


class Channel:
    """What RequestDeadline reads of a waitress channel."""

    def __init__(self):
        self.request = None  # the request still arriving
        self.requests = []  # requests read and being served
        self.will_close = False


def test_a_request_arriving_for_longer_than_the_deadline_is_closed():
    now = [0.0]
    deadline = RequestDeadline(30, clock=lambda: now[0])
    idle, arriving, served, next_one = Channel(), Channel(), Channel(), Channel()
    arriving.request = Parser()
    served.requests = [object()]
    served.request = Parser()  # the next request pipelined behind one being served
    channels = [idle, arriving, served, next_one]
    assert deadline.sweep(channels) == []
    now[0] = 20.0
    next_one.request = Parser()  # started later: its own clock
    assert deadline.sweep(channels) == []
    now[0] = 30.0
    assert deadline.sweep(channels) == [arriving] and arriving.will_close
    now[0] = 49.9
    assert deadline.sweep(channels) == []
    now[0] = 50.0
    assert deadline.sweep(channels) == [next_one]
    # A channel whose request completed, and then started another, starts afresh.
    again = Channel()
    again.request = Parser()
    deadline.sweep([again])
    again.request = Parser()
    now[0] = 100.0
    assert deadline.sweep([again]) == []
    assert not idle.will_close and not served.will_close


@pytest.mark.parametrize("section", ["server", "health"])
def test_the_sample_config_shows_the_defaults(section):
    sample = configparser.ConfigParser(interpolation=None)
    sample.read(Path(__file__).resolve().parents[2] / "etc" / "controller.ini.sample")
    assert dict(sample[section]) == DEFAULTS[section]


def test_each_listening_socket_keeps_its_own_deadlines():
    """A host with two addresses gets two listeners, each with its own channels."""
    from waitress import create_server

    now = [0.0]
    served = create_server(lambda environ, start: [], listen="127.0.0.1:0 127.0.0.1:0", _start=False)
    try:
        listeners = [d for d in served.map.values() if hasattr(d, "active_channels")]
        assert len(listeners) == 2
        RequestDeadline.attach(served, 30, clock=lambda: now[0])
        channels = []
        for listener in listeners:
            channel = Channel()
            channel.request, channel.last_activity = Parser(), time.time()
            listener.active_channels[id(channel)] = channel
            channels.append(channel)
        for at in (0.0, 29.0, 30.0):
            now[0] = at
            for listener in listeners:
                listener.maintenance(time.time())
            if at < 30:
                assert not any(c.will_close for c in channels)
        assert all(c.will_close for c in channels)
    finally:
        for dispatcher in list(served.map.values()):
            dispatcher.close()
