"""Refuse, at submission, a job that cannot run: every message names the problem.

The checks use only what the parties published when they registered (dataset names, columns,
row counts, model names), so nothing private is needed to refuse a bad job before it starts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from mpcml.approx.plan import resolve
from mpcml.approx.registry import PlanError
from mpcml.errors import MpcmlError
from mpcml.graph.ops import GraphError
from mpcml.graph.ops import validate as check_graph
from mpcml.graph.opspec import parameter_key
from mpcml.graph.shapes import infer_shapes
from mpcml.graph.tokens import input_shape
from mpcml.jobs.spec import COORDINATOR, RoundPlan, parties_in_order, round_plan
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb


class SpecError(MpcmlError, ValueError):
    """A job spec was refused.

    `precondition` marks refusals that depend on the system's current state (a party not
    registered) rather than on the spec itself.
    """

    def __init__(self, message: str, precondition: bool = False) -> None:
        super().__init__(message)
        self.precondition = precondition


def _dataset(
    binding: jpb.DataBinding, parties: Mapping[str, cpb.AttachRequest], role: str
) -> cpb.DatasetInfo:
    party = parties[binding.party]
    for info in party.datasets:
        if info.name == binding.dataset:
            break
    else:
        names = ", ".join(sorted(d.name for d in party.datasets)) or "none"
        raise SpecError(
            f"{role}: party {binding.party!r} has no dataset {binding.dataset!r} "
            f"(its catalogue: {names})"
        )
    unknown = [c for c in binding.columns if c not in info.columns]
    if unknown:
        named = ", ".join(repr(c) for c in unknown)
        raise SpecError(
            f"{role}: dataset {binding.dataset!r} of party {binding.party!r} has no column"
            f"{'s' if len(unknown) > 1 else ''} {named} (columns: {', '.join(info.columns)})"
        )
    return info


def _row_shape(binding: jpb.DataBinding, info: cpb.DatasetInfo) -> tuple[int, ...]:
    if binding.columns:
        if len(info.row_shape) != 1:
            raise SpecError(
                f"dataset {binding.dataset!r} of party {binding.party!r} is not a table: "
                "its columns cannot be selected"
            )
        return (len(binding.columns),)
    return tuple(info.row_shape)


def _check_parties(
    spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest], roster: Collection[str]
) -> list[str]:
    order = parties_in_order(spec)
    if len(order) < 2:
        raise SpecError(f"a job needs at least two parties, this one names {order}")
    if len(set(order)) != len(order):
        raise SpecError(f"the job's parties repeat a name: {order}")
    for name in order:
        if roster and name not in roster:
            raise SpecError(f"unknown party {name!r} (known parties: {', '.join(sorted(roster))})")
        if name not in parties:
            registered = ", ".join(sorted(parties)) or "none"
            raise SpecError(
                f"party {name!r} is not registered with the coordinator (registered: {registered})",
                precondition=True,
            )
    named = {b.party for b in [*spec.features, *spec.labels]}
    if named - set(order):
        raise SpecError(f"parties {sorted(named - set(order))} are bound but not in `parties`")
    return order


def _check_features(
    spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest]
) -> tuple[int, tuple[int, ...]]:
    """Rows and the shape of one input row."""
    if not spec.features:
        raise SpecError("the job binds no features")
    infos = [(b, _dataset(b, parties, "features")) for b in spec.features]
    if spec.align_on:
        for b, info in infos:
            if info.id_column != spec.align_on:
                raise SpecError(
                    f"the job aligns rows on {spec.align_on!r}, but dataset {b.dataset!r} of "
                    f"party {b.party!r} has id column {info.id_column or 'none'!r}"
                )
    shapes = [_row_shape(b, info) for b, info in infos]
    if spec.split == jpb.SPLIT_HORIZONTAL:
        for (b, _), shape in zip(infos, shapes, strict=True):
            if shape != shapes[0]:
                raise SpecError(
                    f"horizontal split: dataset {b.dataset!r} of party {b.party!r} has rows of "
                    f"shape {list(shape)}, {infos[0][0].party!r}'s have {list(shapes[0])}"
                )
        return sum(info.rows for _, info in infos), shapes[0]
    first_binding, first = infos[0]
    if len(shapes) > 1 and any(len(s) != 1 for s in shapes):
        raise SpecError("vertical split: every feature dataset must be a table (1-D rows)")
    width = (sum(s[0] for s in shapes),) if len(shapes) > 1 else shapes[0]
    if spec.align_on:  # the parties find the rows they share (PSI): at most the fewest
        return min(info.rows for _, info in infos), width
    for b, info in infos[1:]:
        if info.rows != first.rows:
            raise SpecError(
                f"vertical split: dataset {b.dataset!r} of party {b.party!r} has {info.rows} "
                f"rows, {first_binding.dataset!r} of {first_binding.party!r} has {first.rows}"
            )
    return first.rows, width


def _check_labels(
    spec: jpb.JobSpec,
    parties: Mapping[str, cpb.AttachRequest],
    rows: int,
    output: tuple[int, ...],
) -> None:
    if spec.task == jpb.TASK_INFER:
        if spec.labels:
            raise SpecError("an infer job takes no labels")
        return
    if not spec.labels:
        raise SpecError(f"a {jpb.Task.Name(spec.task).lower()[5:]} job needs labels")
    if spec.hyper.loss == jpb.LOSS_UNSPECIFIED:
        raise SpecError("the job names no loss (bce, cross_entropy or mse)")
    infos = [(b, _dataset(b, parties, "labels")) for b in spec.labels]
    if spec.split == jpb.SPLIT_HORIZONTAL:
        if [b.party for b in spec.labels] != [b.party for b in spec.features]:
            raise SpecError("horizontal split: each feature party binds its own labels, in order")
        for (lb, li), fb in zip(infos, spec.features, strict=True):
            frows = next(d.rows for d in parties[fb.party].datasets if d.name == fb.dataset)
            if li.rows != frows:
                raise SpecError(
                    f"labels {lb.dataset!r} of party {lb.party!r} have {li.rows} rows, its "
                    f"features {fb.dataset!r} have {frows}"
                )
    else:
        if len(infos) != 1:
            raise SpecError("vertical split: exactly one party binds the labels")
        lb, li = infos[0]
        if li.rows != rows and not spec.align_on:  # with align_on, PSI finds the shared rows
            raise SpecError(
                f"labels {lb.dataset!r} of party {lb.party!r} have {li.rows} rows, "
                f"the features have {rows}"
            )
        if spec.align_on and li.id_column != spec.align_on:
            raise SpecError(
                f"the job aligns rows on {spec.align_on!r}, but labels {lb.dataset!r} of party "
                f"{lb.party!r} have id column {li.id_column or 'none'!r}"
            )
    lb, li = infos[0]
    width = math.prod(_row_shape(lb, li))
    loss = spec.hyper.loss
    if loss in (jpb.LOSS_BCE, jpb.LOSS_CROSS_ENTROPY) and width != 1:
        raise SpecError(f"{jpb.Loss.Name(loss)} needs one label column, got {width}")
    if loss == jpb.LOSS_BCE and output != (1,):
        raise SpecError(
            f"binary cross-entropy needs a model output of shape [1], got {list(output)}"
        )
    if loss == jpb.LOSS_CROSS_ENTROPY and len(output) != 1:
        raise SpecError(f"cross-entropy needs 1-D logits per row, got shape {list(output)}")
    if loss == jpb.LOSS_MSE and math.prod(output) != width:
        raise SpecError(f"MSE: the model outputs {list(output)} per row, the labels {width} values")


def _check_weights(spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest]) -> None:
    source = spec.weights.WhichOneof("source")
    if source is None:
        raise SpecError("the job says nowhere where its weights come from")
    if source == "init_seed" and spec.task != jpb.TASK_TRAIN:
        raise SpecError("an infer or evaluate job needs trained weights: private or from_job")
    if source == "private":
        owner = spec.weights.private
        if owner.party not in parties_in_order(spec):
            raise SpecError(f"the weights' owner {owner.party!r} is not a party of the job")
        if owner.model not in parties[owner.party].models:
            models = ", ".join(parties[owner.party].models) or "none"
            raise SpecError(
                f"party {owner.party!r} has no model {owner.model!r} (its models: {models})"
            )
        info = next((m for m in parties[owner.party].model_info if m.name == owner.model), None)
        if info is None:
            raise SpecError(
                f"party {owner.party!r} registered no description of its model {owner.model!r}"
            )
        if owner.commitment and owner.commitment != info.commitment:
            raise SpecError(
                f"the job pins model {owner.model!r} of party {owner.party!r} to "
                f"{owner.commitment}, and its weights are now {info.commitment}"
            )
        _check_keys(spec, owner, info)


def _check_keys(spec: jpb.JobSpec, owner: jpb.PrivateWeights, info: cpb.ModelInfo) -> None:
    """A private model must hold every parameter of the graph, in the graph's shape."""
    held = {p.name: list(p.shape) for p in info.parameters}
    wanted = {
        parameter_key(node.module, p.name): list(p.shape)
        for node in spec.graph.nodes
        for p in node.parameters
    }
    missing = sorted(set(wanted) - set(held))
    if missing:
        extra = sorted(set(held) - set(wanted))

        def listed(keys: list[str]) -> str:
            return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")

        raise SpecError(
            f"model {owner.model!r} of party {owner.party!r} does not fit the job's graph: it "
            f"lacks {listed(missing)}"
            + (f"; it has keys the graph does not use: {listed(extra)}" if extra else "")
        )
    for key, shape in wanted.items():
        if held[key] != shape:
            raise SpecError(
                f"model {owner.model!r} of party {owner.party!r}: {key!r} has shape {held[key]}, "
                f"the graph's is {shape}"
            )


