"""What a job will cost each party, before it runs: peak memory, bytes and rounds per batch.

Every figure follows from the graph, the batch size, the party count, the rows and the plan:
nothing of any party's data values. The graph runs once on meta tensors at the job's batch
size (torch's own shape rules, no memory), which gives each node's output elements; those feed
a model whose coefficients were fitted to measured runs through the daemons and are kept in
`estimate.json` beside this file with the command that fitted them (`python -m bench.estimate
--fit`: nothing in it is written by hand). `make bench` prints the estimate against what runs
measure (`bench/estimate.py`).

The model, per party:

- memory: `worker + inputs + a x parameters + b x activations + c x tuples`, in bytes (the
  tuples: the largest product's operands and output, a weight over the block size counted as
  one block, since products run one at a time), with `a`, `b` and `c`
  fitted separately for training and inference and for rank 0, which holds a batch's dealer
  corrections that it asks for ahead; `inputs` is the shares of every row of the job's input
  (8 bytes an element at every party) and each holder's own plaintext rows;
- bytes and rounds per batch: each product node (matmul, convolution, a product of two secret
  values) costs what its operands and output say (fitted per party count), each non-linear node
  its implementation's row of the measured cost table (`mpcml.approx.costs`), each comparison
  (ReLU, max pooling, clamps) a fitted cost per element; training adds the backward pass (a
  fitted multiple of the forward products), the loss's gradient (fitted per output element of
  a sigmoid or softmax head) and the optimizer's step (per parameter).

Torch is imported where the graph runs: the coordinator, which has no torch, reads the figures
each party computed when it vetted the job (`Verdict.estimate`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpcml.approx import costs
from mpcml.approx.plan import resolve
from mpcml.approx.registry import OP_FUNCTIONS
from mpcml.graph.ops import CONSTANT, SOFTMAXES
from mpcml.jobs.spec import batch_size, parties_in_order, round_plan
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import graph_pb2 as gpb
from mpcml.proto.v1 import job_pb2 as jpb

TABLE = Path(__file__).with_name("estimate.json")
MIB = 2**20
SHARE_BYTES = 8
"""An arithmetic share: one int64."""
PLAINTEXT_BYTES = 20
"""A holder's own rows per element while they are read and shared: Arrow's columns, the float32
array and torch's copy of it (measured on a 10^6-row CSV, docs/failures.md)."""

PRODUCTS = {
    "aten.addmm.default",
    "aten.mm.default",
    "aten.bmm.default",
    "aten.convolution.default",
}
"""Ops whose every call is a Beaver product of two secret values."""
MAYBE_PRODUCTS = {"aten.mul.Tensor", "aten.pow.Tensor_Scalar", "aten.where.self"}
"""A Beaver product when both operands are secret (a pow: one per squaring)."""
COMPARISONS = {
    "aten.relu.default": 1,
    "aten.hardtanh.default": 2,
    "aten.clamp.default": 2,
    "aten.max_pool2d_with_indices.default": 1,
}
"""Ops computed with CrypTen's comparison, and how many per output element (a max pooling's
window costs one per element it reads, counted on its input)."""
PARAMETER = "Parameter"


@dataclass
class Features:
    """What the graph says of one batch, counted in elements."""

    parameters: int = 0
    activations: int = 0
    """The output of every node computed from the input rows, at the job's batch size (a
    weight's transposes and expansions are views of its shares, not new memory)."""
    product_inputs: int = 0
    """The operands of every product node (what its Beaver triple masks and opens)."""
    product_outputs: int = 0
    products: int = 0
    comparisons: int = 0
    """Elements compared (CrypTen's `ltz`)."""
    nonlinear_bytes: float = 0.0
    nonlinear_rounds: int = 0
    head: str = ""
    """The function the loss's gradient computes on the logits ("sigmoid", "softmax"), or ""."""
    head_elements: int = 0
    tuple_elements: int = 0
    """The largest tensor of any tuple one batch asks for."""
    largest_product: int = 0
    """The most elements one product holds at once: its operands (a weight over the block size
    counted as one block, `aten_lower.PRODUCT_ELEMENTS`) and its output. Products run one after
    another, so their triples and openings are transient."""
    input_elements: int = 0
    """One row of the graph's input."""
    nodes: dict[str, tuple[str, int, int, float, int]] = field(default_factory=dict)
    """Each costly node's kind ("product", "comparison", "nonlinear"), operand and output
    elements (a comparison's: the elements compared), and a non-linear node's cost by the table
    (bytes, rounds): what `bench/estimate.py --fit` fits against."""

    @property
    def comparison_nodes(self) -> int:
        """Nodes computed with comparisons: each costs its rounds once, whatever its size."""
        return sum(1 for kind, *_ in self.nodes.values() if kind == "comparison")


