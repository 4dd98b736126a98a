"""The rows each revealed aggregate covers, counted per dataset, equal a brute-force count over
the rows of every round's batches (in order and shuffled, vertical and horizontal)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mpcml.jobs.coverage import CoverageError, coverage, dataset_rows
from mpcml.jobs.order import epoch_order
from mpcml.jobs.spec import round_plan
from mpcml.proto.v1 import job_pb2 as jpb


def _train(
    rows: list[int],
    batch_size: int,
    per_round: int,
    epochs: int,
    shuffle: bool = False,
    horizontal: bool = False,
) -> jpb.JobSpec:
    parties = ["alice", "bob", "carol"][: len(rows)]
    spec = jpb.JobSpec(
        task=jpb.TASK_TRAIN,
        split=jpb.SPLIT_HORIZONTAL if horizontal else jpb.SPLIT_VERTICAL,
        features=[jpb.DataBinding(party=p, dataset=f"{p}-x") for p in parties],
        labels=[jpb.DataBinding(party=p, dataset=f"{p}-y") for p in parties]
        if horizontal
        else [jpb.DataBinding(party="carol", dataset="y")],
        hyper=jpb.HyperParameters(
            epochs=epochs,
            batch_size=batch_size,
            batches_per_round=per_round,
            shuffle=shuffle,
            shuffle_seed=7,
        ),
        reveal=[jpb.Reveal(output=jpb.OUTPUT_METRICS, recipients=["coordinator"])],
    )
    return spec


def _brute_force(spec: jpb.JobSpec, lo: int, hi: int, total: int) -> int:
    """The fewest rows of [lo, hi) in a round holding any, from the rows of every batch."""
    plan = round_plan(spec, total)
    fewest = hi - lo
    for r in range(1, plan.total_rounds + 1):
        seen: set[int] = set()
        for g in plan.batches(r):
            epoch, b = divmod(g, plan.batches_per_epoch)
            order = (
                epoch_order(total, 7, epoch).tolist() if spec.hyper.shuffle else list(range(total))
            )
            seen |= set(order[b * plan.batch_size : min((b + 1) * plan.batch_size, total)])
        mine = len([i for i in seen if lo <= i < hi])
        if mine:
            fewest = min(fewest, mine)
    return fewest


@pytest.mark.parametrize(
    ("rows", "batch_size", "per_round", "epochs", "shuffle"),
    [
        *itertools.product([[455], [100, 37]], [1, 7, 64], [1, 3, 0], [1, 2], [False, True]),
        ([50, 50], 30, 5, 3, False),  # rounds that span an epoch's end and the next's start
        ([50, 50], 30, 5, 3, True),
    ],
)
def test_the_fewest_rows_per_round_match_a_brute_force_count(
    rows: list[int], batch_size: int, per_round: int, epochs: int, shuffle: bool
) -> None:
    horizontal = len(rows) > 1
    spec = _train(rows, batch_size, per_round, epochs, shuffle, horizontal)
    label_rows = rows if horizontal else [rows[0]]
    found = coverage(spec, rows, label_rows)
    total = sum(rows)
    start = 0
    for i, n in enumerate(rows):
        segment = (start, start + n) if horizontal else (0, total)
        expected = _brute_force(spec, *segment, total)
        party = spec.features[i]
        assert found[(party.party, party.dataset)][jpb.OUTPUT_METRICS].rows == expected
        start += n if horizontal else 0


def test_a_batch_of_one_row_and_the_last_partial_batch_are_named() -> None:
    one = coverage(_train([455], 1, 1, 1), [455], [455])[("alice", "alice-x")]
    assert one[jpb.OUTPUT_METRICS].rows == 1
    assert "round 1 is computed from 1 of its rows (batch_size 1, batches_per_round 1" in (
        one[jpb.OUTPUT_METRICS].why
    )
    last = coverage(_train([455], 64, 1, 1), [455], [455])[("carol", "y")]
    assert last[jpb.OUTPUT_METRICS].rows == 455 - 7 * 64
    assert "round 8 is computed from 7 of its rows" in last[jpb.OUTPUT_METRICS].why
    assert (
        coverage(_train([455], 64, 0, 3), [455], [455])[("alice", "alice-x")][
            jpb.OUTPUT_METRICS
        ].rows
        == 455
    )


def test_in_a_horizontal_job_only_the_partys_own_rows_count() -> None:
    """alice's 228 rows come first: batch 4 (rows 192-255) holds 36 of hers and 28 of bob's; the
    last (448-454) 7 of bob's."""
    spec = _train([228, 227], 64, 1, 1, horizontal=True)
    found = coverage(spec, [228, 227], [228, 227])
    assert found[("bob", "bob-x")][jpb.OUTPUT_METRICS].rows == 7
    assert found[("bob", "bob-y")][jpb.OUTPUT_METRICS].rows == 7
    alice = found[("alice", "alice-x")][jpb.OUTPUT_METRICS]
    assert alice.rows == 36 and "round 4 is computed from 36 of its rows" in alice.why
    assert dataset_rows(spec, [228, 227], [228, 227])[("bob", "bob-x")] == 227


def test_weights_and_evaluation_cover_every_row_and_predictions_are_no_aggregate() -> None:
    spec = _train([100], 1, 1, 1)
    spec.reveal.append(jpb.Reveal(output=jpb.OUTPUT_WEIGHTS, recipients=["alice"]))
    assert coverage(spec, [100], [100])[("carol", "y")][jpb.OUTPUT_WEIGHTS].rows == 100
    evaluate = jpb.JobSpec(
        task=jpb.TASK_EVALUATE,
        features=[jpb.DataBinding(party="alice", dataset="x")],
        labels=[jpb.DataBinding(party="carol", dataset="y")],
        reveal=[
            jpb.Reveal(output=jpb.OUTPUT_METRICS, recipients=["alice"]),
            jpb.Reveal(output=jpb.OUTPUT_PREDICTIONS, recipients=["alice"]),
        ],
    )
    found = coverage(evaluate, [20], [20])[("carol", "y")]
    assert set(found) == {jpb.OUTPUT_METRICS} and found[jpb.OUTPUT_METRICS].rows == 20
    with pytest.raises(CoverageError, match="1 feature and 0 label row counts"):
        coverage(evaluate, [20], [])


def test_shuffled_coverage_is_quick_at_a_hundred_thousand_rows() -> None:
    """A party vets within the coordinator's 10 s: a shuffled 10-epoch job over 1e5 rows is
    counted with one permutation per epoch, not per round (no timing asserted: it just runs)."""
    spec = _train([100_000], 256, 1, 10, shuffle=True)
    found = coverage(spec, [100_000], [100_000])[("alice", "alice-x")]
    assert found[jpb.OUTPUT_METRICS].rows == 100_000 - 390 * 256
    assert np.isfinite(found[jpb.OUTPUT_METRICS].rows)
