"""A job's approximation plan, resolved against its graph: one choice per non-linear node.

Torch-free: the coordinator refuses a bad plan at submission with this module, and the parties
build the model from the same resolution. A plan naming an unknown node, op, implementation or
knob, a knob out of its range, or a calibrated input range the implementation is not accurate
on (or would overflow CrypTen's fixed-point ring over), is a PlanError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mpcml.approx import registry
from mpcml.approx.registry import OP_FUNCTIONS, OP_NAMES, PlanError
from mpcml.proto.v1 import graph_pb2 as gpb
from mpcml.proto.v1 import job_pb2 as jpb

SOURCES = ("", "crypten", "auto", "explicit")
CRYPTEN = "crypten"


@dataclass(frozen=True)
class Choice:
    """How one node is computed."""

    node: str
    function: str
    implementation: str = CRYPTEN
    knobs: Mapping[str, float] = field(default_factory=dict)
    """Filled in: every knob of the implementation."""
    calibrated: tuple[float, float] | None = None

    @property
    def is_crypten(self) -> bool:
        """CrypTen's own implementation: the model runs as stock CrypTen's would."""
        return self.implementation == CRYPTEN

    def describe(self) -> str:
        """`node: function implementation(knob=value, ...) on [low, high]`."""
        knobs = ", ".join(f"{k}={v:g}" for k, v in self.knobs.items())
        text = f"{self.node}: {self.function} {self.implementation}"
        text += f"({knobs})" if knobs else ""
        if self.calibrated is not None:
            text += f" on [{self.calibrated[0]:.4g}, {self.calibrated[1]:.4g}]"
        return text


def _choice(node: gpb.Node, entry: jpb.Approximation, where: str) -> Choice:
    function = OP_FUNCTIONS[node.op]
    name = entry.implementation or CRYPTEN
    try:
        settings = registry.knobs(function, name, dict(entry.knobs))
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
    calibrated = None
    if entry.calibrated:
        if not entry.low <= entry.high:
            raise PlanError(f"{where}: calibrated range [{entry.low:g}, {entry.high:g}] is empty")
        lo, hi = registry.domain(function, name, settings)
        if entry.low < lo or entry.high > hi:
            raise PlanError(
                f"{where}: the node's inputs range over [{entry.low:.4g}, {entry.high:.4g}] on "
                f"the calibration set, outside [{lo:.4g}, {hi:.4g}] where {function} {name!r} is "
                "accurate and cannot overflow CrypTen's fixed-point ring"
            )
        calibrated = (entry.low, entry.high)
    return Choice(node.name, function, name, settings, calibrated)


def resolve(plan: jpb.ApproximationPlan, graph: gpb.Graph) -> dict[str, Choice]:
    """The choice for every non-linear node of `graph`, or PlanError naming what is wrong."""
    if plan.source not in SOURCES:
        raise PlanError(
            f"approximation plan source {plan.source!r} is not one of crypten, auto, explicit"
        )
    nodes = {n.name: n for n in graph.nodes}
    for name in plan.nodes:
        node = nodes.get(name)
        if node is None:
            raise PlanError(f"the approximation plan names node {name!r}, which the model lacks")
        if node.op not in OP_FUNCTIONS:
            raise PlanError(
                f"the approximation plan names node {name!r}, a {node.op}: only "
                f"{', '.join(OP_FUNCTIONS)} nodes have approximations"
            )
    named = sorted(set(OP_NAMES.values()))
    for op in plan.ops:
        if op not in OP_FUNCTIONS and op not in named:
            raise PlanError(
                f"the approximation plan names op {op!r}: only {', '.join(named)} (or their "
                f"ATen ops, {', '.join(OP_FUNCTIONS)}) have approximations"
            )
    out: dict[str, Choice] = {}
    for node in graph.nodes:
        if node.op not in OP_FUNCTIONS:
            continue
        if node.name in plan.nodes:
            out[node.name] = _choice(node, plan.nodes[node.name], f"node {node.name!r}")
        elif node.op in plan.ops or OP_NAMES.get(node.op) in plan.ops:
            entry = plan.ops[node.op] if node.op in plan.ops else plan.ops[OP_NAMES[node.op]]
            out[node.name] = _choice(node, entry, f"node {node.name!r} ({node.op})")
        else:
            out[node.name] = Choice(node.name, OP_FUNCTIONS[node.op])
    return out


def describe(plan: jpb.ApproximationPlan, graph: gpb.Graph) -> list[str]:
    """One line per node that does not run CrypTen's own implementation."""
    try:
        choices = resolve(plan, graph)
    except PlanError as exc:
        return [f"(invalid: {exc})"]
    return [c.describe() for c in choices.values() if not c.is_crypten]
