"""TRTSPEC_PORT_RANGE: the ports trtspec picks for itself come from the range (the test workers'
disjoint ranges rely on it), a bad value names the variable and the fix."""

import socket

import pytest

from trtspec.errors import ConfigError
from trtspec.triton.launch import server


def test_ports_come_from_the_range_and_are_not_handed_out_twice(monkeypatch):
    monkeypatch.setattr(server, "_GIVEN", set())
    with socket.socket() as busy:  # a port someone listens on is never handed out
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        lo = taken
        monkeypatch.setenv("TRTSPEC_PORT_RANGE", f"{lo}-{lo + 2}")
        got = {server.free_port(), server.free_port()}
        assert got == {lo + 1, lo + 2}
        with pytest.raises(ConfigError, match="no free port in the range"):
            server.free_port()


@pytest.mark.parametrize("raw", ["99-5", "abc", "30000-30000", "1000-2000"])
def test_a_bad_range_names_the_variable_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv("TRTSPEC_PORT_RANGE", raw)
    with pytest.raises(ConfigError, match="TRTSPEC_PORT_RANGE: must be LO-HI") as e:
        server.free_port()
    assert "unset it" in str(e.value.fix)


def test_unset_lets_the_kernel_pick(monkeypatch):
    monkeypatch.delenv("TRTSPEC_PORT_RANGE", raising=False)
    assert server.port_range() is None and 0 < server.free_port() < 65536
