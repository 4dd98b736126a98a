"""The tuner: the cheapest approximation plan whose effect on the task stays within a budget.

It runs where the model's weights and a calibration set are (the client, or a private model's
owner): nothing is sent anywhere. The model runs in plaintext, except its non-linear nodes,
which run in CrypTen's fixed point (`mpcml.approx.fixed`) with the implementation under trial.
For each node it records the input range on the calibration set, then, most costly node first,
tries that node's implementations from the cheapest by the measured cost table
(`rounds x RTT + bytes / bandwidth` on the stated network, for a batch of `batch` rows) and keeps
the first whose change of the task's metric, with the choices already made, stays within the
budget. The metric is accuracy against the labels (or against the plaintext model's own
predictions without labels) for a classifier, the largest output error otherwise; the budget
is the largest accuracy drop, or output error, allowed.

The fixed-point guard: a node whose inputs lie where no implementation is accurate, or where
CrypTen's ring would overflow, is refused with the node and the range, rather than planned.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mpcml.approx import costs, registry
from mpcml.approx.bounds import error_bound
from mpcml.approx.fixed import Fixed
from mpcml.approx.implementations import apply
from mpcml.approx.plan import Choice
from mpcml.approx.registry import OP_FUNCTIONS
from mpcml.errors import MpcmlError
from mpcml.graph.capture import capture
from mpcml.graph.ops import SIGMOIDS, decode_attrs
from mpcml.proto.v1 import job_pb2 as jpb

MARGIN = 0.1
"""A node's calibrated range is widened by this share of its span (at least 0.5) before it is
checked against an implementation's domain: inputs at run time stray a little further. The
`margin` argument of `tune` overrides it."""
BOUNDS = (4.0, 6.0, 8.0, 12.0, 16.0)
"""The clamping bounds tried for clamped polynomials."""


class TuneError(MpcmlError, ValueError):
    """The tuner cannot plan this model on this calibration set; the message says why."""


@dataclass
class NodeRange:
    """What a non-linear node saw on the calibration set."""

    node: str
    function: str
    dim: int
    low: float = math.inf
    high: float = -math.inf
    row_max_low: float = math.inf
    """Softmax: the smallest of the rows' largest inputs."""
    elements: int = 0
    """Inputs per calibration row."""

    def widened(self, margin: float = 0.1) -> tuple[float, float]:
        """The range with `margin` times its span (at least 0.5) on both sides.

        A softmax's span is that of its rows' largest inputs. An inverse square root's inputs
        (variances) are positive and span decades: its range is widened by a factor, 1 + 2
        margin, instead.
        """
        if self.function == "rsqrt":
            factor = 1 + 2 * margin
            return self.low / factor, self.high * factor
        span = self.high - self.low
        if self.function == "softmax":  # what varies is the rows' largest inputs: those far
            span = self.high - min(self.row_max_low, self.high)  # below (masked) count for 0
        pad = max(margin * span, 0.5)
        return self.low - pad, self.high + pad

    def see(self, x: torch.Tensor) -> None:
        """Widen the range to the inputs `x` (a batch)."""
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))
        self.elements = int(x[0].numel())
        if self.function == "softmax":
            self.row_max_low = min(self.row_max_low, float(x.max(self.dim).values.min()))


@dataclass
class NodeResult:
    """The tuner's choice for one node."""

    range: NodeRange
    choice: Choice
    crypten_seconds: float
    seconds: float
    tried: int


