"""Models travel as whitelisted graphs: traced from torch, refused by name when off the list,
and built into a CrypTen computation that matches the torch model on the same input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpcml.graph.build import build
from mpcml.graph.ops import GraphError, validate
from mpcml.graph.trace import trace
from mpcml.proto.v1 import graph_pb2 as pb
from tests.graph import models
from tests.support.check import crypten_close
from tests.support.parties import run_session


def test_cnn_traces_into_whitelisted_ops_with_parameter_shapes_not_values() -> None:
    graph = trace(models.seeded("cnn"))
    assert [n.op for n in graph.nodes] == [
        "Conv2d",
        "BatchNorm2d",
        "ReLU",
        "Conv2d",
        "Add",
        "MaxPool2d",
        "AvgPool2d",
        "Flatten",
        "Linear",
        "Tanh",
        "Softmax",
    ]
    conv1 = graph.nodes[0]
    assert conv1.module == "conv1"
    assert [(p.name, list(p.shape)) for p in conv1.parameters] == [
        ("weight", [4, 1, 3, 3]),
        ("bias", [4]),
    ]
    assert list(conv1.attrs["kernel_size"].ints.values) == [3, 3]
    bn = graph.nodes[1]
    assert {p.name for p in bn.parameters if p.buffer} == {"running_mean", "running_var"}
    assert pb.Graph.FromString(graph.SerializeToString()) == graph
    assert graph.nodes[4].inputs == ["relu", "conv2"]


@pytest.mark.parametrize(
    "model, name",
    [
        (nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 2)), "LSTM"),
        (nn.Sequential(nn.Linear(2, 2), nn.Hardswish()), "Hardswish"),
        (nn.Sequential(nn.Flatten(start_dim=2)), "Flatten(start_dim=2"),
    ],
    ids=["lstm", "hardswish", "flatten-dim"],
)
def test_modules_off_the_whitelist_are_refused_by_name(model: nn.Module, name: str) -> None:
    with pytest.raises(GraphError, match=name.replace("(", r"\(")):
        trace(model)


def test_functions_off_the_whitelist_are_refused_by_name() -> None:
    class Sine(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x)

    with pytest.raises(GraphError, match="function 'sin' is not a supported op"):
        trace(Sine())


def test_malformed_graphs_are_refused_before_anything_is_built() -> None:
    graph = trace(models.seeded("mlp"))
    bad_op = pb.Graph()
    bad_op.CopyFrom(graph)
    bad_op.nodes[1].op = "Exec"
    with pytest.raises(GraphError, match="op 'Exec' is not supported"):
        validate(bad_op)
    dangling = pb.Graph()
    dangling.CopyFrom(graph)
    dangling.nodes[1].inputs[0] = "nowhere"
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
    graph_file.write_bytes(trace(model).SerializeToString())
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
    graph = trace(model)
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