@dataclass
class Estimate:
    """A job's cost at each of its parties."""

    peak_memory: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    tuple_elements: int = 0
    bytes_per_batch: int = 0
    rounds_per_batch: int = 0
    batches: int = 0

    def to_proto(self) -> cpb.ResourceEstimate:
        """As JobStatus and the verdicts carry it."""
        out = cpb.ResourceEstimate(
            parameters=self.parameters,
            tuple_elements=self.tuple_elements,
            bytes_per_batch=self.bytes_per_batch,
            rounds_per_batch=self.rounds_per_batch,
            batches=self.batches,
        )
        out.peak_memory_bytes.update(self.peak_memory)
        out.memory.update(self.memory)
        return out


@functools.cache
def table() -> dict[str, Any]:
    """The fitted coefficients."""
    data: dict[str, Any] = json.loads(TABLE.read_text())
    return data


def _numel(value: Any) -> int:
    return int(value.numel()) if hasattr(value, "numel") else 0


def features(spec: jpb.JobSpec, parties: int, rows: int = 0) -> Features:
    """Count one batch of the job's graph on meta tensors (no larger than `rows`, if given)."""
    import torch

    from mpcml.graph import aten_eval
    from mpcml.graph.aten_lower import PRODUCT_ELEMENTS as block

    graph = spec.graph
    batch = min(batch_size(spec), rows) if rows else batch_size(spec)
    train = spec.task == jpb.TASK_TRAIN
    choices = resolve(spec.approximations, graph)
    out = Features(input_elements=math.prod(int(d) for d in graph.input_shape))
    shapes: dict[str, int] = {graph.inputs[0]: batch * out.input_elements}
    secret: set[str] = {graph.inputs[0]}
    batched: set[str] = {graph.inputs[0]}
    """Nodes computed from the input rows."""
    for n in graph.nodes:
        if n.op == PARAMETER:
            shapes[n.name] = math.prod(int(d) for d in n.parameters[0].shape)
            out.parameters += shapes[n.name]
            secret.add(n.name)
    head = graph.output if train else ""
    """Training computes the head's function in the loss's gradient, not in the forward pass."""

    def function_cost(function: str, implementation: str, knobs: dict[str, float]) -> costs.Cost:
        return costs.cost(function, implementation, knobs, parties)

    def observe(node: gpb.Node, value: Any) -> None:
        elements = _numel(value)
        shapes[node.name] = elements
        if node.op == CONSTANT:
            return
        inputs = [i for i in node.inputs if i]
        if any(i in secret for i in inputs):
            secret.add(node.name)
        if any(i in batched for i in inputs):
            batched.add(node.name)
            out.activations += elements
        named = [i for i in (inputs[1:3] if node.op == "aten.addmm.default" else inputs)]
        named = [i for i in named if i in secret]
        operands = [shapes.get(i, 0) for i in named]
        if node.op in PRODUCTS or (node.op in MAYBE_PRODUCTS and len(operands) >= 2):
            out.products += 1
            out.product_inputs += sum(operands)
            out.product_outputs += elements
            blocked = [
                n if i in batched else min(n, block) for i, n in zip(named, operands, strict=True)
            ]
            out.tuple_elements = max(out.tuple_elements, elements, *blocked)
            out.largest_product = max(out.largest_product, sum(blocked) + elements)
            out.nodes[node.name] = ("product", sum(operands), elements, 0.0, 0)
        elif node.op in COMPARISONS:
            compared = shapes.get(inputs[0], elements) if "max_pool" in node.op else elements
            out.comparisons += compared * COMPARISONS[node.op]
            out.tuple_elements = max(out.tuple_elements, compared)
            out.nodes[node.name] = ("comparison", compared, compared * COMPARISONS[node.op], 0.0, 0)
        elif node.name != head and (node.op in OP_FUNCTIONS or node.op == "aten.exp.default"):
            if node.op in OP_FUNCTIONS:
                choice = choices[node.name]
                cost = function_cost(choice.function, choice.implementation, dict(choice.knobs))
            else:
                cost = function_cost("exp", "crypten", {})
            counted = elements
            if node.op == "aten.native_layer_norm.default":  # one rsqrt per normalised row
                counted = elements // max(1, int(value.shape[-1]))
            table_bytes = cost.bytes_per_element * counted
            out.nonlinear_bytes += table_bytes
            out.nonlinear_rounds += cost.rounds
            out.nodes[node.name] = ("nonlinear", counted, counted, table_bytes, cost.rounds)

    x = torch.empty((batch, *[int(d) for d in graph.input_shape]), device="meta")
    state = {
        aten_eval.key(n): torch.empty(tuple(n.parameters[0].shape), device="meta")
        for n in graph.nodes
        if n.op == PARAMETER
    }
    aten_eval.run(graph, x, state, observe=observe)
    last = next((n for n in graph.nodes if n.name == graph.output), None)
    if train and last is not None and (last.op in SOFTMAXES or spec.hyper.loss != jpb.LOSS_MSE):
        out.head = (
            "softmax"
            if last.op in SOFTMAXES or spec.hyper.loss == jpb.LOSS_CROSS_ENTROPY
            else "sigmoid"
        )
        out.head_elements = shapes.get(graph.output, 0)
    return out


