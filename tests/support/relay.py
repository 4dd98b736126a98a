"""A TCP relay on loopback whose live connections a test can cut, as a network blip would.

It carries the bytes as they are (TLS passes through end to end) and keeps accepting new
connections after a cut, so the client can connect again. With `record`, it keeps every byte
each way of every connection; on a plaintext cluster `grpc_messages` reads the gRPC messages
out of them, as a capture on the wire would.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Forwards 127.0.0.1:`port` to `target` ("HOST:PORT")."""

    def __init__(self, target: str, record: bool = False) -> None:
        self.record = record
        self.recorded: list[bytearray] = []
        """Each direction of each connection, in order, when recording."""
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
                tape = bytearray()
                if self.record:
                    with self._lock:
                        self.recorded.append(tape)
                threading.Thread(target=self._pump, args=(a, b, tape), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, tape: bytearray) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self.record:
                    tape += data
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


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def grpc_messages(tape: bytes) -> list[bytes]:
    """The gRPC messages of one direction of a plaintext HTTP/2 connection.

    DATA frames are joined per stream and split at gRPC's length prefixes, so a value that
    HTTP/2 framing cut in two is whole again. A compressed message would hide its content
    from a test, so it is an error here.
    """
    view = memoryview(tape)
    at = len(PREFACE) if view[: len(PREFACE)] == PREFACE else 0
    streams: dict[int, bytearray] = {}
    while at + 9 <= len(view):
        length = int.from_bytes(view[at : at + 3], "big")
        kind, flags = view[at + 3], view[at + 4]
        stream = int.from_bytes(view[at + 5 : at + 9], "big") & 0x7FFFFFFF
        payload = view[at + 9 : at + 9 + length]
        at += 9 + length
        if kind == 0:  # DATA
            if flags & 0x8:  # PADDED
                payload = payload[1 : len(payload) - payload[0]]
            streams.setdefault(stream, bytearray()).extend(payload)
    messages = []
    for data in streams.values():
        i = 0
        while i + 5 <= len(data):
            if data[i]:
                raise AssertionError("a compressed gRPC message: its content cannot be checked")
            size = int.from_bytes(data[i + 1 : i + 5], "big")
            messages.append(bytes(data[i + 5 : i + 5 + size]))
            i += 5 + size
    return messages
