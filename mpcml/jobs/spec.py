"""What a job spec means: its parties, who receives which output, and its round plan.

The coordinator, the party workers and the client all read a spec through these functions, so
that they agree on ranks, recipients and on which batches make up round r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpcml.proto.v1 import job_pb2 as jpb

COORDINATOR = "coordinator"
"""The recipient name that makes metrics public job metadata."""

DEFAULT_BATCH_SIZE = 64


def parties_in_order(spec: jpb.JobSpec) -> list[str]:
    """The parties of a job in rank order: as given, or by first appearance."""
    if spec.parties:
        return list(spec.parties)
    order: list[str] = []
    named = [b.party for b in spec.features] + [b.party for b in spec.labels]
    if spec.weights.WhichOneof("source") == "private":
        named.append(spec.weights.private.party)
    for party in named:
        if party not in order:
            order.append(party)
    return order


def recipients(spec: jpb.JobSpec, output: int) -> list[str]:
    """Who receives `output` (a `jpb.Output`); nobody when the policy does not say."""
    out: list[str] = []
    for reveal in spec.reveal:
        if reveal.output == output:
            out.extend(r for r in reveal.recipients if r not in out)
    return out


def batch_size(spec: jpb.JobSpec) -> int:
    """The batch size the job uses (training, and chunking inference)."""
    return spec.hyper.batch_size or DEFAULT_BATCH_SIZE


@dataclass(frozen=True)
class RoundPlan:
    """How a job's batches fall into rounds."""

    rows: int
    batch_size: int
    batches_per_epoch: int
    epochs: int
    batches_per_round: int

    @property
    def total_batches(self) -> int:
        """Batches over all epochs."""
        return self.batches_per_epoch * self.epochs

    @property
    def total_rounds(self) -> int:
        """Rounds of the job; an inference or evaluation is one round."""
        return max(1, math.ceil(self.total_batches / self.batches_per_round))

    def batches(self, round: int) -> range:
        """Global batch numbers (epoch * batches_per_epoch + batch) of round `round` (from 1)."""
        start = (round - 1) * self.batches_per_round
        return range(start, min(start + self.batches_per_round, self.total_batches))


def round_plan(spec: jpb.JobSpec, rows: int) -> RoundPlan:
    """The plan for a job over `rows` rows of input."""
    size = batch_size(spec)
    per_epoch = max(1, math.ceil(rows / size))
    if spec.task != jpb.TASK_TRAIN:
        return RoundPlan(rows, size, per_epoch, 1, per_epoch)
    epochs = max(1, spec.hyper.epochs)
    return RoundPlan(rows, size, per_epoch, epochs, spec.hyper.batches_per_round or per_epoch)
