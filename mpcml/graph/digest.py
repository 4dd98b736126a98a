"""A model graph's digest: the name under which a party's policy approves a model.

Computed by the coordinator for the job's status and by each party from the spec it vets, never
taken from the wire, so a party checks the model it will run, not a digest someone claims.
"""

from __future__ import annotations

import hashlib

from mpcml.proto.v1 import graph_pb2 as pb

PREFIX = "sha256:"


def graph_digest(graph: pb.Graph) -> str:
    """`sha256:` and the SHA-256 of the graph's deterministic protobuf encoding (hex)."""
    return PREFIX + hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()
