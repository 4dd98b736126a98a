"""The output shape of a graph on a dataset's rows, checked before anything is shared.

A graph is captured for one row shape and records its output row's (`capture.py`); the
coordinator compares the data with it without torch, and each party derives the output again
on meta tensors (`aten_eval.output_shape`), so a tampered record is caught there.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpcml.graph.ops import GraphError, validate
from mpcml.proto.v1 import graph_pb2 as pb

Shape = tuple[int, ...]
"""A shape without the batch dimension."""


def infer_shapes(graph: pb.Graph, input_shape: Sequence[int]) -> Shape:
    """The output shape of one sample of `input_shape` (both without the batch dimension)."""
    validate(graph)
    if len(graph.inputs) != 1:
        raise GraphError(
            f"only single-input models are supported; the graph has {len(graph.inputs)} inputs"
        )
    shape = tuple(int(d) for d in input_shape)
    if any(d < 1 for d in shape):
        raise GraphError(f"input shape {list(shape)} has a dimension below 1")
    if shape != tuple(graph.input_shape):
        raise GraphError(
            f"the model was captured for rows of shape {list(graph.input_shape)}, the data's "
            f"rows have shape {list(shape)}"
        )
    if not graph.output_shape:
        raise GraphError("the captured graph records no output shape")
    return tuple(int(d) for d in graph.output_shape)
