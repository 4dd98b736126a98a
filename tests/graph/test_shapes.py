"""Shapes are inferred from the graph alone, agree with torch, and a misfit names its node."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mpcml.graph.ops import GraphError
from mpcml.graph.shapes import infer_shapes
from mpcml.graph.trace import trace
from tests.graph import models


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.conv(x)
        return x + y


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
def test_inferred_shapes_match_torch(model: nn.Module, shape: tuple[int, ...]) -> None:
    model.eval()
    with torch.no_grad():
        expected = tuple(model(torch.zeros(2, *shape)).shape[1:])
    assert infer_shapes(trace(model), shape) == expected


def test_linear_with_the_wrong_input_width_names_the_node_and_both_widths() -> None:
    graph = trace(models.mlp())
    with pytest.raises(GraphError) as err:
        infer_shapes(graph, (15,))
    message = str(err.value)
    assert message.startswith(f"node {graph.nodes[0].name!r} (Linear)")
    assert "expects 6 input features, the input has 15" in message


def test_conv_with_the_wrong_channel_count_is_refused() -> None:
    with pytest.raises(GraphError, match=r"\(Conv2d\) expects 1 channels, the input has 3"):
        infer_shapes(trace(models.seeded("cnn")), (3, 8, 8))


def test_conv_needs_a_chw_input() -> None:
    with pytest.raises(GraphError, match=r"\(Conv2d\) expects a \(C, H, W\) input"):
        infer_shapes(trace(models.seeded("cnn")), (8, 8))


def test_a_kernel_larger_than_its_input_is_refused() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 5))
    with pytest.raises(GraphError, match=r"\(Conv2d\) has kernel \[5, 5\].*\[3, 4\] input"):
        infer_shapes(trace(model), (1, 3, 4))
    pool = nn.Sequential(nn.MaxPool2d(4))
    with pytest.raises(GraphError, match=r"\(MaxPool2d\) has kernel \[4, 4\]"):
        infer_shapes(trace(pool), (1, 3, 8))


def test_adding_shapes_that_do_not_broadcast_is_refused() -> None:
    with pytest.raises(
        GraphError,
        match=r"\(Add\) cannot broadcast shapes \['batch', 2, 8, 8\] and \['batch', 2, 4, 4\]",
    ):
        infer_shapes(trace(Residual()), (2, 8, 8))


def test_softmax_dim_counts_the_batch_dimension() -> None:
    graph = trace(nn.Sequential(nn.Softmax(dim=1)))
    assert infer_shapes(graph, (10,)) == (10,)
    with pytest.raises(GraphError, match=r"\(Softmax\) has dim 2, out of range .* 2 dimensions"):
        infer_shapes(trace(nn.Sequential(nn.Softmax(dim=2))), (10,))


def test_graphs_with_two_inputs_are_refused() -> None:
    with pytest.raises(GraphError, match="only single-input models are supported"):
        infer_shapes(trace(TwoInputs()), (3,))


def test_parameter_shapes_must_agree_with_the_settings() -> None:
    graph = trace(models.mlp())
    graph.nodes[0].parameters[0].shape[:] = [8, 5]
    with pytest.raises(
        GraphError, match=r"\(Linear\) has weight \[8, 5\], its settings say \[8, 6\]"
    ):
        infer_shapes(graph, (6,))
