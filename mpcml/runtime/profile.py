"""Where a job's time goes: communication rounds, bytes and seconds per graph node and phase.

A job worker turns a `Profile` on for its session (`active`); the model's graph
(`mpcml.graph.build.ordered_graph`) measures each node's forward pass in it, and the trainer
the phases that belong to no node (the loss's gradient, the backward pass, the optimiser's
step). Rounds and bytes are CrypTen's own counters for this party, read before and after, so a
node's figures are exactly what it added to the job's totals; what no entry covers (sharing the
inputs, revealing outputs) is the job's total minus their sum. Nothing in it depends on a
party's data: the graph, its shapes and the plan fix every round and byte.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

Counters = Callable[[], tuple[int, int]]
"""(bytes sent, rounds) this party has counted so far, as `JobComputation.stats` gives them."""


@dataclass
class Cost:
    """One node's or phase's totals over the job."""

    op: str
    rounds: int = 0
    bytes: int = 0
    seconds: float = 0.0
    calls: int = 0


class Profile:
    """The costs of one job on one party, in the order first seen."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters
        self.costs: dict[str, Cost] = {}
        self.batch_seconds: list[float] = []
        """Every batch's seconds, in order: the first one pays for any warm-up."""
        self._open = False

    @contextmanager
    def measure(self, name: str, op: str) -> Iterator[None]:
        """Add what the block costs to `name`'s entry; inside another measure, to that one."""
        if self._open:
            yield
            return
        self._open = True
        sent, rounds = self._counters()
        began = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - began
            after_sent, after_rounds = self._counters()
            cost = self.costs.setdefault(name, Cost(op))
            cost.rounds += after_rounds - rounds
            cost.bytes += after_sent - sent
            cost.seconds += seconds
            cost.calls += 1
            self._open = False

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Time one batch (training or prediction)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.batch_seconds.append(time.perf_counter() - began)

    def first_and_median_batch(self) -> tuple[float, float]:
        """The first batch's seconds and the median of all of them; zeros without batches."""
        if not self.batch_seconds:
            return 0.0, 0.0
        return self.batch_seconds[0], statistics.median(self.batch_seconds)


_ACTIVE: list[Profile | None] = [None]


def start(counters: Counters) -> Profile:
    """Turn profiling on for this process (a job worker's session)."""
    active = _ACTIVE[0] = Profile(counters)
    return active


def stop() -> None:
    """Turn it off."""
    _ACTIVE[0] = None


@contextmanager
def measure(name: str, op: str) -> Iterator[None]:
    """`Profile.measure` on the active profile; nothing when none is on."""
    active = _ACTIVE[0]
    if active is None:
        yield
        return
    with active.measure(name, op):
        yield


@contextmanager
def batch() -> Iterator[None]:
    """`Profile.batch` on the active profile; nothing when none is on."""
    active = _ACTIVE[0]
    if active is None:
        yield
        return
    with active.batch():
        yield
