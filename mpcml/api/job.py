"""`Job`: a job spec built from Python values, with the model captured on the client.

A torch model is captured (`mpcml.graph.capture`) for the shape of the job's input rows: the
`input_shape` given, the calibration rows' shape, or else, at submission, the shape the
feature datasets were registered with (`Client.submit` asks the coordinator).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from mpcml.api.plans import Approximations, plan_of
from mpcml.errors import MpcmlError
from mpcml.proto.v1 import graph_pb2 as gpb
from mpcml.proto.v1 import job_pb2 as jpb

Binding = str | tuple[str, Sequence[str]] | Mapping[str, Any]
"""A party's data: "dataset", ("dataset", ["col", ...]) or {"dataset": ..., "columns": [...]}."""

LOSSES = {"bce": jpb.LOSS_BCE, "cross_entropy": jpb.LOSS_CROSS_ENTROPY, "mse": jpb.LOSS_MSE}
OUTPUTS = {
    "weights": jpb.OUTPUT_WEIGHTS,
    "predictions": jpb.OUTPUT_PREDICTIONS,
    "metrics": jpb.OUTPUT_METRICS,
}
SPLITS = {"vertical": jpb.SPLIT_VERTICAL, "horizontal": jpb.SPLIT_HORIZONTAL}


class JobSpecError(MpcmlError, ValueError):
    """A job could not be put together from the values given; the message says which."""


T = TypeVar("T")


def _choice(table: Mapping[str, T], value: str, what: str) -> T:
    try:
        return table[value]
    except KeyError:
        raise JobSpecError(f"unknown {what} {value!r}; choose one of {', '.join(table)}") from None


def _bindings(parties: Mapping[str, Binding] | None, what: str) -> list[jpb.DataBinding]:
    out = []
    for party, value in (parties or {}).items():
        if isinstance(value, str):
            out.append(jpb.DataBinding(party=party, dataset=value))
        elif isinstance(value, Mapping):
            out.append(
                jpb.DataBinding(
                    party=party,
                    dataset=str(value.get("dataset", "")),
                    columns=list(value.get("columns", [])),
                )
            )
        elif isinstance(value, tuple) and len(value) == 2:
            out.append(jpb.DataBinding(party=party, dataset=value[0], columns=list(value[1])))
        else:
            raise JobSpecError(f"{what} of {party!r}: {value!r} is not a dataset name")
        if not out[-1].dataset:
            raise JobSpecError(f"{what} of {party!r} name no dataset")
    return out


def _graph(model: Any, input_shape: Sequence[int] | None) -> gpb.Graph | None:
    """The model's graph; None while the input shape is unknown (captured at submission)."""
    if isinstance(model, gpb.Graph):
        return model
    from mpcml.graph.hf import SequenceModel, from_directory, is_transformers_model
    from mpcml.graph.hf import trace as trace_sequence

    if isinstance(model, SequenceModel):
        return trace_sequence(model)
    if input_shape is None:
        return None
    if isinstance(model, (str, os.PathLike)):  # a Hugging Face `save_pretrained` directory
        model = from_directory(os.fspath(model))
    if is_transformers_model(model):
        # Unwrapped: its rows are token ids (a dataset's `array`), one per position.
        if len(input_shape) != 1:
            raise JobSpecError(
                f"the {type(model).__name__} reads rows of token ids, one per position; the "
                f"input rows have shape {list(input_shape)}"
            )
        return trace_sequence(SequenceModel(model, int(input_shape[0])))
    from mpcml.graph.capture import capture

    return capture(model, tuple(int(d) for d in input_shape))


def row_shape(spec: jpb.JobSpec, parties: Sequence[Any]) -> tuple[int, ...]:
    """The shape of one input row of `spec`, from the datasets the parties registered."""
    catalogue = {(p.name, d.name): d for p in parties for d in p.datasets}
    shapes = []
    for binding in spec.features:
        info = catalogue.get((binding.party, binding.dataset))
        if info is None:
            raise JobSpecError(
                f"party {binding.party!r} has registered no dataset {binding.dataset!r}: the "
                "model cannot be captured for its rows (or pass input_shape=)"
            )
        shapes.append((len(binding.columns),) if binding.columns else tuple(info.row_shape))
    if spec.split == jpb.SPLIT_VERTICAL and len(shapes) > 1:
        return (sum(s[0] for s in shapes),)
    return shapes[0]


