"""How many of a dataset's rows each aggregate a job reveals is computed from.

A revealed mean over few rows is those rows: a loss over a batch of one row, with labels the
attacker chose, gives back the row. A party's policy puts a floor under it (`min_rows`,
`mpcml/party/policy.py`); this module counts, for each bound dataset, the fewest of its own
rows that any revealed aggregate covers. In a horizontal job only the party's own rows count:
the other parties know theirs and can take them out of a mean.

Predictions are not aggregates (one per row): the policy's recipients govern them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mpcml.jobs.spec import RoundPlan, recipients, round_plan
from mpcml.proto.v1 import job_pb2 as jpb

Binding = tuple[str, str]
"""(party, dataset)."""


@dataclass(frozen=True)
class Coverage:
    """The fewest rows of a dataset one revealed value is computed from, and which value."""

    rows: int
    why: str


class CoverageError(ValueError):
    """The row counts do not fit the spec's bindings."""


def _segments(
    spec: jpb.JobSpec, feature_rows: Sequence[int], label_rows: Sequence[int]
) -> tuple[int, dict[Binding, tuple[int, int]]]:
    """The job's rows and, per bound dataset, the range of them that are its rows."""
    if len(feature_rows) != len(spec.features) or len(label_rows) != len(spec.labels):
        raise CoverageError(
            f"{len(feature_rows)} feature and {len(label_rows)} label row counts for "
            f"{len(spec.features)} feature and {len(spec.labels)} label bindings"
        )
    segments: dict[Binding, tuple[int, int]] = {}
    if spec.split != jpb.SPLIT_HORIZONTAL:
        total = int(feature_rows[0]) if feature_rows else 0
        for b in [*spec.features, *spec.labels]:
            segments[(b.party, b.dataset)] = (0, total)
        return total, segments
    start = 0
    for i, b in enumerate(spec.features):
        stop = start + int(feature_rows[i])
        segments[(b.party, b.dataset)] = (start, stop)
        if i < len(spec.labels):  # each feature party binds its own labels, in order
            lb = spec.labels[i]
            segments.setdefault((lb.party, lb.dataset), (start, stop))
        start = stop
    return start, segments


def _fewest_per_round(
    plan: RoundPlan, lo: int, hi: int, order: Callable[[int], np.ndarray]
) -> tuple[int, int]:
    """(rows, round): the fewest rows of [lo, hi) in a round that holds any of them.

    `order(epoch)` is the epoch's row order.
    """
    cumulative: dict[int, np.ndarray] = {}

    def inside(epoch: int) -> np.ndarray:
        if epoch not in cumulative:
            rows = order(epoch)
            cumulative[epoch] = np.concatenate([[0], np.cumsum((rows >= lo) & (rows < hi))])
        return cumulative[epoch]

    best = (hi - lo, 0)
    for r in range(1, plan.total_rounds + 1):
        pieces: dict[int, tuple[int, int]] = {}
        for g in plan.batches(r):
            epoch, b = divmod(g, plan.batches_per_epoch)
            start, stop = b * plan.batch_size, min((b + 1) * plan.batch_size, plan.rows)
            first, _ = pieces.get(epoch, (start, stop))
            pieces[epoch] = (first, stop)
        if len(pieces) == 1:
            [(epoch, (start, stop))] = pieces.items()
            count = int(inside(epoch)[stop] - inside(epoch)[start])
        elif any(stop - start == plan.rows for start, stop in pieces.values()):
            count = hi - lo
        else:  # the end of one epoch and the start of the next: count rows of both once
            seen = [order(epoch)[start:stop] for epoch, (start, stop) in pieces.items()]
            every = np.unique(np.concatenate(seen))
            count = int(((every >= lo) & (every < hi)).sum())
        if 0 < count < best[0]:
            best = (count, r)
    return best


def dataset_rows(
    spec: jpb.JobSpec, feature_rows: Sequence[int], label_rows: Sequence[int]
) -> dict[Binding, int]:
    """How many of each bound dataset's rows the job computes on."""
    _, segments = _segments(spec, feature_rows, label_rows)
    return {binding: hi - lo for binding, (lo, hi) in segments.items()}


def coverage(
    spec: jpb.JobSpec, feature_rows: Sequence[int], label_rows: Sequence[int]
) -> dict[Binding, dict[int, Coverage]]:
    """Per bound dataset, per revealed aggregate output (`jpb.Output`), its fewest rows.

    Only outputs someone receives are listed: a train job's weights (trained on every row of
    the dataset) and metrics (one loss per round: the rows of the round's batches), an evaluate
    job's metrics (every row).
    """
    total, segments = _segments(spec, feature_rows, label_rows)
    metrics = bool(recipients(spec, jpb.OUTPUT_METRICS))
    weights = bool(recipients(spec, jpb.OUTPUT_WEIGHTS))
    out: dict[Binding, dict[int, Coverage]] = {}
    plan = round_plan(spec, max(total, 1))
    h = spec.hyper

    orders: dict[int, np.ndarray] = {}

    def order(epoch: int) -> np.ndarray:
        """The epoch's row order, drawn once for every binding."""
        if epoch not in orders:
            if h.shuffle:
                from mpcml.jobs.order import epoch_order  # torch: only where a job shuffles

                orders[epoch] = epoch_order(plan.rows, int(h.shuffle_seed), epoch).numpy()
            else:
                orders[epoch] = np.arange(plan.rows)
        return orders[epoch]

    for binding, (lo, hi) in segments.items():
        mine: dict[int, Coverage] = {}
        if spec.task == jpb.TASK_TRAIN and weights:
            mine[jpb.OUTPUT_WEIGHTS] = Coverage(
                hi - lo, f"the weights are trained on its {hi - lo} rows"
            )
        if spec.task == jpb.TASK_EVALUATE and metrics:
            mine[jpb.OUTPUT_METRICS] = Coverage(
                hi - lo, f"the evaluation's loss and accuracy cover its {hi - lo} rows"
            )
        if spec.task == jpb.TASK_TRAIN and metrics:
            rows, r = _fewest_per_round(plan, lo, hi, order)
            mine[jpb.OUTPUT_METRICS] = Coverage(
                rows,
                f"the loss of round {r} is computed from {rows} of its rows (batch_size "
                f"{plan.batch_size}, batches_per_round {plan.batches_per_round}, "
                f"{plan.rows} rows in all)",
            )
        out[binding] = mine
    return out
