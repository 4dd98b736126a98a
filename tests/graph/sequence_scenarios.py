"""What the party processes of the transformer tests run: a lowered graph, secure inference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import crypten
import numpy as np
import torch

import mpcml
from mpcml.approx.plan import resolve
from mpcml.graph.build import build, load_weights
from mpcml.proto.v1 import graph_pb2 as pb
from mpcml.proto.v1 import job_pb2 as jpb


def secure_inference(
    s: mpcml.Session, graph: str, weights: str, tokens: str, plan: str = ""
) -> dict[str, Any]:
    """Rank 0 owns the weights, the last rank the token rows; everyone learns the output."""
    g = pb.Graph.FromString(Path(graph).read_bytes())
    approximations = jpb.ApproximationPlan.FromString(Path(plan).read_bytes()) if plan else None
    net = build(g, resolve(approximations, g) if approximations else None)
    if s.rank == 0:
        load_weights(net, g, torch.load(weights, weights_only=True))
    net.encrypt(src=0)
    net.eval()
    rows = torch.from_numpy(np.load(tokens))
    owner = s.world_size - 1
    x = crypten.cryptensor(rows if s.rank == owner else torch.zeros(rows.shape), src=owner)
    with crypten.no_grad():
        out = net(x).get_plain_text()
    return {"out": out}
