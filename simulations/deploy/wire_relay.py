"""A counting TCP relay between one SuperNode and the SuperLink.

Flower's traffic counters see protobuf messages, not what crosses the network: HTTP headers, TLS
records, the SuperNode's idle polls and heartbeats are invisible to them. ``fedgan deploy --local``
puts one relay in front of the SuperLink per SuperNode, so the bytes each node really exchanged
are measured, and the HTTP overhead is reported next to the payload instead of guessed. It also
notes where the node's connections came from (``peers``), which says whether they crossed hosts.
"""

from __future__ import annotations

import socket
import threading

CHUNK = 1 << 16


class WireRelay:
    """Listens on ``listen_host`` (a free port) and forwards every connection to ``target``."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self.up = 0  # node -> SuperLink
        self.down = 0  # SuperLink -> node
        self.peers: set[str] = set()  # addresses the node's connections came from
        self._server = socket.create_server((listen_host, 0))
        self.address = self._server.getsockname()[:2]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"relay-{self.address[1]}", daemon=True).start()

    def counters(self) -> tuple[int, int]:
        """(bytes down, bytes up) so far."""
        with self._lock:
            return self.down, self.up

    def close(self) -> None:
        self._closed.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.peers.add(peer[0])
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for src, dst, up in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, up), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
                with self._lock:
                    if up:
                        self.up += len(data)
                    else:
                        self.down += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
