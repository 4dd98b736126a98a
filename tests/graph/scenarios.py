"""What the party processes of the graph tests run: build a graph, load weights, infer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import crypten
import torch

import mpcml
from mpcml.graph.build import build, load_weights
from mpcml.graph.opspec import parameter_key
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


def _shared_graph(s: mpcml.Session, base: Path) -> tuple[pb.Graph, Any, Any]:
    """The graph `base.pb` built with rank 0's weights (`base.pt`) and the last rank's input
    (`base.x.pt`) shared: the graph, the encrypted module and the secret input."""
    g = pb.Graph.FromString(base.with_suffix(".pb").read_bytes())
    net = build(g)
    if s.rank == 0:
        load_weights(net, g, torch.load(base.with_suffix(".pt"), weights_only=True))
    net.encrypt(src=0)
    x = torch.load(str(base) + ".x.pt", weights_only=True)
    owner = s.world_size - 1
    secret = crypten.cryptensor(x if s.rank == owner else torch.empty(x.shape), src=owner)
    return g, net, secret


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
        _, net, secret = _shared_graph(s, Path(folder) / name)
        net.eval()
        out[name] = net(secret).get_plain_text()
    return out


def secure_gradients(
    s: mpcml.Session, folder: str, names: list[str], product_elements: int = 0
) -> dict[str, Any]:
    """For each named graph, in training mode: the gradient of sum(output * r) with respect to
    every parameter (r is `NAME.r.pt`), revealed to everyone, keyed by state_dict key.

    `product_elements` as for `secure_graphs`: the blocks' backward pass too.
    """
    from mpcml.graph import aten_lower

    if product_elements:
        aten_lower.PRODUCT_ELEMENTS = product_elements
    out: dict[str, Any] = {}
    for name in names:
        g, net, secret = _shared_graph(s, Path(folder) / name)
        net.train()
        r = torch.load(str(Path(folder) / name) + ".r.pt", weights_only=True)
        net.zero_grad()
        net(secret).mul(r).sum().backward()
        grads = {}
        for node in g.nodes:
            spec = node.parameters[0] if node.op == "Parameter" else None
            if spec is not None and not spec.buffer:
                p = getattr(net._modules[node.name], spec.name)
                key = parameter_key(node.module, spec.name)
                grads[key] = None if p.grad is None else p.grad.get_plain_text()
        out[name] = grads
    return out