def binding_rows(
    spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest]
) -> tuple[list[int], list[int]]:
    """The registered rows of each features and labels binding, in binding order.

    For a spec `validate` passed: every binding names a registered dataset.
    """
    return (
        [int(_dataset(b, parties, "features").rows) for b in spec.features],
        [int(_dataset(b, parties, "labels").rows) for b in spec.labels],
    )


def pin_weights(spec: jpb.JobSpec, parties: Mapping[str, cpb.AttachRequest]) -> None:
    """Fill in a private model's commitment from its owner's registration, where it is empty."""
    if spec.weights.WhichOneof("source") != "private":
        return
    owner = spec.weights.private
    link = parties.get(owner.party)
    if owner.commitment or link is None:
        return
    for info in link.model_info:
        if info.name == owner.model:
            owner.commitment = info.commitment


def _check_hyper(spec: jpb.JobSpec) -> None:
    h = spec.hyper
    if spec.task != jpb.TASK_TRAIN:
        if h.trainable:
            raise SpecError("trainable is for train jobs")
        return
    if h.epochs < 1:
        raise SpecError(f"epochs must be at least 1, got {h.epochs}")
    if not h.learning_rate > 0 or not math.isfinite(h.learning_rate):
        raise SpecError(f"the learning rate must be positive, got {h.learning_rate}")
    modules = {n.module for n in spec.graph.nodes if n.parameters}
    for prefix in h.trainable:
        if not any(m == prefix or m.startswith(prefix + ".") for m in modules):
            raise SpecError(
                f"trainable names {prefix!r}, which holds no parameter of the model (its "
                f"modules: {', '.join(sorted(modules)[:8])}{', ...' if len(modules) > 8 else ''})"
            )
    if not 0 <= h.momentum < 1:
        raise SpecError(f"momentum must be in [0, 1), got {h.momentum}")
    if not h.weight_decay >= 0:
        raise SpecError(f"weight decay must not be negative, got {h.weight_decay}")


