"""How a job's inputs become secret shares at every party.

For each binding, its owner reads its rows and tells every party their public description (an
`InputMeta`: rows, row shape, a digest of the row ids); then the owner shares the values and the
others take part with zeros of that shape. Every party checks the descriptions agree before
anything is shared, so a mismatch is one message naming the party and dataset.
"""

from __future__ import annotations

import hashlib
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
from mpcml.party.config import PartyConfig
from mpcml.proto.v1 import job_pb2 as jpb

FEATURES, LABELS = "features", "labels"


@dataclass(frozen=True)
class InputMeta:
    """What a binding's owner tells every party about its input: public sizes, no values."""

    rows: int
    row_shape: tuple[int, ...]
    id_digest: str
    """SHA-256 of the sorted row ids, "" without an id column: rows align when these agree."""

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

    def __init__(self, spec: jpb.JobSpec, config: PartyConfig, ranks: dict[str, int]) -> None:
        self.spec = spec
        self.config = config
        self.me = config.name
        self.ranks = ranks

    def _mine(self, binding: jpb.DataBinding, what: str) -> tuple[np.ndarray, np.ndarray | None]:
        entry = self.config.datasets.get(binding.dataset)
        if entry is None:
            raise DataError(f"party {self.me!r} has no dataset {binding.dataset!r}")
        table = catalogue.read(entry)
        vocab = token_vocab(self.spec.graph) if what == FEATURES else None
        if vocab is None:
            return catalogue.select(table, entry, list(binding.columns), self.spec.align_on)
        # Token ids: encoded here, before sharing, so that no party but this one sees them.
        if table.values.ndim != 2:
            raise DataError(
                f"dataset {binding.dataset!r} must hold token ids as rows x sequence, it has "
                f"shape {list(table.values.shape)}"
            )
        mask = table.mask if table.mask is not None else np.ones_like(table.values)
        both = catalogue.Table(table.columns, np.stack([table.values, mask], -1), table.ids)
        values, ids = catalogue.select(both, entry, list(binding.columns), self.spec.align_on)
        try:
            return token_rows(values[..., 0], values[..., 1], vocab), ids
        except GraphError as exc:
            raise DataError(f"dataset {binding.dataset!r} of party {self.me!r}: {exc}") from None

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
                    hashlib.sha256(np.sort(ids).tobytes()).hexdigest() if ids is not None else ""
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
