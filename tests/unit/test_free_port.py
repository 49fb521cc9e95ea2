"""`free_port` never hands out one port twice, even when the kernel repeats itself, nor a port
another process claimed in the shared claims folder (test processes side by side)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamjoin.services import broker


class _ScriptedSocket:
    """Stands in for `socket.socket`: each bind 'gets' the next scripted port."""

    script: list[int] = []

    def __enter__(self) -> _ScriptedSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = self.script.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_a_port_the_kernel_repeats_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(broker.PORT_CLAIMS_ENV, raising=False)
    monkeypatch.setattr(broker, "_ISSUED_PORTS", set())
    monkeypatch.setattr(broker.socket, "socket", _ScriptedSocket)
    _ScriptedSocket.script = [40001, 40001, 40001, 40002]
    assert [broker.free_port(), broker.free_port()] == [40001, 40002]
    assert _ScriptedSocket.script == []


def test_real_ports_are_distinct() -> None:
    ports = [broker.free_port() for _ in range(50)]
    assert len(set(ports)) == 50


def test_a_port_another_process_claimed_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(broker.PORT_CLAIMS_ENV, str(tmp_path))
    monkeypatch.setattr(broker, "_ISSUED_PORTS", set())
    monkeypatch.setattr(broker.socket, "socket", _ScriptedSocket)
    (tmp_path / "40001").touch()  # what another process's free_port left there
    _ScriptedSocket.script = [40001, 40002]
    assert broker.free_port() == 40002
    assert sorted(p.name for p in tmp_path.iterdir()) == ["40001", "40002"]
