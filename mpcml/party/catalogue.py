"""A party's private datasets and models.

What the party tells the coordinator (names, columns, row counts; a model's tensor shapes and
its commitment), and what its worker loads (the values, which never leave the party
unencrypted).
"""

from __future__ import annotations

import csv
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpcml.errors import MpcmlError
from mpcml.graph.digest import weights_commitment
from mpcml.party.config import DatasetEntry
from mpcml.proto.v1 import coordinator_pb2 as cpb


class DataError(MpcmlError, ValueError):
    """A dataset is missing, unreadable or does not match the job; the message names it."""


@dataclass(frozen=True)
class Table:
    """A loaded dataset: one row per sample, the id column apart."""

    columns: list[str]
    values: np.ndarray
    ids: np.ndarray | None
    mask: np.ndarray | None = None
    """A token dataset's attention mask, of the values' shape."""


def read(entry: DatasetEntry) -> Table:
    """The whole dataset."""
    try:
        if entry.path.suffix == ".npz":
            return _read_npz(entry)
        return _read_csv(entry)
    except OSError as exc:
        raise DataError(
            f"dataset {entry.name!r}: cannot read {entry.path}: {exc.strerror}"
        ) from None


def _read_csv(entry: DatasetEntry) -> Table:
    with entry.path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise DataError(f"dataset {entry.name!r}: {entry.path} is empty")
    header, body = rows[0], rows[1:]
    try:
        values = np.array([[float(v) for v in row] for row in body], dtype=np.float64)
    except ValueError as exc:
        raise DataError(
            f"dataset {entry.name!r}: {entry.path} has a non-numeric value: {exc}"
        ) from None
    if body and values.shape[1] != len(header):
        raise DataError(f"dataset {entry.name!r}: rows of {entry.path} do not match its header")
    values = values.reshape(len(body), len(header))
    ids = None
    if entry.id_column:
        if entry.id_column not in header:
            raise DataError(f"dataset {entry.name!r} has no id column {entry.id_column!r}")
        i = header.index(entry.id_column)
        ids = values[:, i].astype(np.int64)
        values = np.delete(values, i, axis=1)
        header = [c for c in header if c != entry.id_column]
    return Table(header, values.astype(np.float32), ids)


def _read_npz(entry: DatasetEntry) -> Table:
    with np.load(entry.path, allow_pickle=False) as npz:
        if entry.array not in npz:
            raise DataError(f"dataset {entry.name!r}: {entry.path} has no array {entry.array!r}")
        values = np.asarray(npz[entry.array], dtype=np.float32)
        ids = np.asarray(npz[entry.id_column], dtype=np.int64) if entry.id_column else None
        if entry.mask and entry.mask not in npz:
            raise DataError(f"dataset {entry.name!r}: {entry.path} has no array {entry.mask!r}")
        mask = np.asarray(npz[entry.mask], dtype=np.float32) if entry.mask else None
    if ids is not None and len(ids) != len(values):
        raise DataError(f"dataset {entry.name!r}: {len(ids)} ids for {len(values)} rows")
    if mask is not None and mask.shape != values.shape:
        raise DataError(
            f"dataset {entry.name!r}: mask {entry.mask!r} has shape {list(mask.shape)}, "
            f"{entry.array!r} {list(values.shape)}"
        )
    columns = [f"c{i}" for i in range(values.shape[1])] if values.ndim == 2 else []
    return Table(columns, values, ids, mask)


def describe(entry: DatasetEntry) -> cpb.DatasetInfo:
    """The public description the party registers with."""
    table = read(entry)
    return cpb.DatasetInfo(
        name=entry.name,
        columns=table.columns,
        rows=len(table.values),
        row_shape=list(table.values.shape[1:]),
        id_column=entry.id_column,
    )


def select(
    table: Table, entry: DatasetEntry, columns: Sequence[str], align_on: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """The job's view: the chosen columns, rows ordered by id when the job aligns on ids."""
    values = table.values
    if columns:
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise DataError(f"dataset {entry.name!r} has no column(s) {missing}")
        values = values[:, [table.columns.index(c) for c in columns]]
    ids = table.ids
    if align_on:
        if ids is None or entry.id_column != align_on:
            raise DataError(f"dataset {entry.name!r} has no id column {align_on!r}")
        if len(np.unique(ids)) != len(ids):
            raise DataError(f"dataset {entry.name!r}: id column {align_on!r} repeats ids")
        order = np.argsort(ids, kind="stable")
        values, ids = values[order], ids[order]
    return values, ids


def load_model(name: str, path: Path, commitment: str = "") -> dict[str, Any]:
    """A private model's state_dict, read with `weights_only=True`.

    With `commitment`, the weights must still be those it commits to: the job was approved for
    them, so weights changed since are refused before anything is shared.
    """
    import torch

    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"model {name!r}: cannot load {path}: {first}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise DataError(f"model {name!r}: {path} is not a state_dict of named tensors")
    if commitment and weights_commitment(state) != commitment:
        raise DataError(
            f"model {name!r} no longer matches the commitment {commitment} the job names: its "
            "weights changed after the job was submitted"
        )
    return state


def committed_model(
    models: Mapping[str, Path], owner: str, name: str, commitment: str
) -> dict[str, Any]:
    """Party `owner`'s model `name` as a job runs it.

    Only if the job pins it by commitment and the stored weights still match: checked when the
    job is vetted and again before the weights are shared.
    """
    path = models.get(name)
    if path is None:
        raise DataError(f"party {owner!r} has no model {name!r}")
    if not commitment:
        raise DataError(f"the job names no commitment for model {name!r}")
    return load_model(name, path, commitment)


def describe_model(name: str, path: Path) -> cpb.ModelInfo:
    """The public description of a private model: its tensors' shapes and its commitment."""
    state = load_model(name, path)
    return cpb.ModelInfo(
        name=name,
        commitment=weights_commitment(state),
        parameters=[
            cpb.ParameterInfo(name=key, shape=list(state[key].shape)) for key in sorted(state)
        ],
    )
