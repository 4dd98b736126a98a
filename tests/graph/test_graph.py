"""Models travel as graphs of core ATen ops: captured with torch.export, refused naming the op,
module and source line when an op has no lowering, and built into a CrypTen computation that
matches the torch model on the same input."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from mpcml.graph.build import build
from mpcml.graph.capture import capture
from mpcml.graph.digest import graph_digest
from mpcml.graph.ops import GraphError, validate
from mpcml.proto.v1 import graph_pb2 as pb
from tests.graph import models
from tests.support.check import crypten_close
from tests.support.parties import run_session


def test_cnn_is_captured_as_core_aten_ops_with_parameter_shapes_not_values() -> None:
    graph = capture(models.seeded("cnn"), (1, 8, 8))
    ops = [n.op for n in graph.nodes if n.op not in ("Parameter", "Constant")]
    assert ops == [
        "aten.convolution.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten.relu.default",
        "aten.convolution.default",
        "aten.add.Tensor",
        "aten.max_pool2d_with_indices.default",
        "aten.avg_pool2d.default",
        "aten.view.default",
        "aten.permute.default",
        "aten.addmm.default",
        "aten.tanh.default",
        "aten._softmax.default",
    ]
    parameters = {
        f"{n.module}.{n.parameters[0].name}": (list(n.parameters[0].shape), n.parameters[0].buffer)
        for n in graph.nodes
        if n.op == "Parameter"
    }
    assert parameters["conv1.weight"] == ([4, 1, 3, 3], False)
    assert parameters["bn.running_var"] == ([4], True)
    assert "bn.num_batches_tracked" not in parameters  # an int buffer the output never reads
    assert not any(n.op == "Constant" for n in graph.nodes)  # nothing of the weights travels
    view = next(n for n in graph.nodes if n.op == "aten.view.default")
    assert list(view.attrs["size"].ints.values) == [0, 16]  # batch x 16: constant parts,
    assert list(view.attrs["size@batch"].ints.values) == [1, 0]  # and batch coefficients
    assert (list(graph.input_shape), list(graph.output_shape)) == ([1, 8, 8], [3])
    assert pb.Graph.FromString(graph.SerializeToString()) == graph
    assert graph_digest(capture(models.seeded("cnn"), (1, 8, 8))) == graph_digest(graph)


class Sine(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) + 1


def test_an_op_without_a_lowering_is_refused_naming_op_module_and_source_line() -> None:
    model = nn.Sequential(nn.Linear(2, 2), Sine())
    with pytest.raises(GraphError) as caught:
        capture(model, (2,))
    message = str(caught.value)
    assert "aten.sin.default has no lowering" in message
    assert "in module '1' (Sine)" in message
    assert "test_graph.py" in message and "return torch.sin(x) + 1" in message


def test_a_model_that_reads_the_data_to_decide_is_refused_with_exports_reason() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(GraphError, match=r"torch\.export cannot capture the model"):
        capture(Branchy(), (3,))


def test_division_by_a_secret_value_is_refused_at_capture() -> None:
    class Ratio(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / (x + 2)

    with pytest.raises(GraphError, match="division by a secret value"):
        capture(Ratio(), (3,))


def test_malformed_graphs_are_refused_before_anything_is_built() -> None:
    graph = capture(models.seeded("mlp"), (6,))
    bad_op = pb.Graph()
    bad_op.CopyFrom(graph)
    bad_op.nodes[1].op = "Exec"
    with pytest.raises(GraphError, match="op 'Exec' is not a supported core ATen op"):
        validate(bad_op)
    dangling = pb.Graph()
    dangling.CopyFrom(graph)
    first_op = next(i for i, n in enumerate(graph.nodes) if n.inputs)
    dangling.nodes[first_op].inputs[0] = "nowhere"
    with pytest.raises(GraphError, match="reads 'nowhere'"):
        build(dangling)
    future = pb.Graph()
    future.CopyFrom(graph)
    future.version = 99
    with pytest.raises(GraphError, match="version 99"):
        validate(future)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.system
def test_secure_inference_of_a_traced_model_matches_torch(tmp_path: Path, name: str) -> None:
    model = models.seeded(name)
    graph_file, weights_file = tmp_path / "graph.pb", tmp_path / "weights.pt"
    shape = tuple(models.example_input(name).shape[1:])
    graph_file.write_bytes(capture(model, shape).SerializeToString())
    torch.save(model.state_dict(), weights_file)
    results = run_session(
        tmp_path,
        2,
        "tests.graph.scenarios:secure_inference",
        scenario_kwargs={"graph": str(graph_file), "weights": str(weights_file), "model": name},
    )
    assert all(r.ok for r in results), [r.traceback for r in results]
    with torch.no_grad():
        expected = model(models.example_input(name))
    for r in results:
        ok, detail = crypten_close(r.value["out"], expected)
        assert ok, f"{name} on rank {r.rank}: {detail}"


@pytest.mark.system
def test_secure_training_of_a_traced_model_matches_torch(tmp_path: Path) -> None:
    model = models.seeded("mlp-train")
    graph = capture(model, (6,))
    graph_file, weights_file = tmp_path / "graph.pb", tmp_path / "weights.pt"
    graph_file.write_bytes(graph.SerializeToString())
    torch.save(model.state_dict(), weights_file)
    results = run_session(
        tmp_path,
        2,
        "tests.graph.scenarios:secure_training",
        scenario_kwargs={"graph": str(graph_file), "weights": str(weights_file)},
    )
    assert all(r.ok for r in results), [r.traceback for r in results]
    trained = models.train_plaintext(model).state_dict()
    by_node = {n.name: n.module for n in graph.nodes}
    for r in results:
        assert r.value, "no parameters came back"
        for key, value in r.value.items():
            node, name = key.split(".")
            expected = trained[f"{by_node[node]}.{name}"]
            assert not torch.equal(
                expected, models.seeded("mlp-train").state_dict()[f"{by_node[node]}.{name}"]
            ), f"{key} did not train"
            ok, detail = crypten_close(value, expected)
            assert ok, f"{key} on rank {r.rank}: {detail}"


def test_models_captured_from_several_threads_at_once_give_one_graph() -> None:
    # Jobs submitted from a thread pool each capture their model at submission.
    with ThreadPoolExecutor(3) as pool:
        digests = set(pool.map(lambda _: graph_digest(capture(models.mlp(), (6,))), range(3)))
    assert len(digests) == 1


def test_a_model_that_returns_its_input_is_refused_at_capture() -> None:
    with pytest.raises(GraphError, match="computes nothing"):
        capture(nn.Sequential(nn.Flatten()), (6,))
