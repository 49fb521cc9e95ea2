"""`free_port` hands out ports below the kernel's ephemeral range (where no outgoing
connection can take one before its service binds it), never one port twice, never one
something already listens on, nor one another process claimed in the shared claims folder
(test processes side by side)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from streamjoin.services import broker


def _scripted(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> list[int]:
    """free_port's candidates are `ports`, in order; returns the list, emptied as they are tried."""
    monkeypatch.setattr(broker, "_candidate", lambda: ports.pop(0))
    monkeypatch.setattr(broker, "_ISSUED_PORTS", set())
    return ports


def test_a_port_handed_out_before_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(broker.PORT_CLAIMS_ENV, raising=False)
    monkeypatch.setattr(broker, "_bindable", lambda port: True)
    script = _scripted(monkeypatch, [20001, 20001, 20001, 20002])
    assert [broker.free_port(), broker.free_port()] == [20001, 20002]
    assert script == []


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(broker.PORT_CLAIMS_ENV, raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = next(p for p in range(20_000, 30_000) if broker._bindable(p))
        _scripted(monkeypatch, [busy, free])
        assert broker.free_port() == free


def test_a_port_another_process_claimed_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(broker.PORT_CLAIMS_ENV, str(tmp_path))
    monkeypatch.setattr(broker, "_bindable", lambda port: True)
    (tmp_path / "20001").touch()  # what another process's free_port left there
    _scripted(monkeypatch, [20001, 20002])
    assert broker.free_port() == 20002
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20001", "20002"]


def test_real_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = [broker.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= p < broker._ephemeral_start() for p in ports), ports
    for port in ports:  # each one really is free
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
