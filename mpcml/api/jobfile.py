"""The job file (`mpcml job submit FILE`): TOML, checked against `jobfile.schema.json`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import torch

from mpcml.api import plans
from mpcml.api.job import Job, JobSpecError
from mpcml.approx.registry import PlanError
from mpcml.config import read_toml
from mpcml.errors import MpcmlError

SCHEMA_PATH = Path(__file__).with_name("jobfile.schema.json")


class JobFileError(MpcmlError, ValueError):
    """A job file is unreadable, does not match the schema, or names a model that does not load."""


def schema() -> dict[str, Any]:
    """The job file's JSON Schema, with the Hugging Face classes from their one list."""
    from mpcml.graph.hf import CLASSES

    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    data["properties"]["model"]["properties"]["transformers"]["enum"] = list(CLASSES)
    return data


def _model_class(ref: str, base: Path) -> Any:
    module_name, _, cls = ref.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = (base / module_name).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise JobFileError(f"model: no Python file {str(path)!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules.setdefault(path.stem, module)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise JobFileError(f"model: cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, cls)
    except AttributeError:
        raise JobFileError(f"model: {module_name!r} has no {cls!r}") from None


def load(path: str | Path) -> tuple[Job, str]:
    """The job a file describes, and its idempotency key ("" when it names none)."""
    path = Path(path)
    data = read_toml(path, "the job file", JobFileError)
    errors = sorted(
        jsonschema.Draft202012Validator(schema()).iter_errors(data), key=lambda e: list(e.path)
    )
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(top level)"
        raise JobFileError(f"{path}: {where}: {first.message}")
    job = _job(data, path.resolve().parent)
    if "insecure_provider" in data:
        job = job.with_insecure_provider(data["insecure_provider"])
    return job, str(data.get("idempotency_key", ""))


def model_of(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """The torch model a job file names (constructed, untrained), and its [weights] table."""
    path = Path(path)
    data = read_toml(path, "the job file", JobFileError)
    if "model" not in data:
        raise JobFileError(f"{path}: the job file names no [model] to tune")
    return _model(data["model"], path.resolve().parent), dict(data.get("weights", {}))


def _model(table: dict[str, Any], base: Path) -> Any:
    """The [model] table's model: a torch module, or a Hugging Face `SequenceModel`."""
    if "transformers" in table:
        from mpcml.graph import hf
        from mpcml.graph.ops import GraphError

        try:
            config = hf.read_config(base / table["config"])
            model = hf.from_config(table["transformers"], config)
        except GraphError as exc:
            raise JobFileError(f"model: {exc}") from None
        return hf.SequenceModel(model, int(table["sequence"]))
    cls = _model_class(table["python"], base)
    try:
        return cls(**table.get("args", {}))
    except TypeError as exc:
        raise JobFileError(f"model: {exc}") from None


def _approximations(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """`approximations` (and, for "auto", the calibration set of [tune]) as `Job` takes them."""
    value = data.get("approximations")
    tune = data.get("tune")
    if value == "auto":
        if tune is None:
            raise JobFileError('approximations = "auto" needs a [tune] table with `calibration`')
        path = base / tune["calibration"]
        try:
            with np.load(path) as arrays:
                x = torch.from_numpy(arrays["x"]).float()
                y = torch.from_numpy(arrays["y"]) if "y" in arrays else None
        except (OSError, KeyError, ValueError) as exc:
            raise JobFileError(
                f"tune.calibration: cannot read rows `x` from {str(path)!r}: {exc}"
            ) from None
        calibration = x if y is None else (x, y)
        return {
            "approximations": "auto",
            "calibration": calibration,
            "budget": float(tune.get("budget", 0.01)),
        }
    if tune is not None:
        raise JobFileError('[tune] goes with approximations = "auto"')
    if isinstance(value, str) and value != "crypten":
        try:
            return {"approximations": plans.read(base / value)}
        except PlanError as exc:
            raise JobFileError(f"approximations: {exc}") from None
    return {"approximations": value}


def _job(data: dict[str, Any], base: Path) -> Job:
    model = _model(data["model"], base) if "model" in data else None
    weights = data.get("weights", {})
    private = weights.get("private")
    common: dict[str, Any] = {
        **_approximations(data, base),
        "reveal": data.get("reveal"),
        "split": data.get("split", "vertical"),
        "align_on": data.get("align_on", ""),
        "name": data.get("name", ""),
        "from_job": weights.get("from_job"),
        "weights": {private["party"]: private["model"]} if private else None,
        "input_shape": data.get("model", {}).get("input_shape"),
    }
    task = data["task"]
    try:
        if task == "train":
            if model is None and not common["from_job"]:
                raise JobFileError("a train job needs [model]")
            t = data.get("train", {})
            return Job.train(
                model,
                data["features"],
                data.get("labels", {}),
                epochs=t.get("epochs", 1),
                lr=t.get("learning_rate", 0.1),
                batch_size=t.get("batch_size", 64),
                momentum=t.get("momentum", 0.0),
                weight_decay=t.get("weight_decay", 0.0),
                loss=t.get("loss", "bce"),
                batches_per_round=t.get("batches_per_round", 0),
                shuffle=t.get("shuffle", False),
                shuffle_seed=t.get("shuffle_seed", 0),
                crypten_loss=t.get("crypten_loss", False),
                trainable=t.get("trainable", []),
                seed=weights.get("init_seed", 0),
                **common,
            )
        if "train" in data:
            raise JobFileError(f"a {task} job takes no [train] table")
        if task == "infer":
            return Job.infer(
                data["features"], model=model, batch_size=data.get("batch_size", 128), **common
            )
        return Job.evaluate(
            data["features"],
            data.get("labels", {}),
            loss=data.get("loss", "bce"),
            model=model,
            batch_size=data.get("batch_size", 128),
            **common,
        )
    except JobSpecError as exc:
        raise JobFileError(str(exc)) from None
