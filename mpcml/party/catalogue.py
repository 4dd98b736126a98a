"""A party's private datasets and models.

What the party tells the coordinator (names, columns, row counts; a model's tensor shapes and
its commitment), and what its worker loads (the values, which never leave the party
unencrypted).
"""

from __future__ import annotations

import csv
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

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
        if entry.path.suffix == ".parquet":
            return _read_parquet(entry)
        return _read_csv(entry)
    except OSError as exc:
        raise DataError(
            f"dataset {entry.name!r}: cannot read {entry.path}: {_reason(exc)}"
        ) from None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc).splitlines()[0]


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


def _checked_ids(
    entry: DatasetEntry, ids: pa.Array | pa.ChunkedArray, first_row: int
) -> np.ndarray:
    """The ids, trimmed, as a text array; an empty or repeated id is refused naming its row(s).

    The checks run in Arrow; only a refusal walks the ids in Python, to name the rows.
    """
    texts = pc.utf8_trim_whitespace(ids)
    empty = pc.equal(pc.utf8_length(texts), 0)
    if pc.any(empty).as_py():
        row = first_row + pc.index(empty, True).as_py()
        raise DataError(f"dataset {entry.name!r}: row {row} has an empty id")
    if pc.count_distinct(texts).as_py() < len(texts):
        seen: dict[str, int] = {}
        for i, text in enumerate(texts.to_pylist()):
            if text in seen:
                raise DataError(
                    f"dataset {entry.name!r}: rows {seen[text]} and {first_row + i} have the same "
                    f"id ({entry.id_column!r})"
                )
            seen[text] = first_row + i
    return np.asarray(texts.to_numpy(zero_copy_only=False), dtype=str)