@dataclass
class Tuned:
    """A plan, what it costs against CrypTen's choices, and what it changes."""

    plan: jpb.ApproximationPlan
    metric: str
    plaintext: float
    crypten: float
    tuned: float
    budget: float
    network: str
    parties: int
    batch: int
    nodes: list[NodeResult] = field(default_factory=list)

    @property
    def crypten_seconds(self) -> float:
        """The non-linear nodes' predicted time with CrypTen's implementations, per batch."""
        return sum(n.crypten_seconds for n in self.nodes)

    @property
    def seconds(self) -> float:
        """The same with the plan."""
        return sum(n.seconds for n in self.nodes)

    def report(self) -> str:
        """A table of the choices, the predicted costs and the metric change."""
        lines = [
            f"approximation plan for {self.parties} parties on {self.network.upper()}, "
            f"batches of {self.batch} rows",
            f"{'node':<10} {'function':<8} {'calibrated range':<20} {'choice':<54} "
            f"{'crypten ms':>10} {'plan ms':>8}",
        ]
        for n in self.nodes:
            choice = n.choice.describe().split(": ", 1)[1].split(" on [")[0]
            lines.append(
                f"{n.range.node:<10} {n.range.function:<8} "
                f"{f'[{n.range.low:.3g}, {n.range.high:.3g}]':<20} {choice:<54} "
                f"{1000 * n.crypten_seconds:>10.2f} {1000 * n.seconds:>8.2f}"
            )
        ratio = self.crypten_seconds / self.seconds if self.seconds else math.inf
        lines.append(
            f"predicted non-linear time per batch: CrypTen {1000 * self.crypten_seconds:.2f} ms, "
            f"plan {1000 * self.seconds:.2f} ms ({ratio:.2f}x cheaper)"
        )
        lines.append(
            f"{self.metric}: plaintext {self.plaintext:.4f}, CrypTen's approximations "
            f"{self.crypten:.4f}, plan {self.tuned:.4f} (budget {self.budget:g})"
        )
        return "\n".join(lines)


def _emulated(choice: Choice, x: torch.Tensor, dim: int, overflowed: set[str]) -> torch.Tensor:
    """`choice`'s function of `x` in CrypTen's fixed point; notes the node if it overflowed."""
    fixed = Fixed(x.detach().double())
    out = apply(choice.function, choice.implementation, fixed, choice.knobs, dim)
    if fixed.overflowed:
        overflowed.add(choice.node)
    result: torch.Tensor = out.v.to(x.dtype)
    return result


Runner = Callable[[Mapping[str, Choice], bool], tuple[torch.Tensor, set[str]]]
"""Runs the model on the calibration rows with `choices` (recording the ranges when asked);
returns the output and the nodes whose emulation overflowed."""


def _graph_runner(
    graph: Any, state: Mapping[str, torch.Tensor], ranges: Mapping[str, NodeRange], x: Any
) -> Runner:
    """The lowered graph in plaintext (`mpcml.graph.plain`).

    Both the parties and the tuner run the captured graph: the model's own code holds shape and
    mask arithmetic that the capture folded away.
    """
    from mpcml.graph.plain import evaluate

    def run(choices: Mapping[str, Choice], record: bool = False) -> tuple[Any, set[str]]:
        overflowed: set[str] = set()

        def hook(node: Any, function: str, value: torch.Tensor, dim: int) -> Any:
            if record:
                ranges[node.name].see(value)
            choice = choices.get(node.name)
            return None if choice is None else _emulated(choice, value, dim, overflowed)

        with torch.no_grad():
            out = evaluate(graph, state, x, hook)
        return out.reshape(-1, out.size(-1)) if out.dim() > 2 else out, overflowed

    return run


class _Task:
    """How a forward pass's outputs are scored, and what a change within budget means."""

    def __init__(self, plain: torch.Tensor, y: torch.Tensor | None, ends_in_sigmoid: bool):
        self.plain, self.y = plain, y
        self.classifier = plain.dim() == 2 and (plain.size(1) > 1 or ends_in_sigmoid)
        self.binary = self.classifier and plain.size(1) == 1
        self.metric = "accuracy" if self.classifier else "max output error"
        self.reference = self.score(plain)

    def _predict(self, out: torch.Tensor) -> torch.Tensor:
        return (out.reshape(-1) > 0.5).long() if self.binary else out.argmax(1)

    def score(self, out: torch.Tensor) -> float:
        """Accuracy (against the labels, else the plaintext predictions) or the output error."""
        if not self.classifier:
            return float((out - self.plain).abs().max())
        truth = self._predict(self.plain) if self.y is None else self.y.reshape(-1).long()
        return float((self._predict(out) == truth).double().mean())

    def change(self, out: torch.Tensor) -> float:
        """The accuracy drop, or the output error."""
        return self.reference - self.score(out) if self.classifier else self.score(out)


