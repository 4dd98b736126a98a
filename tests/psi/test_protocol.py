"""The PSI protocol's logic, parties as threads over queues.

The multi-process, mutual-TLS path (a vertical job through the job API, and what crosses the
data plane) is tested in tests/system; here each case runs the real group arithmetic.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from mpcml.psi import group
from mpcml.psi.group import PsiError
from mpcml.psi.protocol import Intersection, intersect


class Queues:
    """One queue per (source, destination): the channel of each party."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.queues = {(a, b): queue.Queue[bytes]() for a in ranks for b in ranks if a != b}
        self.sent: list[bytes] = []

    def channel(self, me: int) -> Channel:
        return Channel(self, me)


class Channel:
    def __init__(self, queues: Queues, me: int) -> None:
        self.queues, self.me = queues, me

    def send(self, dst: int, data: bytes) -> None:
        self.queues.sent.append(data)
        self.queues.queues[(self.me, dst)].put(data)

    def recv(self, src: int) -> bytes:
        return self.queues.queues[(src, self.me)].get(timeout=60)


def _run(sets: Sequence[Sequence[bytes]]) -> tuple[list[Intersection], Queues]:
    ranks = list(range(len(sets)))
    queues = Queues(ranks)
    results: dict[int, Intersection] = {}
    errors: list[BaseException] = []

    def party(rank: int) -> None:
        try:
            results[rank] = intersect(sets[rank], rank, ranks, queues.channel(rank), workers=2)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=party, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return [results[r] for r in ranks], queues


def _ids(values: Sequence[str]) -> list[bytes]:
    return [v.encode() for v in values]


@pytest.mark.parametrize("parties", [2, 3, 4])
def test_every_party_finds_the_ids_all_share_in_one_order(parties: int) -> None:
    rng = np.random.default_rng(parties)
    universe = [f"C-{i:05d}" for i in range(400)]
    sets = [sorted(rng.choice(universe, 300, replace=False).tolist()) for _ in range(parties)]
    results, _ = _run([_ids(s) for s in sets])
    shared = set.intersection(*(set(s) for s in sets))
    rows = [[sets[p][i] for i in r.rows] for p, r in enumerate(results)]
    assert set(rows[0]) == shared and len(rows[0]) == len(shared) > 0
    assert all(r == rows[0] for r in rows)  # the same rows in the same order everywhere
    assert rows[0] != sorted(rows[0])  # ordered by masked value, not by id
    assert all(r.sizes == tuple(len(s) for s in sets) for r in results)


def test_no_id_and_no_plain_hash_crosses_the_channel() -> None:
    sets = [
        _ids([f"alice-{i}@example.org" for i in range(50)] + ["shared@example.org"]),
        _ids([f"bob-{i}@example.org" for i in range(60)] + ["shared@example.org"]),
    ]
    results, queues = _run(sets)
    assert results[0].size == results[1].size == 1
    hashed = group.hash_ids([i for s in sets for i in s])
    points = {hashed[i : i + 32] for i in range(0, len(hashed), 32)}
    wire = b"".join(queues.sent)
    assert not any(i in wire for s in sets for i in s)
    assert not any(p in wire for p in points)


def test_disjoint_sets_share_nothing_and_an_empty_set_works() -> None:
    results, _ = _run([_ids(["a", "b"]), _ids(["c"])])
    assert [r.size for r in results] == [0, 0]
    results, _ = _run([_ids([]), _ids(["c"])])
    assert [r.size for r in results] == [0, 0] and results[0].sizes == (0, 1)


def test_a_message_that_is_not_points_is_refused() -> None:
    with pytest.raises(PsiError, match="not a whole number of points"):
        group.mask(group.new_key(), b"\x01" * 33)
    with pytest.raises(PsiError, match="a point outside the group"):
        group.mask(group.new_key(), bytes(32))  # the identity: small order
    with pytest.raises(PsiError, match="two or more distinct ranks"):
        intersect([b"x"], 0, [0], Queues([0]).channel(0))
