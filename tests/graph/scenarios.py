"""What the party processes of the graph tests run: build a graph, load weights, infer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import crypten
import torch

import mpcml
from mpcml.graph.build import build, load_weights
from mpcml.proto.v1 import graph_pb2 as pb
from tests.graph import models


def secure_inference(s: mpcml.Session, graph: str, weights: str, model: str) -> dict[str, Any]:
    """Rank 0 owns the weights, rank 1 the input; everyone learns the prediction."""
    g = pb.Graph.FromString(Path(graph).read_bytes())
    net = build(g)
    if s.rank == 0:
        load_weights(net, g, torch.load(weights, weights_only=True))
    net.encrypt(src=0)
    net.eval()
    x = models.example_input(model)
    secret = crypten.cryptensor(x if s.rank == 1 else torch.empty(x.shape), src=1)
    return {"out": net(secret).get_plain_text()}


def secure_training(s: mpcml.Session, graph: str, weights: str) -> dict[str, Any]:
    """Rank 0 owns the initial weights, rank 1 the data and labels; the trained weights are
    revealed to everyone."""
    g = pb.Graph.FromString(Path(graph).read_bytes())
    net = build(g)
    if s.rank == 0:
        load_weights(net, g, torch.load(weights, weights_only=True))
    net.encrypt(src=0)
    net.train()
    x, y = models.example_input("mlp-train"), models.labels()
    features = crypten.cryptensor(x if s.rank == 1 else torch.empty(x.shape), src=1)
    targets = crypten.cryptensor(y if s.rank == 1 else torch.empty(y.shape), src=1)
    loss_fn = crypten.nn.BCELoss()
    for _ in range(models.TRAIN_STEPS):
        loss = loss_fn(net(features), targets)
        net.zero_grad()
        loss.backward()
        net.update_parameters(models.TRAIN_LR)
    return {
        f"{node}.{name}": p.get_plain_text()
        for node, module in net._modules.items()
        for name, p in module.named_parameters()
    }


def secure_graphs(
    s: mpcml.Session, folder: str, names: list[str], product_elements: int = 0
) -> dict[str, Any]:
    """Each named graph of `folder` (`NAME.pb`, `NAME.pt` weights, `NAME.x.pt` input): rank 0
    owns the weights, the last rank the input; everyone learns every output.

    `product_elements` lowers the size above which a weight is multiplied in column blocks.
    """
    from mpcml.graph import aten_lower

    if product_elements:
        aten_lower.PRODUCT_ELEMENTS = product_elements
    out = {}
    for name in names:
        base = Path(folder) / name
        g = pb.Graph.FromString(base.with_suffix(".pb").read_bytes())
        net = build(g)
        if s.rank == 0:
            load_weights(net, g, torch.load(base.with_suffix(".pt"), weights_only=True))
        net.encrypt(src=0)
        net.eval()
        x = torch.load(str(base) + ".x.pt", weights_only=True)
        owner = s.world_size - 1
        secret = crypten.cryptensor(x if s.rank == owner else torch.empty(x.shape), src=owner)
        out[name] = net(secret).get_plain_text()
    return out


def secure_gradients(s: mpcml.Session, folder: str, names: list[str]) -> dict[str, Any]:
    """For each named graph, in training mode: the gradient of sum(output * r) with respect to
    every parameter (r is `NAME.r.pt`), revealed to everyone, keyed by state_dict key."""
    out: dict[str, Any] = {}
    for name in names:
        base = Path(folder) / name
        g = pb.Graph.FromString(base.with_suffix(".pb").read_bytes())
        net = build(g)
        if s.rank == 0:
            load_weights(net, g, torch.load(base.with_suffix(".pt"), weights_only=True))
        net.encrypt(src=0)
        net.train()
        x = torch.load(str(base) + ".x.pt", weights_only=True)
        r = torch.load(str(base) + ".r.pt", weights_only=True)
        owner = s.world_size - 1
        secret = crypten.cryptensor(x if s.rank == owner else torch.empty(x.shape), src=owner)
        net.zero_grad()
        net(secret).mul(r).sum().backward()
        grads = {}
        for node in g.nodes:
            if node.op == "Parameter" and not node.parameters[0].buffer:
                p = getattr(net._modules[node.name], node.parameters[0].name)
                key = f"{node.module}.{node.parameters[0].name}".lstrip(".")
                grads[key] = None if p.grad is None else p.grad.get_plain_text()
        out[name] = grads
    return out