def _holders(spec: jpb.JobSpec) -> dict[str, tuple[bool, bool]]:
    """Which parties read features, which labels."""
    return {
        p: (any(b.party == p for b in spec.features), any(b.party == p for b in spec.labels))
        for p in parties_in_order(spec)
    }


def data_bytes(spec: jpb.JobSpec, rows: int, f: Features) -> tuple[int, dict[str, int]]:
    """The shares of the job's input at every party, and each party's own plaintext rows."""
    train = spec.task == jpb.TASK_TRAIN
    label_width = max(1, math.prod(int(d) for d in spec.graph.output_shape)) if train else 0
    shares = rows * (f.input_elements + label_width) * SHARE_BYTES
    own = {
        name: rows
        * ((f.input_elements if has_features else 0) + (label_width if has_labels else 0))
        * PLAINTEXT_BYTES
        for name, (has_features, has_labels) in _holders(spec).items()
    }
    return shares, own


def estimate(spec: jpb.JobSpec, rows: int, found: Features | None = None) -> Estimate:
    """The job's estimate on `rows` rows of input (the catalogue's, or the intersection's)."""
    names = parties_in_order(spec)
    n = len(names)
    f = found if found is not None else features(spec, n, rows)
    coefficients = table()
    train = spec.task == jpb.TASK_TRAIN
    kind = "train" if train else "infer"
    per_n = coefficients["communication"][str(min(max(n, 2), 3))]
    memory = coefficients["memory"][kind]
    input_shares, own = data_bytes(spec, rows, f)
    plan = round_plan(spec, rows)
    out = Estimate(parameters=f.parameters, tuple_elements=f.tuple_elements)
    out.batches = plan.total_batches
    comparison_nodes = f.comparison_nodes
    product_bytes = per_n["product_input"] * f.product_inputs
    product_bytes += per_n["product_output"] * f.product_outputs
    forward_bytes = (
        product_bytes + per_n["comparison"] * f.comparisons + per_n["nonlinear"] * f.nonlinear_bytes
    )
    forward_rounds = (
        per_n["product_rounds"] * f.products
        + per_n["comparison_rounds"] * comparison_nodes
        + per_n["nonlinear_rounds"] * f.nonlinear_rounds
    )
    if train:
        backward = per_n["backward"] * product_bytes
        backward += per_n["comparison_backward"] * f.comparisons
        head_bytes, head_rounds = per_n["head"].get(f.head, (0.0, 0.0))
        out.bytes_per_batch = int(
            forward_bytes
            + backward
            + head_bytes * f.head_elements
            + per_n["optimizer"] * f.parameters
        )
        out.rounds_per_batch = round(
            forward_rounds
            + per_n["backward_rounds"] * (f.products + comparison_nodes)
            + head_rounds
            + per_n["optimizer_rounds"]
        )
    else:
        out.bytes_per_batch = int(forward_bytes)
        out.rounds_per_batch = round(forward_rounds)
    counts = {
        "parameters": f.parameters,
        "activations": f.activations,
        "tuples": f.largest_product,
    }
    common = {"worker": int(memory["other"]["worker"] * MIB), "inputs": int(input_shares)}
    common |= {k: int(memory["other"][k] * n) for k, n in counts.items()}
    out.memory = common
    extra_rank0 = int((memory["rank0"]["worker"] - memory["other"]["worker"]) * MIB) + sum(
        int((memory["rank0"][k] - memory["other"][k]) * n) for k, n in counts.items()
    )
    base = sum(common.values())
    for rank, name in enumerate(names):
        out.peak_memory[name] = int(base + own[name] + (max(extra_rank0, 0) if rank == 0 else 0))
    return out


