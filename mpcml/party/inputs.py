"""How a job's inputs become secret shares at every party.

For each binding, its owner reads its rows and tells every party their public description (an
`InputMeta`: rows, row shape, a digest of the row ids); then the owner shares the values and the
others take part with zeros of that shape. Every party checks the descriptions agree before
anything is shared, so a mismatch is one message naming the party and dataset.

A vertical job that aligns rows on an id column (`align_on`) first finds, by private set
intersection over the data plane (`mpcml.psi`), the ids every party holding a binding has
(`InputSharer.align`); each such party then takes only those rows, ordered by id. Every party
holds the same ids after the intersection, so each sorts its own and the orders agree with no id
sent; the order is the same in every run of the job (the PSI keys are not), which a bit-exact
resume needs.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import crypten
import crypten.communicator as crypten_comm
import numpy as np
import torch

from mpcml.graph.ops import GraphError
from mpcml.graph.tokens import token_rows, token_vocab
from mpcml.party import catalogue
from mpcml.party.catalogue import DataError
from mpcml.party.config import DatasetEntry, PartyConfig
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.psi.group import PsiError
from mpcml.psi.protocol import intersect
from mpcml.runtime.devices import Placement

log = logging.getLogger(__name__)

FEATURES, LABELS = "features", "labels"
MAX_MESSAGE_IDS = 100_000_000
"""The most points (32 bytes each) a PSI message between parties may announce."""


class CommChannel:
    """PSI's channel over the session's data plane (CrypTen's communicator: mutual TLS).

    The bytes travel as int64 words (the last one padded): CrypTen counts a message as its
    elements times 8 bytes, so this keeps its traffic counters true.
    """

    def send(self, dst: int, data: bytes) -> None:
        """A length, then the bytes (nothing more for an empty message)."""
        comm = crypten_comm.get()
        comm.send(torch.tensor([len(data)], dtype=torch.int64), dst)
        if data:
            padded = bytearray(data) + bytes(-len(data) % 8)
            comm.send(torch.frombuffer(padded, dtype=torch.int64), dst)

    def recv(self, src: int) -> bytes:
        """The next message from `src`; a length beyond `MAX_MESSAGE_IDS` points is refused."""
        comm = crypten_comm.get()
        length = int(comm.recv(torch.zeros(1, dtype=torch.int64), src).item())
        if not 0 <= length <= 32 * MAX_MESSAGE_IDS:
            raise PsiError(f"rank {src} announced a PSI message of {length} bytes")
        if not length:
            return b""
        words = comm.recv(torch.empty((length + 7) // 8, dtype=torch.int64), src)
        return bytes(words.numpy().tobytes()[:length])


@dataclass(frozen=True)
class InputMeta:
    """What a binding's owner tells every party about its input: public sizes, no values."""

    rows: int
    row_shape: tuple[int, ...]
    id_digest: str
    """SHA-256 of the row ids (as `id_text`, in the rows' order), "" without an id column: rows
    align when these agree."""

    def to_wire(self) -> list[Any]:
        """As a schema'd object for `broadcast_obj`."""
        return [self.rows, list(self.row_shape), self.id_digest]

    @classmethod
    def from_wire(cls, value: Any, binding: jpb.DataBinding) -> InputMeta:
        """Read what the owner sent; anything else than the shape `to_wire` makes is refused."""
        ok = (
            isinstance(value, list)
            and len(value) == 3
            and isinstance(value[0], int)
            and isinstance(value[1], list)
            and all(isinstance(d, int) and d >= 0 for d in value[1])
            and isinstance(value[2], str)
            and value[0] >= 0
        )
        if not ok:
            raise DataError(
                f"party {binding.party!r} described dataset {binding.dataset!r} malformed"
            )
        return cls(value[0], tuple(value[1]), value[2])


@dataclass
class Shared:
    """One kind of input (features or labels) after sharing."""

    parts: list[Any]
    """Each binding's shared tensor, in binding order."""
    metas: list[InputMeta]
    ids: np.ndarray | None
    """This party's row ids, if it owns a binding with an id column."""


class InputSharer:
    """Shares a job's bindings for party `me` (`ranks`: party name -> rank)."""

    def __init__(
        self,
        spec: jpb.JobSpec,
        config: PartyConfig,
        ranks: dict[str, int],
        placement: Placement,
    ) -> None:
        self.spec = spec
        self.placement = placement
        """Where the shares are made (the party's device)."""
        self.config = config
        self.me = config.name
        self.ranks = ranks
        self.shared_ids: list[str] | None = None
        """After `align`: the ids every party holds, as text, in the shared order."""
        self._read: dict[str, catalogue.Table] = {}
        """Tables `align` read for their ids, by dataset, until `_mine` takes them."""
        self.psi_sizes: dict[str, int] = {}
        """After `align`, for a party holding a binding: each holder's id count, by party."""

    def _aligns(self) -> bool:
        return bool(self.spec.align_on) and self.spec.split == jpb.SPLIT_VERTICAL

    def align(self, bindings: list[jpb.DataBinding]) -> int | None:
        """With `align_on` in a vertical job: the shared rows, by PSI; returns their number.

        Every party holding a binding takes part, with the ids of its first binding; a party
        with no binding waits. The size reaches every party from the last holder.
        """
        if not self._aligns():
            return None
        holders = sorted({self.ranks[b.party] for b in bindings})
        if len(holders) < 2:
            return None
        me = self.ranks[self.me]
        if me in holders:
            mine = next(b for b in bindings if b.party == self.me)
            entry = self.config.datasets.get(mine.dataset)
            if entry is None:
                raise DataError(f"party {self.me!r} has no dataset {mine.dataset!r}")
            ids = [str(v) for v in self._ids(entry, mine.dataset)]  # normalised at read
            found = intersect([i.encode() for i in ids], me, holders, CommChannel())
            self.shared_ids = sorted((ids[i] for i in found.rows), key=catalogue.id_order)
            names = {rank: name for name, rank in self.ranks.items()}
            self.psi_sizes = {names[r]: n for r, n in zip(holders, found.sizes, strict=True)}
            log.info(
                "job rows aligned on %r by PSI: %d of this party's %d rows are shared "
                "(the parties' sets: %s)",
                self.spec.align_on,
                found.size,
                len(ids),
                ", ".join(str(n) for n in found.sizes),
            )
        comm = crypten_comm.get()
        size = comm.broadcast_obj(
            len(self.shared_ids) if self.shared_ids is not None else None, holders[-1]
        )
        if not isinstance(size, int) or size < 0:
            raise DataError("the intersection's size came malformed")
        return size

    def _ids(self, entry: DatasetEntry, dataset: str) -> np.ndarray:
        table = catalogue.read(entry)
        self._read[dataset] = table  # `_mine` takes it: the file is read once per job
        if table.ids is None or entry.id_column != self.spec.align_on:
            raise DataError(f"dataset {dataset!r} has no id column {self.spec.align_on!r}")
        return table.ids

    def _mine(self, binding: jpb.DataBinding, what: str) -> tuple[np.ndarray, np.ndarray | None]:
        entry = self.config.datasets.get(binding.dataset)
        if entry is None:
            raise DataError(f"party {self.me!r} has no dataset {binding.dataset!r}")
        table = self._read.pop(binding.dataset, None) or catalogue.read(entry)
        if self.shared_ids is not None:  # the PSI's rows, in the shared order
            table = self._shared_rows(table, binding.dataset)
        vocab = token_vocab(self.spec.graph) if what == FEATURES else None
        if vocab is None:
            return catalogue.select(table, entry, list(binding.columns), self._sort_on())
        # Token ids: encoded here, before sharing, so that no party but this one sees them.
        if table.values.ndim != 2:
            raise DataError(
                f"dataset {binding.dataset!r} must hold token ids as rows x sequence, it has "
                f"shape {list(table.values.shape)}"
            )
        mask = table.mask if table.mask is not None else np.ones_like(table.values)
        both = catalogue.Table(table.columns, np.stack([table.values, mask], -1), table.ids)
        values, ids = catalogue.select(both, entry, list(binding.columns), self._sort_on())
        try:
            return token_rows(values[..., 0], values[..., 1], vocab), ids
        except GraphError as exc:
            raise DataError(f"dataset {binding.dataset!r} of party {self.me!r}: {exc}") from None

    def _sort_on(self) -> str:
        """`select` sorts by id unless the PSI has put the rows in the shared order already."""
        return "" if self.shared_ids is not None else self.spec.align_on

    def _shared_rows(self, table: catalogue.Table, dataset: str) -> catalogue.Table:
        assert self.shared_ids is not None
        if table.ids is None:
            raise DataError(f"dataset {dataset!r} has no id column {self.spec.align_on!r}")
        where = {str(t): i for i, t in enumerate(table.ids)}  # read refused repeated ids
        missing = [t for t in self.shared_ids if t not in where]
        if missing:
            raise DataError(
                f"dataset {dataset!r} of party {self.me!r} lacks {len(missing)} of the shared ids "
                f"(e.g. row id {missing[0]!r}): a party's datasets in one job must hold its ids"
            )
        rows = np.array([where[t] for t in self.shared_ids], dtype=np.int64)
        mask = table.mask[rows] if table.mask is not None else None
        return catalogue.Table(table.columns, table.values[rows], table.ids[rows], mask)

    def share(self, bindings: list[jpb.DataBinding], what: str, classes: int = 0) -> Shared:
        """Share `bindings` (`what`: FEATURES or LABELS); `classes` one-hot encodes labels."""
        comm = crypten_comm.get()
        local: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        metas: list[InputMeta] = []
        for i, b in enumerate(bindings):
            meta: list[Any] | None = None
            if b.party == self.me:
                values, ids = self._mine(b, what)
                local[i] = (values, ids)
                digest = (
                    hashlib.sha256("\x00".join(map(catalogue.id_text, ids)).encode()).hexdigest()
                    if ids is not None
                    else ""
                )
                meta = InputMeta(
                    int(values.shape[0]), tuple(int(d) for d in values.shape[1:]), digest
                ).to_wire()
            metas.append(InputMeta.from_wire(comm.broadcast_obj(meta, self.ranks[b.party]), b))
        self._check(bindings, metas, what)
        parts, mine = [], None
        for i, (b, described) in enumerate(zip(bindings, metas, strict=True)):
            if i in local:
                value = torch.from_numpy(self._prepare(local[i][0], what, b, classes))
                mine = local[i][1] if mine is None else mine
            else:
                shape = (described.rows, *described.row_shape)
                value = torch.zeros(self._prepared_shape(shape, classes))
            value = self.placement.plain(value)
            parts.append(crypten.cryptensor(value, src=self.ranks[b.party]))
        return Shared(parts, metas, mine)

    def _check(self, bindings: list[jpb.DataBinding], metas: list[InputMeta], what: str) -> None:
        first, m0 = bindings[0], metas[0]
        for b, m in zip(bindings[1:], metas[1:], strict=True):
            if self.spec.split == jpb.SPLIT_VERTICAL and m.rows != m0.rows:
                raise DataError(
                    f"{what}: party {b.party!r} dataset {b.dataset!r} has {m.rows} rows; party "
                    f"{first.party!r} dataset {first.dataset!r} has {m0.rows}"
                )
            if self.spec.split == jpb.SPLIT_HORIZONTAL and m.row_shape != m0.row_shape:
                raise DataError(
                    f"{what}: party {b.party!r} dataset {b.dataset!r} has rows of shape "
                    f"{list(m.row_shape)}; party {first.party!r} dataset {first.dataset!r} has "
                    f"{list(m0.row_shape)}"
                )

    def check_alignment(self, bindings: list[jpb.DataBinding], metas: list[InputMeta]) -> None:
        """With `align_on`, every vertical binding must hold the same row ids."""
        if not self.spec.align_on or self.spec.split != jpb.SPLIT_VERTICAL:
            return
        for b, m in zip(bindings[1:], metas[1:], strict=True):
            if m.id_digest != metas[0].id_digest:
                raise DataError(
                    f"party {b.party!r} dataset {b.dataset!r} holds other row ids "
                    f"({self.spec.align_on!r}) than party {bindings[0].party!r} dataset "
                    f"{bindings[0].dataset!r}: rows cannot be aligned"
                )

    def _prepare(
        self, values: np.ndarray, what: str, b: jpb.DataBinding, classes: int
    ) -> np.ndarray:
        if what != LABELS or not classes:
            return values.astype(np.float32)
        labels = values.reshape(-1)
        if not np.all((labels == np.round(labels)) & (labels >= 0) & (labels < classes)):
            raise DataError(
                f"labels of party {b.party!r} dataset {b.dataset!r} must be class numbers "
                f"0..{classes - 1} for cross-entropy"
            )
        return np.eye(classes, dtype=np.float32)[labels.astype(np.int64)]

    @staticmethod
    def _prepared_shape(shape: tuple[int, ...], classes: int) -> tuple[int, ...]:
        return (shape[0], classes) if classes else shape
