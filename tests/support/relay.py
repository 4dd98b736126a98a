"""A TCP relay on loopback whose live connections a test can cut, as a network blip would.

It carries the bytes as they are (TLS passes through end to end) and keeps accepting new
connections after a cut, so the client can connect again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Forwards 127.0.0.1:`port` to `target` ("HOST:PORT")."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._live: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._live += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every connection now open; later ones go through again."""
        with self._lock:
            live, self._live = self._live, []
        for s in live:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the pumps blocked on it
            s.close()

    def close(self) -> None:
        self._listener.close()
        self.cut()
