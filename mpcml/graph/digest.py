"""A model graph's digest and a private model's commitment: what a party's policy admits.

The digest is computed by the coordinator for the job's status and by each party from the spec
it vets, never taken from the wire, so a party checks the model it will run, not a digest
someone claims. The commitment pins a private model's weights: their owner computes it when it
registers and checks it again on the weights it loads before it shares them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mpcml.proto.v1 import graph_pb2 as pb

if TYPE_CHECKING:  # the coordinator loads this module and never torch
    import torch

PREFIX = "sha256:"


def graph_digest(graph: pb.Graph) -> str:
    """`sha256:` and the SHA-256 of the graph's deterministic protobuf encoding (hex)."""
    return PREFIX + hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def weights_commitment(state: Mapping[str, torch.Tensor]) -> str:
    """`sha256:` and the SHA-256 of a state_dict's content.

    Each tensor's key, dtype, shape and bytes, in key order. Computed over the tensors as
    loaded (not the file), so the owner checks exactly what it is about to share, and a file
    re-saved with the same values keeps its commitment.
    """
    import torch

    h = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().to("cpu").contiguous()
        header = f"{key}\0{tensor.dtype}\0{list(tensor.shape)}\0".encode()
        h.update(len(header).to_bytes(8, "little") + header)
        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        h.update(len(data).to_bytes(8, "little") + data)
    return PREFIX + h.hexdigest()
