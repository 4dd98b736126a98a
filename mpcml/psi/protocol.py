"""ECDH-PSI among two or more parties: which rows every party holds, and one order for them.

Every party draws a fresh secret scalar for the job, hashes its ids onto the group, masks them
and shuffles them (`group.py`). Each set then travels a ring through every other party, which
masks it once more without reordering it, and comes home masked by every party's scalar: the
owner knows which of its ids each value belongs to (it knows its shuffle); nobody else does.
The fully masked sets are intersected along a chain (the first party sends its values, sorted,
to the second, which keeps those it also holds and passes them on, and so on), and the last
party sends the intersection to every party. Each party's shared rows are its ids whose value is
in it, and every party orders them by that value: a shared order that no party can link to
another's ids.

What each party learns (docs/security.md): the sizes of the others' sets; which of its own ids
are shared by all, and, in the chain, which of its ids it shares with the parties before it.
Nothing about an id it does not hold. The channel must be authenticated and private (the job's
data plane: mutual TLS); the protocol assumes parties that follow it (semi-honest), as the rest
of the job does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mpcml.psi import group
from mpcml.psi.group import POINT_BYTES, PsiError

MAX_IDS = 100_000_000
"""The largest set a party accepts from another (3.2 GB of points)."""


class Channel(Protocol):
    """Bytes between the ranks of a session, in order per pair."""

    def send(self, dst: int, data: bytes) -> None:
        """Queue `data` for rank `dst`."""
        ...

    def recv(self, src: int) -> bytes:
        """The next message from rank `src`."""
        ...


@dataclass(frozen=True)
class Intersection:
    """The shared rows of one party, in the order every party uses."""

    rows: np.ndarray
    """Indices into this party's ids, one per shared row, in the shared order."""
    sizes: tuple[int, ...]
    """Each party's set size, in the order of the parties."""

    @property
    def size(self) -> int:
        """How many rows every party holds."""
        return len(self.rows)


def _split(data: bytes) -> list[bytes]:
    if len(data) % POINT_BYTES:
        raise PsiError(f"a PSI message of {len(data)} bytes is not a whole number of points")
    if len(data) // POINT_BYTES > MAX_IDS:
        raise PsiError(f"a PSI message holds more than {MAX_IDS} ids")
    return [data[i : i + POINT_BYTES] for i in range(0, len(data), POINT_BYTES)]


def _shuffle(n: int) -> np.ndarray:
    """A permutation of range(n) from a generator seeded by the OS's CSPRNG."""
    seed = int.from_bytes(os.urandom(32), "little")
    return np.random.Generator(np.random.Philox(seed)).permutation(n)


def intersect(
    ids: Sequence[bytes],
    me: int,
    ranks: Sequence[int],
    channel: Channel,
    workers: int | None = None,
) -> Intersection:
    """Run the protocol as rank `me` among `ranks` (each in the same order, `me` among them).

    `ids` must be distinct (the caller refuses duplicates with the row named).
    """
    if len(ranks) < 2 or len(set(ranks)) != len(ranks) or me not in ranks:
        raise PsiError(f"PSI needs two or more distinct ranks including {me}, not {list(ranks)}")
    m, pos = len(ranks), list(ranks).index(me)
    nxt, prv = ranks[(pos + 1) % m], ranks[(pos - 1) % m]
    key = group.new_key()
    order = _shuffle(len(ids))
    flying = group.mask(key, group.hash_ids([ids[i] for i in order], workers), workers)
    sizes = [0] * m
    sizes[pos] = len(ids)
    for step in range(m - 1):  # each set passes every other party once, in ring order
        channel.send(nxt, flying)
        received = channel.recv(prv)
        sizes[(pos - 1 - step) % m] = len(_split(received))
        flying = group.mask(key, received, workers)
    channel.send(nxt, flying)  # the set of the next party, masked by all: home
    home = _split(channel.recv(prv))
    if len(home) != len(ids):
        raise PsiError(f"rank {prv} sent back {len(home)} values for this party's {len(ids)} ids")
    row_of = {value: int(order[j]) for j, value in enumerate(home)}
    if len(row_of) != len(ids):
        raise PsiError("two of this party's ids came back as one value")

    # The chain: each party keeps what it shares with the ones before it.
    if pos == 0:
        common = sorted(row_of)
    else:
        common = sorted(v for v in set(_split(channel.recv(ranks[pos - 1]))) if v in row_of)
    if pos < m - 1:
        channel.send(ranks[pos + 1], b"".join(common))
        common = _split(channel.recv(ranks[m - 1]))
    else:
        final = b"".join(common)
        for rank in ranks[:-1]:
            channel.send(rank, final)
    if common != sorted(common):
        raise PsiError(f"rank {ranks[m - 1]} sent an intersection out of order")
    missing = [v for v in common if v not in row_of]
    if missing:
        raise PsiError(f"rank {ranks[m - 1]} sent {len(missing)} values this party never held")
    rows = np.fromiter((row_of[v] for v in common), dtype=np.int64, count=len(common))
    return Intersection(rows, tuple(sizes))