def _plan(
    value: Approximations,
    model: Any,
    spec: jpb.JobSpec,
    seed: int,
    calibration: Any,
    budget: float,
) -> jpb.ApproximationPlan:
    """The plan `value` names; "auto" runs the tuner here on `calibration`."""
    from mpcml.approx.registry import PlanError

    if value != "auto":
        try:
            return plan_of(value)
        except PlanError as exc:
            raise JobSpecError(str(exc)) from None
    if calibration is None or model is None or isinstance(model, gpb.Graph):
        raise JobSpecError(
            'approximations="auto" needs the model (a torch module) and calibration= '
            "(rows, or (rows, labels)): the tuner runs here, on them"
        )
    import copy

    import torch

    from mpcml.api.tune import tune
    from mpcml.graph.init import initial_state

    tuned_model = copy.deepcopy(model)
    if spec.task == jpb.TASK_TRAIN and spec.weights.WhichOneof("source") == "init_seed":
        tuned_model.load_state_dict(initial_state(spec.graph, seed))
    x, y = calibration if isinstance(calibration, tuple) else (calibration, None)
    labels = None if y is None else torch.as_tensor(y)
    return tune(tuned_model, torch.as_tensor(x), labels, budget=budget).plan


@dataclass(frozen=True)
class Job:
    """A job ready to submit; build one with `train`, `infer` or `evaluate`."""

    spec: jpb.JobSpec
    model: Any = field(default=None, compare=False, repr=False)
    """A torch model still to capture, once the input rows' shape is known (at submission)."""

    def captured(self, input_shape: Sequence[int]) -> Job:
        """The job with its model captured for rows of `input_shape`."""
        if self.model is None:
            return self
        spec = jpb.JobSpec.FromString(self.spec.SerializeToString())
        graph = _graph(self.model, input_shape)
        assert graph is not None
        spec.graph.CopyFrom(graph)
        return Job(spec)

    @classmethod
    def _made(cls, spec: jpb.JobSpec, model: Any) -> Job:
        pending = model is not None and not spec.graph.nodes
        return cls(spec, model if pending else None)

    def with_insecure_provider(self, provider: str = "tfp") -> Job:
        """The same job on CrypTen's TFP provider instead of the dealer.

        Party 0 can then recover every other party's inputs: for debugging only, and every
        status of the job says so.
        """
        spec = jpb.JobSpec.FromString(self.spec.SerializeToString())
        spec.insecure_provider = provider
        return replace(self, spec=spec)

    @staticmethod
    def _spec(
        task: jpb.Task,
        model: Any,
        features: Mapping[str, Binding],
        labels: Mapping[str, Binding] | None,
        weights: Mapping[str, str] | None,
        from_job: str | None,
        seed: int,
        reveal: Mapping[str, Sequence[str]] | None,
        split: str,
        align_on: str,
        name: str,
        approximations: Approximations = None,
        calibration: Any = None,
        budget: float = 0.01,
        input_shape: Sequence[int] | None = None,
    ) -> jpb.JobSpec:
        spec = jpb.JobSpec(
            name=name,
            task=task,
            features=_bindings(features, "features"),
            labels=_bindings(labels, "labels"),
            split=_choice(SPLITS, split, "split"),
            align_on=align_on,
        )
        if input_shape is None and calibration is not None:
            rows = calibration[0] if isinstance(calibration, tuple) else calibration
            input_shape = tuple(rows.shape[1:])
        graph = _graph(model, input_shape) if model is not None else None
        if graph is not None:
            spec.graph.CopyFrom(graph)
        if from_job and weights:
            raise JobSpecError("give either weights (a private model) or from_job, not both")
        if from_job:
            spec.weights.from_job = from_job
        elif weights:
            if len(weights) != 1:
                raise JobSpecError(f"private weights have one owner, got {sorted(weights)}")
            (party, model_name), *_ = weights.items()
            spec.weights.private.CopyFrom(jpb.PrivateWeights(party=party, model=model_name))
        else:
            spec.weights.init_seed = seed
        for output, who in (reveal or {}).items():
            if isinstance(who, str):
                raise JobSpecError(f"reveal[{output!r}] must be a list of recipients")
            spec.reveal.append(
                jpb.Reveal(output=_choice(OUTPUTS, output, "output"), recipients=list(who))
            )
        spec.approximations.CopyFrom(_plan(approximations, model, spec, seed, calibration, budget))
        return spec

    @classmethod
    def train(
        cls,
        model: Any = None,
        features: Mapping[str, Binding] | None = None,
        labels: Mapping[str, Binding] | None = None,
        *,
        epochs: int = 1,
        lr: float = 0.1,
        batch_size: int = 64,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        loss: str = "bce",
        batches_per_round: int = 0,
        shuffle: bool = False,
        shuffle_seed: int = 0,
        crypten_loss: bool = False,
        trainable: Sequence[str] = (),
        seed: int = 0,
        weights: Mapping[str, str] | None = None,
        from_job: str | None = None,
        reveal: Mapping[str, Sequence[str]] | None = None,
        split: str = "vertical",
        align_on: str = "",
        name: str = "",
        approximations: Approximations = None,
        calibration: Any = None,
        budget: float = 0.01,
        input_shape: Sequence[int] | None = None,
    ) -> Job:
        """Train `model` (a torch.nn.Module, captured here with torch.export).

        The capture needs the input rows' shape: `input_shape`, the calibration rows', or (left
        out) the registered shape of the feature datasets, looked up when the job is submitted.

        Initial weights come from `seed` (`mpcml.graph.init.initial_state`), a party's private
        model (`weights`), or an earlier job (`from_job`, which also gives the model: `model`
        may then be left out). `crypten_loss` trains through
        CrypTen's loss and autograd instead of the exact fused gradient (`HyperParameters`).
        `trainable` fine-tunes: only the parameters of these modules (paths in the model, e.g.
        a Hugging Face classifier's "classifier") train; the rest stay as loaded.

        `approximations` (every task): "crypten" (the default), "auto" (the tuner picks the
        cheapest plan within `budget` on `calibration` rows, or (rows, labels), here), a plan
        file, a table as in one, or a plan (`mpcml.approx`, docs/approximations.md).
        """
        if model is None and not from_job:
            raise JobSpecError("a train job needs a model, or from_job to go on training one")
        if not features or not labels:
            raise JobSpecError("a train job needs features and labels")
        spec = cls._spec(
            jpb.TASK_TRAIN,
            model,
            features,
            labels,
            weights,
            from_job,
            seed,
            reveal,
            split,
            align_on,
            name,
            approximations,
            calibration,
            budget,
            input_shape,
        )
        spec.hyper.CopyFrom(
            jpb.HyperParameters(
                epochs=epochs,
                batch_size=batch_size,
                learning_rate=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                loss=_choice(LOSSES, loss, "loss"),
                batches_per_round=batches_per_round,
                shuffle=shuffle,
                shuffle_seed=shuffle_seed,
                crypten_loss=crypten_loss,
                trainable=list(trainable),
            )
        )
        return cls._made(spec, model)

    @classmethod
    def infer(
        cls,
        features: Mapping[str, Binding],
        *,
        model: Any = None,
        weights: Mapping[str, str] | None = None,
        from_job: str | None = None,
        reveal: Mapping[str, Sequence[str]] | None = None,
        batch_size: int = 128,
        split: str = "vertical",
        align_on: str = "",
        name: str = "",
        approximations: Approximations = None,
        calibration: Any = None,
        budget: float = 0.01,
        input_shape: Sequence[int] | None = None,
    ) -> Job:
        """Run a model on the features; predictions go only to `reveal["predictions"]`.

        The model is a private one (`weights={"owner": "model"}`) or a trained, still shared
        one (`from_job=ID`).
        """
        spec = cls._spec(
            jpb.TASK_INFER,
            model,
            features,
            None,
            weights,
            from_job,
            0,
            reveal,
            split,
            align_on,
            name,
            approximations,
            calibration,
            budget,
            input_shape,
        )
        spec.hyper.batch_size = batch_size
        return cls._made(spec, model)

    @classmethod
    def evaluate(
        cls,
        features: Mapping[str, Binding],
        labels: Mapping[str, Binding],
        *,
        loss: str = "bce",
        model: Any = None,
        weights: Mapping[str, str] | None = None,
        from_job: str | None = None,
        reveal: Mapping[str, Sequence[str]] | None = None,
        batch_size: int = 128,
        split: str = "vertical",
        align_on: str = "",
        name: str = "",
        approximations: Approximations = None,
        calibration: Any = None,
        budget: float = 0.01,
        input_shape: Sequence[int] | None = None,
    ) -> Job:
        """Loss and accuracy of a model on labelled rows, revealed per `reveal["metrics"]`."""
        spec = cls._spec(
            jpb.TASK_EVALUATE,
            model,
            features,
            labels,
            weights,
            from_job,
            0,
            reveal,
            split,
            align_on,
            name,
            approximations,
            calibration,
            budget,
            input_shape,
        )
        spec.hyper.batch_size = batch_size
        spec.hyper.loss = _choice(LOSSES, loss, "loss")
        return cls._made(spec, model)
