"""A loopback TCP proxy that can drop every connection and refuse new ones for
a while: the broker 'going away' without losing its (memory-only) records.
`SniffingProxy` also reads the header of every Kafka request passing through;
`DelayingProxy` holds back the broker's answers to some kinds of request."""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass


class Proxy:
    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port, self.target_port = listen_port, target_port
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server: socket.socket | None = None
        self.resume()

    def resume(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.listen_port))
        srv.listen(64)
        self._server = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def pause(self) -> None:
        """Close the listener and every open connection."""
        srv, self._server = self._server, None
        if srv is not None:
            try:
                srv.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            except OSError:
                pass
            srv.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._forward_requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._forward_responses, args=(upstream, client), daemon=True).start()

    def _forward_requests(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to broker: plain forwarding here; SniffingProxy reads the requests on the way."""
        self._pump(client, upstream)

    def _forward_responses(self, upstream: socket.socket, client: socket.socket) -> None:
        """Broker to client: plain forwarding here; DelayingProxy holds some responses back."""
        self._pump(upstream, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(src, dst)


def _shut(*sockets: socket.socket) -> None:
    """Shut both ways, so the thread pumping the other direction ends too."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@dataclass(frozen=True)
class Request:
    """The header fields every Kafka request starts with (request header v0-v2)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def parse_requests(buffer: bytearray) -> list[Request]:
    """The complete requests at the start of `buffer` (removed from it); a partial one stays.
    Each is int32 size, then api_key int16, api_version int16, correlation_id int32 and
    client_id as an int16-length string (-1 = null), the rest of the frame unread."""
    found = []
    while len(buffer) >= 4:
        (size,) = struct.unpack_from(">i", buffer, 0)
        if len(buffer) < 4 + size:
            break
        api_key, api_version, correlation_id, id_length = struct.unpack_from(">hhih", buffer, 4)
        client_id = None if id_length < 0 else bytes(buffer[14:14 + id_length]).decode("utf-8", "replace")
        found.append(Request(api_key, api_version, correlation_id, client_id))
        del buffer[:4 + size]
    return found


class SniffingProxy(Proxy):
    """A Proxy that records the header of every request clients send through it (`requests`)."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.requests: list[Request] = []
        super().__init__(listen_port, target_port)

    def _forward_requests(self, client: socket.socket, upstream: socket.socket) -> None:
        pending = bytearray()
        try:
            while data := client.recv(1 << 16):
                pending += data
                found = parse_requests(pending)
                with self._lock:  # before forwarding: the answer may come back at once
                    self.requests += found
                    self._seen(client, found)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client, upstream)

    def _seen(self, client: socket.socket, requests: list[Request]) -> None:
        """Called (under the lock) with the requests `client` sent, before they are forwarded."""


FETCH = 1  # the Kafka api_key of Fetch


class DelayingProxy(SniffingProxy):
    """A SniffingProxy that holds each response to a request of a kind in `slow_api_keys`
    (default: Fetch) for `delay_s` seconds before passing it on; responses on a connection
    keep their order, so whatever follows a held one waits too. `delay_s = 0` forwards at once.
    `delay_new_connections` holds them on connections opened from then on only."""

    def __init__(self, listen_port: int, target_port: int, delay_s: float = 0.0,
                 slow_api_keys: frozenset[int] = frozenset({FETCH})) -> None:
        self.delay_s, self.slow_api_keys = delay_s, slow_api_keys
        self.held = 0  # responses held back so far (counted when held, not when released)
        self._new_delay_s = 0.0
        self._api_of: dict[tuple[int, int], int] = {}  # (client socket fd, correlation id) -> api_key
        super().__init__(listen_port, target_port)

    def _seen(self, client: socket.socket, requests: list[Request]) -> None:
        for r in requests:
            self._api_of[(client.fileno(), r.correlation_id)] = r.api_key

    def delay_new_connections(self, delay_s: float) -> None:
        """Hold slow responses `delay_s` on the connections accepted from now on (old ones keep `delay_s`)."""
        self._new_delay_s = delay_s

    def _forward_responses(self, upstream: socket.socket, client: socket.socket) -> None:
        """Each response is an int32 size, then the correlation id of the request it answers."""
        pending, fd, own_delay_s = bytearray(), client.fileno(), self._new_delay_s
        try:
            while data := upstream.recv(1 << 16):
                pending += data
                while len(pending) >= 8:
                    size, correlation_id = struct.unpack_from(">ii", pending, 0)
                    if len(pending) < 4 + size:
                        break
                    frame = bytes(pending[:4 + size])
                    del pending[:4 + size]
                    with self._lock:
                        api_key = self._api_of.pop((fd, correlation_id), None)
                    delay_s = max(self.delay_s, own_delay_s)
                    if api_key in self.slow_api_keys and delay_s > 0:
                        self.held += 1
                        time.sleep(delay_s)
                    client.sendall(frame)
        except OSError:
            pass
        finally:
            _shut(upstream, client)
