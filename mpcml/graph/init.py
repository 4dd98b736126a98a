"""Initial weights every party derives from a public seed, and the plaintext side can match.

A jointly trained model starts from public weights: deriving them from the job's seed means they
never travel, and a plaintext PyTorch run given the same seed starts from the same point.
"""

from __future__ import annotations

import math

import torch

from mpcml.graph.aten import OPS, PARAMETER, tensor_args
from mpcml.graph.opspec import parameter_key
from mpcml.proto.v1 import graph_pb2 as pb

_NORMS = {
    "aten.native_layer_norm.default",
    "aten._native_batch_norm_legit_no_training.default",
}
_ONES = {"weight", "running_var"}


def initial_state(graph: pb.Graph, seed: int) -> dict[str, torch.Tensor]:
    """A state_dict for `graph`, the same for every caller with the same seed.

    Weights and biases are uniform in +-1/sqrt(fan_in) (torch's default bound for Linear and
    Conv2d); batch norm starts at the identity.
    """
    generator = torch.Generator().manual_seed(seed)
    roles: dict[str, str] = {}
    """Parameter node -> the argument of a norm it is (weight, bias, running_var, ...)."""
    for node in graph.nodes:
        if node.op not in _NORMS:
            continue
        names = [n for n, _, width in tensor_args(OPS[node.op], node) for _ in range(width)]
        for name, source in zip(names, node.inputs, strict=True):
            roles[source] = name
    parameters = [n for n in graph.nodes if n.op == PARAMETER]
    weights = {
        n.module: list(n.parameters[0].shape)
        for n in parameters
        if n.parameters[0].name == "weight"
    }
    state: dict[str, torch.Tensor] = {}
    for node in parameters:
        p = node.parameters[0]
        key = parameter_key(node.module, p.name)
        shape = list(p.shape)
        if node.name in roles:
            ones = roles[node.name] in _ONES
            state[key] = torch.ones(shape) if ones else torch.zeros(shape)
            continue
        weight = weights.get(node.module, [])
        fan_in = math.prod(weight[1:]) if len(weight) > 1 else 1
        bound = 1.0 / math.sqrt(max(fan_in, 1))
        state[key] = (torch.rand(shape, generator=generator) * 2 - 1) * bound
    return state


def model_initial_state(
    model: torch.nn.Module, input_shape: tuple[int, ...], seed: int
) -> dict[str, torch.Tensor]:
    """`initial_state` of the graph `model` captures to, on rows of `input_shape`.

    What a plaintext run loads to start where a seeded secure job starts.
    """
    from mpcml.graph.capture import capture

    return initial_state(capture(model, input_shape), seed)