def _candidates(r: NodeRange, margin: float) -> Iterator[Choice]:
    """Every implementation and knob setting whose domain covers the node's widened range."""
    lo, hi = r.widened(margin)
    for name, spec in registry.SPECS[r.function].items():
        structural = [k for k in spec.knobs if k.structural]
        grids = []
        for knob in structural:
            step = 2 if knob.name == "degree" else 1
            grids.append(range(int(knob.low), int(knob.high) + 1, step))
        for combination in itertools.product(*grids):
            given: dict[str, float] = {
                k.name: float(v) for k, v in zip(structural, combination, strict=True)
            }
            for extra in _free_knobs(name, given, r, margin):
                try:
                    settings = registry.knobs(r.function, name, {**given, **extra})
                except registry.PlanError:
                    continue
                d_lo, d_hi = registry.domain(r.function, name, settings)
                if d_lo <= lo and hi <= d_hi:
                    yield Choice(r.node, r.function, name, settings, (r.low, r.high))


def _free_knobs(
    name: str, given: Mapping[str, float], r: NodeRange, margin: float
) -> Iterator[dict[str, float]]:
    """The non-structural knobs to try: bounds from the range, the softmax shift from it."""
    lo, hi = r.widened(margin)
    if name in ("poly",):
        if given.get("clip"):
            for bound in BOUNDS:
                yield {"bound": bound}
        else:
            yield {"bound": min(max(abs(lo), abs(hi)), 32.0)}
    elif name == "relu":  # gelu: the series is fitted on [0, b], b the range's reach
        yield {"bound": min(max(abs(lo), abs(hi), 2.0), 64.0)}
    elif name == "scaled":  # rsqrt: every even power of two; the domain check keeps those that fit
        for shift in range(-12, 13, 2):
            yield {"shift": float(shift)}
    elif name == "range" and r.function == "rsqrt":  # the guess is fitted to the range
        yield {"low": max(lo, 1e-4), "high": min(hi, 1e4)}
    elif name == "bounded":
        if hi - r.row_max_low <= 3.5:  # every row's largest input within 4 of the shift
            yield {"shift": hi}
    else:
        yield {}


def _cost(choice: Choice, r: NodeRange, parties: int, batch: int, network: costs.Network) -> float:
    found = costs.cost(choice.function, choice.implementation, dict(choice.knobs), parties)
    return found.seconds(r.elements * batch, network)


