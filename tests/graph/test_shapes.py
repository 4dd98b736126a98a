"""Shapes: a captured graph records its input and output rows, the coordinator checks the data
against them without torch, and each party re-derives the output with torch's own rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpcml.graph import aten_eval
from mpcml.graph.capture import capture
from mpcml.graph.ops import GraphError
from mpcml.graph.shapes import infer_shapes
from tests.graph import models

CASES = [
    (models.seeded("cnn"), (1, 8, 8)),
    (models.mlp(), (6,)),
    (nn.Sequential(nn.Conv2d(3, 5, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten()), (3, 9, 7)),
    (nn.Sequential(nn.Conv2d(2, 4, (3, 2), stride=(2, 1), padding=(0, 2), dilation=2)), (2, 11, 6)),
    (nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)), (5,)),
    (nn.Sequential(nn.BatchNorm1d(3), nn.Sigmoid()), (3, 7)),
    (nn.Sequential(nn.Conv2d(1, 3, 3), nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten()), (1, 9, 9)),
    (nn.Sequential(nn.MaxPool2d(3, stride=2, padding=1), nn.AvgPool2d(2)), (2, 9, 10)),
    (nn.Sequential(nn.Linear(4, 10), nn.Softmax(dim=-1)), (4,)),
    (nn.Sequential(nn.Linear(4, 10), nn.Softmax(dim=1)), (3, 4)),
]


@pytest.mark.parametrize("model, shape", CASES, ids=[str(i) for i in range(len(CASES))])
def test_output_shapes_of_a_captured_graph_match_torch(
    model: nn.Module, shape: tuple[int, ...]
) -> None:
    model.eval()
    with torch.no_grad():
        expected = tuple(model(torch.zeros(2, *shape)).shape[1:])
    graph = capture(model, shape)
    assert infer_shapes(graph, shape) == expected  # the coordinator's check, torch-free
    assert aten_eval.output_shape(graph, shape) == expected  # each party's, on meta tensors


def test_rows_of_another_shape_than_captured_are_refused_naming_both() -> None:
    graph = capture(models.mlp(), (6,))
    with pytest.raises(GraphError, match=r"captured for rows of shape \[6\].*shape \[15\]"):
        infer_shapes(graph, (15,))


def test_a_model_that_does_not_fit_its_rows_is_refused_at_capture() -> None:
    with pytest.raises(GraphError, match=r"torch\.export cannot capture the model"):
        capture(models.seeded("cnn"), (3, 8, 8))


def test_a_tampered_graph_is_caught_by_the_partys_own_shape_check() -> None:
    graph = capture(models.mlp(), (6,))
    weight = next(n for n in graph.nodes if n.op == "Parameter")
    weight.parameters[0].shape[:] = [8, 5]
    with pytest.raises(GraphError, match="does not fit rows of shape"):
        aten_eval.output_shape(graph, (6,))


def test_graphs_with_two_inputs_are_refused() -> None:
    graph = capture(models.mlp(), (6,))
    graph.inputs.append("other")
    with pytest.raises(GraphError, match="only single-input models are supported"):
        infer_shapes(graph, (6,))
