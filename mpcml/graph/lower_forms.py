"""Which torch calls of a traced sequence model the lowering (`lower.py`) recognises.

A call appears in a trace as a function, a method name or an operator, depending on how the
model wrote it; each group lists every form of one operation.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from mpcml.graph.ops import Attrs

SHAPE_QUERIES = {"size", "dim", "numel"}
IDENTITY_METHODS = {"contiguous", "to", "float", "type", "type_as", "clone", "detach"}
RESHAPES_M = {"view", "reshape", "unsqueeze", "squeeze", "flatten", "view_as", "reshape_as"}
RESHAPES_F = {torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten}
ADD = {operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__radd__"}
SUB = {operator.sub, operator.isub, torch.sub, "sub", "__sub__"}
RSUB = {torch.rsub, "__rsub__", "rsub"}
MUL = {operator.mul, operator.imul, torch.mul, "mul", "__mul__", "__rmul__"}
DIV = {operator.truediv, torch.div, torch.true_divide, "div", "__truediv__", "truediv"}
MATMUL = {operator.matmul, torch.matmul, torch.bmm, "matmul", "bmm"}
SOFTMAX = {F.softmax, torch.softmax, "softmax"}
TRANSPOSE = {torch.transpose, "transpose"}
PERMUTE = {torch.permute, "permute"}
SPLIT = {torch.split, torch.chunk, "split", "chunk"}
POW = {operator.pow, torch.pow, "pow", "__pow__"}
EQ = {operator.eq, torch.eq, "eq", "__eq__"}
NE = {operator.ne, torch.ne, "ne", "__ne__"}
EXPAND = {"expand", "expand_as"}
MASKED_FILL = {"masked_fill", torch.masked_fill}
UNARY: dict[Any, tuple[str, Attrs]] = {
    torch.tanh: ("Tanh", {}),
    "tanh": ("Tanh", {}),
    torch.sigmoid: ("Sigmoid", {}),
    "sigmoid": ("Sigmoid", {}),
    torch.relu: ("ReLU", {}),
    F.relu: ("ReLU", {}),
    "relu": ("ReLU", {}),
    F.silu: ("SiLU", {}),
}


def key(target: Any) -> Any:
    """A call's target as the groups hold it: the function, or the method's name."""
    return target if callable(target) else str(target)


def member(target: Any, group: set[Any]) -> bool:
    """Whether a call's target is one of `group`'s forms."""
    try:
        return key(target) in group
    except TypeError:  # an unhashable target
        return False