def tune(
    model: Any,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    budget: float = 0.01,
    network: str = "lan",
    parties: int = 3,
    batch: int = 64,
    margin: float = MARGIN,
    tolerance: float | None = None,
) -> Tuned:
    """The cheapest plan for `model` on the calibration rows `x` (labels `y`) within `budget`.

    `model`: a torch module, or an `mpcml.graph.hf.SequenceModel` whose rows `x` are token ids
    (rows x sequence) or token rows as a party shares them (`tokens.token_rows`); a
    language model's logits are scored as next-token predictions, against the plaintext
    model's own without labels.

    `margin`: how far beyond the calibrated range (a share of its span) the plan must hold;
    a training job, whose inputs drift as the weights change, wants more than the default.
    `tolerance`: also keep only implementations whose error bound (`mpcml.approx.bounds`) is
    at most this: a training job's metric at its initial weights says little, so its plan
    should hold the functions themselves close.
    """
    if network not in costs.NETWORKS:
        raise TuneError(f"network {network!r} is not one of {', '.join(costs.NETWORKS)}")
    from mpcml.graph.hf import SequenceModel
    from mpcml.graph.hf import trace as trace_sequence

    if isinstance(model, SequenceModel):
        graph = trace_sequence(model)
    else:
        graph = capture(model, tuple(torch.as_tensor(x).shape[1:]))
    ranges: dict[str, NodeRange] = {}
    for node in graph.nodes:
        if node.op in OP_FUNCTIONS:
            dim = int(decode_attrs(node).get("dim", -1))
            ranges[node.name] = NodeRange(node.name, OP_FUNCTIONS[node.op], dim)
    if isinstance(model, SequenceModel) and torch.as_tensor(x).dim() == 2:  # token ids
        from mpcml.graph.tokens import token_rows, token_vocab

        vocab = token_vocab(graph)
        assert vocab is not None
        x = torch.from_numpy(token_rows(torch.as_tensor(x).numpy(), None, vocab))
    x = torch.as_tensor(x, dtype=torch.float32)
    state = (model.model if isinstance(model, SequenceModel) else model).state_dict()
    run = _graph_runner(graph, state, ranges, x)
    plain, _ = run({}, True)  # plaintext: the ranges
    crypten_out, _ = run({n: Choice(n, r.function) for n, r in ranges.items()}, False)
    ends_in_sigmoid = bool(graph.nodes) and graph.nodes[-1].op in SIGMOIDS
    task = _Task(plain, y, ends_in_sigmoid)
    net = costs.NETWORKS[network]
    options: dict[str, list[tuple[float, Choice]]] = {}
    results: dict[str, NodeResult] = {}
    for name, r in ranges.items():
        options[name] = sorted(
            (
                (_cost(c, r, parties, batch, net), c)
                for c in _candidates(r, margin)
                if c.is_crypten
                or tolerance is None
                or error_bound(c.function, c.implementation, c.knobs) <= tolerance
            ),
            key=lambda p: p[0],
        )
        _guard(r, options[name])
        crypten = Choice(name, r.function, calibrated=(r.low, r.high))
        base = _cost(crypten, r, parties, batch, net)
        results[name] = NodeResult(r, crypten, base, base, 0)
    chosen: dict[str, Choice] = {}
    for name in sorted(results, key=lambda n: -results[n].crypten_seconds):
        result = results[name]
        for seconds, candidate in options[name]:
            if candidate.is_crypten:  # the rest cost more than CrypTen's own
                chosen[name] = result.choice = candidate
                result.seconds = seconds
                break
            result.tried += 1
            out, overflowed = run({**chosen, name: candidate}, False)
            if overflowed or task.change(out) > budget:
                continue
            chosen[name] = result.choice = candidate
            result.seconds = seconds
            break
        else:
            raise TuneError(
                f"node {name!r} ({result.range.function}): no implementation stays within the "
                f"budget {budget:g} on inputs in [{result.range.low:.4g}, {result.range.high:.4g}]"
                ", and CrypTen's own is not accurate there"
            )
    tuned_out, _ = run(chosen, False)
    plan = jpb.ApproximationPlan(source="auto")
    for name, choice in chosen.items():
        entry = plan.nodes[name]
        entry.implementation = choice.implementation
        for key, value in choice.knobs.items():
            entry.knobs[key] = value
        entry.calibrated, entry.low, entry.high = True, ranges[name].low, ranges[name].high
    return Tuned(
        plan=plan,
        metric=task.metric,
        plaintext=task.reference,
        crypten=task.score(crypten_out),
        tuned=task.score(tuned_out),
        budget=budget,
        network=network,
        parties=parties,
        batch=batch,
        nodes=list(results.values()),
    )


def _guard(r: NodeRange, options: list[tuple[float, Choice]]) -> None:
    """Refuse a node that no implementation can compute on its calibrated range."""
    if options:
        return
    domains = []
    for name in registry.SPECS[r.function]:
        settings = registry.knobs(r.function, name, {})
        lo, hi = registry.domain(r.function, name, settings)
        domains.append(f"{name} [{lo:.4g}, {hi:.4g}]")
    raise TuneError(
        f"node {r.node!r} ({r.function}) sees inputs in [{r.low:.4g}, {r.high:.4g}] on the "
        f"calibration set, outside where any implementation is accurate and CrypTen's "
        f"fixed-point ring (16 fractional bits) does not overflow ({'; '.join(domains)}): "
        "rescale the model's inputs or weights"
    )