def over(estimate: cpb.ResourceEstimate, party: str, limits: cpb.ResourceLimits) -> list[str]:
    """Which of `party`'s `limits` a job with `estimate` exceeds, each with the estimate."""
    found = []
    peak = estimate.peak_memory_bytes.get(party, 0)
    if limits.max_job_memory_bytes and peak > limits.max_job_memory_bytes:
        found.append(
            f"party {party!r}'s limit max_job_memory_mib = "
            f"{limits.max_job_memory_bytes // MIB}: its estimated peak memory there is "
            f"{peak / MIB:.0f} MiB"
        )
    if limits.max_parameters and estimate.parameters > limits.max_parameters:
        found.append(
            f"party {party!r}'s limit max_parameters = {limits.max_parameters}: its model has "
            f"{estimate.parameters} parameters"
        )
    if limits.max_tuple_elements and estimate.tuple_elements > limits.max_tuple_elements:
        found.append(
            f"party {party!r}'s limit max_tuple_elements = {limits.max_tuple_elements}: its "
            f"largest tuple tensor has {estimate.tuple_elements} elements"
        )
    return found


PARTS = ("worker", "inputs", "parameters", "activations", "tuples")
"""The parts of the peak memory, in the order they are printed."""


def describe(estimate: cpb.ResourceEstimate) -> list[str]:
    """The estimate as lines for people; parties by name."""
    peaks = sorted(estimate.peak_memory_bytes.items())
    parts = [(k, estimate.memory[k]) for k in PARTS if k in estimate.memory]
    return [
        "peak memory per party: " + ", ".join(f"{p} {b / MIB:.0f} MiB" for p, b in peaks),
        "  of which, at every party: " + ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in parts),
        f"parameters: {estimate.parameters}",
        f"largest tuple tensor: {estimate.tuple_elements} elements",
        f"per batch, each party: {estimate.bytes_per_batch / MIB:.2f} MiB sent, "
        f"{estimate.rounds_per_batch} rounds; {estimate.batches} batches",
    ]


def merged(verdicts: Mapping[str, cpb.ResourceEstimate]) -> cpb.ResourceEstimate:
    """One estimate from each party's own: its peak from each, the rest from the first."""
    out = cpb.ResourceEstimate()
    for i, (party, e) in enumerate(verdicts.items()):
        if i == 0:
            out.CopyFrom(e)
            out.ClearField("peak_memory_bytes")
        out.peak_memory_bytes[party] = e.peak_memory_bytes.get(party, 0)
    return out
