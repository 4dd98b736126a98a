"""The core ATen table: every op has a CrypTen lowering, matches torch's schema, is covered by
the op models, and computes what torch computes, on 2 and 3 parties over mutual TLS."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpcml.graph import aten, aten_eval
from mpcml.graph.aten_lower import LOWERINGS
from mpcml.graph.capture import capture
from tests.graph import op_models
from tests.support.check import crypten_close
from tests.support.parties import run_session

REPO = Path(__file__).resolve().parents[2]


def test_every_op_in_the_table_has_a_lowering_and_torchs_argument_names() -> None:
    assert set(LOWERINGS) == set(aten.OPS)
    for name, op in aten.OPS.items():
        schema = aten_eval.target(name)._schema
        assert [a.name for a in schema.arguments] == [a for a, _ in op.args], name


def test_the_op_models_hold_every_op_of_the_table_and_nothing_else() -> None:
    seen: set[str] = set()
    for name, (_, shape) in op_models.MODELS.items():
        seen |= {n.op for n in capture(op_models.seeded(name), shape).nodes}
    assert seen - {"Parameter", "Constant"} == set(aten.OPS)


@pytest.mark.parametrize("name", list(op_models.MODELS))
def test_the_captured_graph_computes_the_model_in_plain_torch(name: str) -> None:
    model, x = op_models.seeded(name), op_models.example_input(name)
    graph = capture(model, op_models.MODELS[name][1])
    with torch.no_grad():
        assert torch.allclose(aten_eval.run(graph, x, model.state_dict()), model(x), atol=1e-5)


def test_the_docs_table_is_generated_from_the_code() -> None:
    text = (REPO / "docs" / "ops.md").read_text()
    assert aten.table_markdown() in text, "regenerate: python -m mpcml.graph.aten > docs/ops.md"


@pytest.mark.system
@pytest.mark.parametrize("parties", [3])
def test_every_op_on_shares_matches_torch(tmp_path: Path, parties: int) -> None:
    """Every weight product also runs in column blocks (as a large one would); the gradient
    test below runs every op forward and back at 2 parties."""
    expected = {}
    for name, (_, shape) in op_models.MODELS.items():
        model, x = op_models.seeded(name), op_models.example_input(name)
        base = tmp_path / name
        base.with_suffix(".pb").write_bytes(capture(model, shape).SerializeToString())
        torch.save(model.state_dict(), base.with_suffix(".pt"))
        torch.save(x, str(base) + ".x.pt")
        with torch.no_grad():
            expected[name] = model(x)
    results = run_session(
        tmp_path,
        parties,
        "tests.graph.scenarios:secure_graphs",
        scenario_kwargs={
            "folder": str(tmp_path),
            "names": list(op_models.MODELS),
            "product_elements": 16 if parties == 3 else 0,
        },
    )
    assert all(r.ok for r in results), [r.traceback for r in results]
    for r in results:
        for name, want in expected.items():
            ok, detail = crypten_close(r.value[name], want)
            assert ok, f"{name} on rank {r.rank} of {parties}: {detail}"


@pytest.mark.system
def test_gradients_through_every_op_on_shares_match_torch(tmp_path: Path) -> None:
    """Training mode (batch statistics): the gradient reaches every parameter, as in torch.

    Every weight product runs in blocks, as a large one would: their backward pass went through
    CrypTen's `narrow` with dimension -1, whose gradient fails (a 4000 x 4000 layer could not
    train).
    """
    expected = {}
    for name, (_, shape) in op_models.MODELS.items():
        model, x = op_models.seeded(name), op_models.example_input(name)
        model.train()
        r = torch.randn(model(x).shape, generator=torch.Generator().manual_seed(2))
        base = tmp_path / name
        base.with_suffix(".pb").write_bytes(capture(model, shape).SerializeToString())
        torch.save(model.state_dict(), base.with_suffix(".pt"))
        torch.save(x, str(base) + ".x.pt")
        torch.save(r, str(base) + ".r.pt")
        model.zero_grad()
        out = model(x)
        if out.requires_grad:  # (elementwise's parameters feed a detach: no gradient, as in torch)
            (out * r).sum().backward()
        expected[name] = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    results = run_session(
        tmp_path,
        2,
        "tests.graph.scenarios:secure_gradients",
        scenario_kwargs={
            "folder": str(tmp_path),
            "names": list(op_models.MODELS),
            "product_elements": 16,
        },
    )
    assert all(r.ok for r in results), [r.traceback for r in results]
    wrong = []
    for name, grads in expected.items():
        secure = results[0].value[name]
        for key, want in grads.items():
            if secure[key] is None:
                wrong.append(f"{name}: no gradient reaches {key}")
                continue
            ok, detail = crypten_close(secure[key], want, tolerance=0.1)
            if not ok:
                wrong.append(f"{name}: gradient of {key}: {detail}")
    assert not wrong, "\n".join(wrong)
