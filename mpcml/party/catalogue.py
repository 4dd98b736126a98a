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


def id_text(value: Any) -> str:
    """An id as jobs compare it: text trimmed of surrounding spaces, case as stored.

    A whole number held as a number (an .npz id array) is written without a decimal point.
    """
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    return str(value).strip()


def id_order(text: str) -> tuple[int, float, str]:
    """How rows aligned on ids are ordered: those that read as numbers by number, then text.

    Every party computes it from the id alone, so the orders agree.
    """
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _checked_ids(entry: DatasetEntry, texts: Sequence[str], first_row: int) -> np.ndarray:
    """The ids as a text array; an empty or repeated id is refused naming its row(s)."""
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        row = first_row + i
        if not text:
            raise DataError(f"dataset {entry.name!r}: row {row} has an empty id")
        if text in seen:
            raise DataError(
                f"dataset {entry.name!r}: rows {seen[text]} and {row} have the same id "
                f"({entry.id_column!r})"
            )
        seen[text] = row
    return np.array(list(texts), dtype=str)


def _read_csv(entry: DatasetEntry) -> Table:
    with entry.path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise DataError(f"dataset {entry.name!r}: {entry.path} is empty")
    header, body = rows[0], rows[1:]
    for n, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataError(
                f"dataset {entry.name!r}: row {n} of {entry.path} has {len(row)} cells, its "
                f"header {len(header)}"
            )
    ids = None
    if entry.id_column:
        if entry.id_column not in header:
            raise DataError(f"dataset {entry.name!r} has no id column {entry.id_column!r}")
        i = header.index(entry.id_column)
        ids = _checked_ids(entry, [id_text(row[i]) for row in body], first_row=2)
        body = [row[:i] + row[i + 1 :] for row in body]
        header = [c for c in header if c != entry.id_column]
    try:
        values = np.array([[float(v) for v in row] for row in body], dtype=np.float64)
    except ValueError as exc:
        raise DataError(
            f"dataset {entry.name!r}: {entry.path} has a non-numeric value: {exc}"
        ) from None
    values = values.reshape(len(body), len(header))
    return Table(header, values.astype(np.float32), ids)


def _read_npz(entry: DatasetEntry) -> Table:
    with np.load(entry.path, allow_pickle=False) as npz:
        if entry.array not in npz:
            raise DataError(f"dataset {entry.name!r}: {entry.path} has no array {entry.array!r}")
        values = np.asarray(npz[entry.array], dtype=np.float32)
        ids = None
        if entry.id_column:
            if entry.id_column not in npz:
                raise DataError(
                    f"dataset {entry.name!r}: {entry.path} has no array {entry.id_column!r}"
                )
            raw = np.asarray(npz[entry.id_column]).reshape(-1)
            texts = [str(int(v)) if raw.dtype.kind in "iu" else id_text(v) for v in raw]
            ids = _checked_ids(entry, texts, first_row=0)
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
        keys = [id_order(str(v)) for v in ids]
        order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
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