_ALLOWED = {
    jpb.TASK_TRAIN: {jpb.OUTPUT_WEIGHTS, jpb.OUTPUT_METRICS},
    jpb.TASK_INFER: {jpb.OUTPUT_PREDICTIONS},
    jpb.TASK_EVALUATE: {jpb.OUTPUT_METRICS, jpb.OUTPUT_PREDICTIONS},
}


def _check_reveal(spec: jpb.JobSpec, order: list[str]) -> None:
    for reveal in spec.reveal:
        name = jpb.Output.Name(reveal.output)
        if reveal.output not in _ALLOWED[spec.task]:
            raise SpecError(f"a {jpb.Task.Name(spec.task)} job has no output {name} to reveal")
        for who in reveal.recipients:
            if who == COORDINATOR and reveal.output != jpb.OUTPUT_METRICS:
                raise SpecError(f"only metrics may be revealed to the coordinator, not {name}")
            if who != COORDINATOR and who not in order:
                raise SpecError(f"{name} would be revealed to {who!r}, not a party of the job")


def validate(
    spec: jpb.JobSpec,
    parties: Mapping[str, cpb.AttachRequest],
    roster: Collection[str] = (),
) -> RoundPlan:
    """Check `spec` against the registered parties; returns its round plan."""
    if spec.insecure_provider not in ("", "tfp"):
        raise SpecError(
            f"insecure_provider {spec.insecure_provider!r} is not known; the only one is 'tfp'"
        )
    if spec.task == jpb.TASK_UNSPECIFIED:
        raise SpecError("the job names no task (train, infer or evaluate)")
    if spec.split == jpb.SPLIT_UNSPECIFIED:
        raise SpecError("the job names no split (vertical or horizontal)")
    if not spec.graph.nodes:
        raise SpecError("the job has no model graph")
    try:
        check_graph(spec.graph)
    except GraphError as exc:
        raise SpecError(f"the model graph is refused: {exc}") from None
    order = _check_parties(spec, parties, roster)
    rows, row_shape = _check_features(spec, parties)
    if rows == 0:
        raise SpecError("the job's features have no rows")
    try:
        output = infer_shapes(spec.graph, input_shape(spec.graph, row_shape))
    except GraphError as exc:
        raise SpecError(
            f"the model does not fit the data (rows of shape {list(row_shape)}): {exc}"
        ) from None
    try:
        resolve(spec.approximations, spec.graph)
    except PlanError as exc:
        raise SpecError(str(exc)) from None
    _check_labels(spec, parties, rows, output)
    _check_weights(spec, parties)
    _check_hyper(spec)
    _check_reveal(spec, order)
    return round_plan(spec, rows)
