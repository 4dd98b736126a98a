"""The estimate counts what the graph says: parameters, products, comparisons, tuples.

What the counts cost in memory and bytes is fitted to measured runs (bench/estimate.py); these
tests check the counting, which is exact, and how limits read an estimate.
"""

from __future__ import annotations

import pytest
from torch import nn

from mpcml.api.job import Job
from mpcml.jobs import estimate
from mpcml.proto.v1 import coordinator_pb2 as cpb

MIB = 2**20
FEATURES = {"alice": "a", "bob": "b"}
LABELS = {"carol": "c"}


def _train(model: nn.Module, batch: int = 64) -> Job:
    job = Job.train(model=model, features=FEATURES, labels=LABELS, loss="bce", batch_size=batch)
    return job.captured((30,))


def test_a_two_layer_models_counts_are_exact() -> None:
    spec = _train(nn.Sequential(nn.Linear(30, 100), nn.Linear(100, 1), nn.Sigmoid())).spec
    f = estimate.features(spec, 3)
    assert f.parameters == 30 * 100 + 100 + 100 + 1
    assert f.products == 2
    # each addmm masks its input rows and its weight: 64x30 + 30x100, then 64x100 + 100x1
    assert f.product_inputs == 64 * 30 + 30 * 100 + 64 * 100 + 100
    assert f.product_outputs == 64 * 100 + 64
    assert f.tuple_elements == 64 * 100
    assert f.head == "sigmoid" and f.head_elements == 64
    assert f.comparisons == 0 and f.input_elements == 30
    # activations: what the rows pass through (the weights' transposes are views of shares)
    assert f.activations == 64 * 100 + 64 * 1 + 64  # addmm, addmm_1, sigmoid
    assert f.largest_product == 64 * 30 + 30 * 100 + 64 * 100


def test_a_weight_over_the_block_size_counts_one_block_in_its_product() -> None:
    from mpcml.graph.aten_lower import PRODUCT_ELEMENTS

    spec = _train(nn.Sequential(nn.Linear(30, 3000), nn.Linear(3000, 3000), nn.Linear(3000, 1)))
    f = estimate.features(spec.spec, 3)
    assert PRODUCT_ELEMENTS < 3000 * 3000
    assert f.tuple_elements == PRODUCT_ELEMENTS
    assert f.largest_product == 64 * 3000 + PRODUCT_ELEMENTS + 64 * 3000


def test_a_batch_is_no_larger_than_the_rows() -> None:
    spec = _train(nn.Sequential(nn.Linear(30, 10), nn.ReLU(), nn.Linear(10, 1)), batch=256).spec
    assert estimate.features(spec, 3, rows=100).comparisons == 100 * 10
    assert estimate.features(spec, 3).comparisons == 256 * 10


def test_memory_grows_with_the_width_and_the_rank_0_party_holds_more() -> None:
    narrow = estimate.estimate(
        _train(nn.Sequential(nn.Linear(30, 100), nn.Linear(100, 1))).spec, 400
    )
    wide = estimate.estimate(
        _train(nn.Sequential(nn.Linear(30, 20000), nn.Linear(20000, 1))).spec, 400
    )
    assert set(wide.peak_memory) == {"alice", "bob", "carol"}
    assert wide.peak_memory["bob"] > narrow.peak_memory["bob"] + 100 * MIB
    assert wide.peak_memory["alice"] > wide.peak_memory["bob"]  # rank 0: corrections ahead
    assert wide.bytes_per_batch > 100 * narrow.bytes_per_batch
    assert wide.batches == 7  # 400 rows in batches of 64
    # what the peak is made of, the same at every party
    assert set(wide.memory) == {"worker", "inputs", "parameters", "activations", "tuples"}
    assert wide.memory["inputs"] == 400 * (30 + 1) * estimate.SHARE_BYTES


def test_over_names_the_party_the_limit_and_the_estimate() -> None:
    found = cpb.ResourceEstimate(parameters=5000, tuple_elements=70)
    found.peak_memory_bytes["bob"] = 1000 * MIB
    limits = cpb.ResourceLimits(
        max_job_memory_bytes=900 * MIB, max_parameters=4000, max_tuple_elements=100
    )
    assert estimate.over(found, "bob", limits) == [
        "party 'bob''s limit max_job_memory_mib = 900: its estimated peak memory there is 1000 MiB",
        "party 'bob''s limit max_parameters = 4000: its model has 5000 parameters",
    ]
    assert estimate.over(found, "bob", cpb.ResourceLimits()) == []  # 0: no limit


def test_the_merged_estimate_takes_each_partys_own_peak() -> None:
    mine = cpb.ResourceEstimate(parameters=7)
    mine.peak_memory_bytes.update({"alice": 5, "bob": 99})
    theirs = cpb.ResourceEstimate(parameters=7)
    theirs.peak_memory_bytes.update({"alice": 99, "bob": 6})
    merged = estimate.merged({"alice": mine, "bob": theirs})
    assert dict(merged.peak_memory_bytes) == {"alice": 5, "bob": 6}
    assert merged.parameters == 7


@pytest.mark.parametrize("op", [nn.Tanh(), nn.GELU()])
def test_a_non_linear_node_costs_its_cost_table_row(op: nn.Module) -> None:
    spec = _train(nn.Sequential(nn.Linear(30, 8), op, nn.Linear(8, 1), nn.Sigmoid())).spec
    f = estimate.features(spec, 2)
    kinds = [kind for kind, *_ in f.nodes.values()]
    assert kinds == ["product", "nonlinear", "product"]
    assert f.nonlinear_bytes > 0 and f.nonlinear_rounds > 0
