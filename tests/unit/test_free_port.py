"""`free_port` never hands out one port twice, even when the kernel repeats itself."""

from __future__ import annotations

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
    monkeypatch.setattr(broker, "_ISSUED_PORTS", set())
    monkeypatch.setattr(broker.socket, "socket", _ScriptedSocket)
    _ScriptedSocket.script = [40001, 40001, 40001, 40002]
    assert [broker.free_port(), broker.free_port()] == [40001, 40002]
    assert _ScriptedSocket.script == []


def test_real_ports_are_distinct() -> None:
    ports = [broker.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
