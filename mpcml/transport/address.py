"""HOST:PORT: the one way every daemon, client and check reads a network address."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from mpcml.errors import MpcmlError

WILDCARDS = ("0.0.0.0", "::", "")
"""Hosts that mean every interface when listening."""


class AddressError(MpcmlError, ValueError):
    """An address that is not HOST:PORT; the message quotes it."""


@dataclass(frozen=True)
class Address:
    """A host (an IPv6 one without its brackets) and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse(address: str, what: str = "the address") -> Address:
    """`address` as HOST:PORT (IPv6 hosts in brackets), or an AddressError naming `what`."""
    host, sep, port = address.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise AddressError(f"{what} {address!r} is not HOST:PORT")
    return Address(host, int(port))


def port_offset(address: str, offset: int) -> str:
    """HOST:PORT with the port moved up by `offset` (a party's job slots)."""
    if offset == 0:
        return address
    parsed = parse(address)
    return str(Address(parsed.host, parsed.port + offset))


def reachable(listen: str) -> str:
    """A listen address as a client on the same machine reaches it (wildcards: loopback)."""
    parsed = parse(listen)
    return f"127.0.0.1:{parsed.port}" if parsed.host in WILDCARDS else listen


def free_ports(n: int, block: int = 1) -> list[int]:
    """Ports that were free a moment ago on 127.0.0.1, each the first of `block` free ones."""
    socks: list[socket.socket] = []
    found: list[int] = []
    try:
        while len(found) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            first = s.getsockname()[1]
            try:
                for port in range(first + 1, first + block):
                    t = socket.socket()
                    socks.append(t)
                    t.bind(("127.0.0.1", port))
            except OSError:
                continue
            found.append(first)
        return found
    finally:
        for s in socks:
            s.close()
