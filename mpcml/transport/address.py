"""HOST:PORT: the one way every daemon, client and check reads a network address."""

from __future__ import annotations

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