def _csv_header(entry: DatasetEntry) -> list[str]:
    with entry.path.open(newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise DataError(f"dataset {entry.name!r}: {entry.path} is empty")
    if entry.id_column and entry.id_column not in header:
        raise DataError(f"dataset {entry.name!r} has no id column {entry.id_column!r}")
    return header


def _read_csv(entry: DatasetEntry) -> Table:
    """Parsed by Arrow's CSV reader into typed columns: features float32, the id column text."""
    return _table(entry, _arrow_csv(entry, _csv_header(entry)), first_row=2)


def _arrow_csv(entry: DatasetEntry, header: list[str]) -> pa.Table:
    types = {entry.id_column: pa.string()} if entry.id_column else {}
    try:
        return pacsv.read_csv(
            entry.path,
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                default_column_type=pa.float32(),
                null_values=[""],
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid:
        _diagnose_csv(entry, header)
        raise


def _diagnose_csv(entry: DatasetEntry, header: list[str]) -> None:
    """Name the first row and column Arrow could not read; values stay out of the message."""
    width = len(header)
    with entry.path.open(newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for n, row in enumerate(rows, start=2):
            if len(row) != width:
                raise DataError(
                    f"dataset {entry.name!r}: row {n} of {entry.path} has {len(row)} cells, its "
                    f"header {width}"
                )
            for column, cell in zip(header, row, strict=True):
                if column == entry.id_column:
                    continue
                try:
                    float(cell)
                except ValueError:
                    raise DataError(
                        f"dataset {entry.name!r}: row {n} of {entry.path} has a non-numeric "
                        f"value in column {column!r}"
                    ) from None


def _read_parquet(entry: DatasetEntry) -> Table:
    return _table(entry, _arrow_parquet(entry), first_row=0)


def _arrow_parquet(entry: DatasetEntry) -> pa.Table:
    try:
        return pq.read_table(entry.path)
    except pa.ArrowInvalid as exc:
        raise DataError(
            f"dataset {entry.name!r}: {entry.path} is not a Parquet file: {str(exc)[:200]}"
        ) from None


def _table(entry: DatasetEntry, table: pa.Table, first_row: int) -> Table:
    """Features as one float32 matrix, the id column apart; a missing value names its cell."""
    id_column = None
    if entry.id_column:
        if entry.id_column not in table.column_names:
            raise DataError(f"dataset {entry.name!r} has no id column {entry.id_column!r}")
        id_column = table.column(entry.id_column)
        table = table.drop_columns([entry.id_column])
    columns = table.column_names
    values = np.empty((table.num_rows, table.num_columns), dtype=np.float32)
    for j, name in enumerate(columns):
        column = table.column(name)
        if column.null_count:
            row = first_row + pc.index(pc.is_null(column), True).as_py()
            raise DataError(f"dataset {entry.name!r}: row {row} has no value in column {name!r}")
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
            raise DataError(
                f"dataset {entry.name!r}: column {name!r} of {entry.path} is {column.type}, "
                "not numbers"
            )
        values[:, j] = column.to_numpy()
    ids = None
    if id_column is not None:
        if pa.types.is_floating(id_column.type):
            id_column = pa.array([id_text(v) for v in id_column.to_pylist()], pa.string())
        elif not (pa.types.is_string(id_column.type) or pa.types.is_large_string(id_column.type)):
            id_column = pc.cast(id_column, pa.string())
        ids = _checked_ids(entry, id_column, first_row)
    return Table(columns, values, ids)


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
            ids = _checked_ids(entry, pa.array(texts, pa.string()), first_row=0)
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


_described: dict[tuple[DatasetEntry, int, int], cpb.DatasetInfo] = {}
"""Descriptions by dataset and file version (size, mtime): a party registers again at every
attach, and a file that did not change is not read again."""


def describe(entry: DatasetEntry) -> cpb.DatasetInfo:
    """The public description the party registers with, read without converting the values.

    CSV: the header, and the rows counted by Arrow's streaming reader holding one column;
    Parquet: its footer; .npz: the arrays' headers. The values are checked when a job loads them.
    """
    try:
        stat = entry.path.stat()
        key = (entry, stat.st_size, stat.st_mtime_ns)
        if key not in _described:
            columns, shape = _shape(entry)
            _described[key] = cpb.DatasetInfo(
                name=entry.name,
                columns=columns,
                rows=shape[0],
                row_shape=list(shape[1:]),
                id_column=entry.id_column,
            )
    except OSError as exc:
        raise DataError(
            f"dataset {entry.name!r}: cannot read {entry.path}: {_reason(exc)}"
        ) from None
    return _described[key]


def _shape(entry: DatasetEntry) -> tuple[list[str], tuple[int, ...]]:
    """The feature columns and the values' shape."""
    if entry.path.suffix == ".npz":
        shapes = _npz_shapes(entry.path)
        for name in (entry.array, entry.id_column, entry.mask):
            if name and name not in shapes:
                raise DataError(f"dataset {entry.name!r}: {entry.path} has no array {name!r}")
        shape = shapes[entry.array]
        return ([f"c{i}" for i in range(shape[1])] if len(shape) == 2 else []), shape
    if entry.path.suffix == ".parquet":
        try:
            meta = pq.ParquetFile(entry.path)
        except pa.ArrowInvalid as exc:
            raise DataError(
                f"dataset {entry.name!r}: {entry.path} is not a Parquet file: {str(exc)[:200]}"
            ) from None
        names = meta.schema_arrow.names
        if entry.id_column and entry.id_column not in names:
            raise DataError(f"dataset {entry.name!r} has no id column {entry.id_column!r}")
        columns = [c for c in names if c != entry.id_column]
        return columns, (meta.metadata.num_rows, len(columns))
    header = _csv_header(entry)
    rows = 0
    try:
        with pacsv.open_csv(
            entry.path,
            read_options=pacsv.ReadOptions(use_threads=False),
            convert_options=pacsv.ConvertOptions(
                include_columns=[header[0]], column_types={header[0]: pa.string()}
            ),
        ) as reader:
            for batch in reader:
                rows += batch.num_rows
    except pa.ArrowInvalid:
        _diagnose_csv(entry, header)
        raise
    columns = [c for c in header if c != entry.id_column]
    return columns, (rows, len(columns))


def _npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each array's shape, from the .npy headers inside the archive."""
    shapes: dict[str, tuple[int, ...]] = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if not name.endswith(".npy"):
                continue
            with archive.open(name) as f:
                if np.lib.format.read_magic(f) == (1, 0):
                    shape, _, _ = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, _ = np.lib.format.read_array_header_2_0(f)
            shapes[name[: -len(".npy")]] = tuple(shape)
    return shapes


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
