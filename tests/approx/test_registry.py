"""The registry, its emulation, error bounds, cost table and plans, without MPC.

tests/approx/test_mpc_bounds.py holds the implementations to the same bounds in 2- and 3-party
sessions; tests/system/test_approximations.py runs plans through the job API.
"""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

import mpcml
from mpcml.api import plans
from mpcml.api.tune import TuneError, tune
from mpcml.approx import costs, registry
from mpcml.approx.bounds import error_bound, errors
from mpcml.approx.fixed import Fixed
from mpcml.approx.implementations import IMPLEMENTATIONS, apply
from mpcml.approx.plan import resolve
from mpcml.approx.registry import PlanError
from mpcml.graph.capture import capture
from mpcml.proto.v1 import job_pb2 as jpb

MODEL = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Softmax(dim=1))
GRAPH = capture(MODEL, (4,))


def _cases() -> list[tuple[str, str]]:
    return [(f, n) for f, table in registry.SPECS.items() for n in table]


@pytest.mark.parametrize(("function", "name"), _cases())
def test_each_implementation_is_within_its_bound_on_fresh_random_inputs(
    function: str, name: str
) -> None:
    """Random points of the domain (not the grid the bound was derived on), with noise."""
    settings = registry.knobs(function, name, {})
    lo, hi = registry.domain(function, name, settings)
    lo, hi = max(lo, -32.0), min(hi, 32.0)
    g = torch.Generator().manual_seed(7)
    x = lo + (hi - lo) * torch.rand(512, generator=g, dtype=torch.float64)
    if function == "softmax":
        x = x.reshape(64, 8)
        if name == "bounded":  # each row's largest entry within 4 of the shift
            x = x - x.max(1, keepdim=True).values + hi - 4 * torch.rand(64, 1, generator=g)
    out = apply(function, name, Fixed(x, noise=torch.Generator().manual_seed(1)), settings).v
    assert float(errors(function, name, settings, out, x).max()) <= error_bound(
        function, name, settings
    )


def test_every_registered_implementation_has_code_a_bound_and_a_measured_cost() -> None:
    assert set(IMPLEMENTATIONS) == set(_cases())
    assert len(registry.FUNCTIONS) == 11
    table = costs.table()
    assert table["command"] == "python -m mpcml.approx.costs"
    for function, name, settings in costs.settings():
        key = registry.cost_key(function, name, settings)
        for parties in ("2", "3"):
            assert key in table["parties"][parties], key
        assert math.isfinite(error_bound(function, name, settings))


def test_cheaper_implementations_cost_less_than_cryptens_own() -> None:
    crypten = costs.cost("sigmoid", "crypten", {}, 3)
    poly = costs.cost("sigmoid", "poly", {"degree": 7, "clip": 0}, 3)
    assert poly.rounds < crypten.rounds and poly.bytes_per_element < crypten.bytes_per_element
    wan = costs.NETWORKS["wan"]
    assert poly.seconds(1000, wan) < crypten.seconds(1000, wan)


@pytest.mark.parametrize(
    ("function", "name", "knobs", "message"),
    [
        ("sigmoid", "cubic", {}, "sigmoid has no implementation 'cubic'"),
        ("gamma", "crypten", {}, "no approximations for 'gamma'"),
        ("sigmoid", "poly", {"depth": 3}, "has no knob 'depth'"),
        ("sigmoid", "poly", {"degree": 21}, r"knob degree = 21 is outside \[3, 15\]"),
        ("sigmoid", "poly", {"degree": 8}, "knob degree must be odd"),
        ("exp", "limit", {"iterations": 6.5}, "must be a whole number"),
    ],
)
def test_bad_choices_are_refused_naming_them(
    function: str, name: str, knobs: dict[str, float], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        registry.knobs(function, name, knobs)


def test_a_plan_resolves_per_node_with_op_defaults_and_refuses_what_the_model_lacks() -> None:
    plan = plans.from_table(
        {
            "nodes": {"tanh": {"implementation": "poly", "knobs": {"degree": 7, "clip": 1}}},
            "ops": {"Softmax": {"implementation": "bounded", "knobs": {"shift": 6.0}}},
        }
    )
    choices = resolve(plan, GRAPH)
    assert choices["tanh"].implementation == "poly" and choices["tanh"].knobs["bound"] == 4.0
    assert choices["_softmax"].implementation == "bounded"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"nodes": {"_9": {}}}, "names node '_9', which the model lacks"),
        ({"nodes": {"addmm": {}}}, "a aten.addmm.default: only aten.sigmoid.default"),
        ({"ops": {"ReLU": {}}}, "names op 'ReLU'"),
        ({"source": "magic"}, "source 'magic' is not one of"),
        (
            {
                "nodes": {
                    "tanh": {
                        "implementation": "poly",
                        "knobs": {"clip": 0},
                        "low": -9.0,
                        "high": 2.0,
                    }
                }
            },
            "node 'tanh': the node's inputs range over [-9, 2] on the calibration set, outside "
            "[-4, 4]",
        ),
    ]
    for table, message in cases:
        with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
            resolve(plans.from_table(table), GRAPH)


def test_plan_files_round_trip(tmp_path: object) -> None:
    plan = jpb.ApproximationPlan(source="auto")
    plan.nodes["tanh"].implementation = "poly"
    plan.nodes["tanh"].knobs["degree"] = 9
    plan.nodes["tanh"].calibrated, plan.nodes["tanh"].low, plan.nodes["tanh"].high = (
        True,
        -1.5,
        2.25,
    )
    path = f"{tmp_path}/p.toml"
    plans.write(plan, path, "test")
    assert plans.read(path) == plan


def test_the_tuner_finds_a_cheaper_plan_within_its_budget() -> None:
    torch.manual_seed(0)
    x = torch.randn(400, 4)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Softmax(dim=1))
    with torch.no_grad():
        y = model(x).argmax(1)
    tuned = mpcml.tune(model, x, y, budget=0.02)
    assert mpcml.tune is tune
    assert tuned.seconds < tuned.crypten_seconds
    assert tuned.plaintext - tuned.tuned <= 0.02
    assert tuned.plan.source == "auto" and set(tuned.plan.nodes) == {"tanh", "_softmax"}
    assert all(e.calibrated for e in tuned.plan.nodes.values())
    resolve(
        tuned.plan, capture(model, tuple(x.shape[1:]))
    )  # the plan it writes passes the submission check
    assert "cheaper" in tuned.report()


def test_the_tuner_refuses_a_node_whose_inputs_overflow_every_implementation() -> None:
    linear = nn.Linear(2, 2)
    with torch.no_grad():
        linear.weight.fill_(400.0)
    model = nn.Sequential(linear, nn.Softmax(dim=1))
    with pytest.raises(TuneError, match=r"node '_softmax' \(softmax\) sees inputs in \[-?\d"):
        tune(model, torch.randn(50, 2))


def test_approximations_load_no_torch_where_the_coordinator_checks_plans() -> None:
    code = (
        "import sys, mpcml.approx.plan, mpcml.approx.registry; "
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_the_docs_table_is_the_committed_costs_and_bounds() -> None:
    text = costs.DOC.read_text()
    assert costs.document(text) == text, (
        "docs/approximations.md is stale: run `python -m mpcml.approx.costs --doc-only`"
    )
