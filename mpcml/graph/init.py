"""Initial weights every party derives from a public seed, and the plaintext side can match.

A jointly trained model starts from public weights: deriving them from the job's seed means they
never travel, and a plaintext PyTorch run given the same seed starts from the same point.
"""

from __future__ import annotations

import math

import torch

from mpcml.proto.v1 import graph_pb2 as pb


def initial_state(graph: pb.Graph, seed: int) -> dict[str, torch.Tensor]:
    """A state_dict for `graph`, the same for every caller with the same seed.

    Weights and biases are uniform in +-1/sqrt(fan_in) (torch's default bound for Linear and
    Conv2d); batch norm starts at the identity.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for node in graph.nodes:
        shapes = {p.name: list(p.shape) for p in node.parameters}
        weight = shapes.get("weight", [])
        fan_in = math.prod(weight[1:]) if len(weight) > 1 else 1
        bound = 1.0 / math.sqrt(max(fan_in, 1))
        for p in node.parameters:
            key = f"{node.module}.{p.name}"
            shape = list(p.shape)
            if node.op.startswith("BatchNorm"):
                ones = p.name in ("weight", "running_var")
                state[key] = torch.ones(shape) if ones else torch.zeros(shape)
            else:
                state[key] = (torch.rand(shape, generator=generator) * 2 - 1) * bound
    return state
