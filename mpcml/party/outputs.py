"""How a job's outputs leave the secret shares: each only to its recipients.

Every party takes part in revealing an output (`get_plain_text(dst=...)`), and only the
recipient writes it, to its results folder. Metrics revealed to the coordinator are sent as
this party's additive share, which the coordinator alone can combine.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpcml.jobs.spec import COORDINATOR, recipients
from mpcml.party.audit import AuditLog
from mpcml.party.catalogue import DataError
from mpcml.party.durable import atomic_write
from mpcml.party.inputs import CommChannel
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb

log = logging.getLogger(__name__)


class Revealer:
    """Reveals a job's outputs; `results` is where this party writes what it receives."""

    def __init__(
        self,
        spec: jpb.JobSpec,
        job_id: str,
        me: str,
        ranks: dict[str, int],
        results: Path,
        audit: AuditLog | None = None,
    ) -> None:
        self.spec, self.job_id, self.me, self.ranks = spec, job_id, me, ranks
        self.results = results
        self.audit = audit
        """Where each reveal this party takes part in is recorded, with its recipient."""

    def _audit(self, what: str, who: str, rows: int, round: int = 0, **more: Any) -> None:
        if self.audit is not None:
            self.audit.append(
                "revealed", self.job_id, what=what, to=who, rows=rows, round=round, **more
            )

    def _output(self, output: jpb.Output, path: Path, shape: list[int]) -> cpb.PartyOutput:
        return cpb.PartyOutput(party=self.me, output=output, path=str(path), shape=shape)

    def metrics(self, round: int, metrics: dict[str, Any], rows: int) -> list[cpb.MetricShare]:
        """Reveal the metrics to their recipients; returns this party's coordinator shares.

        `rows`: the job's rows the metrics are computed from (the round's batches).
        """
        shares: list[cpb.MetricShare] = []
        for who in recipients(self.spec, jpb.OUTPUT_METRICS):
            self._audit("metrics", who, rows, round, names=sorted(metrics))
            for name, value in metrics.items():
                if who == COORDINATOR:
                    share, scale = int(value.share.item()), int(value.encoder.scale)
                    shares.append(cpb.MetricShare(name=name, share=share, scale=scale))
                    continue
                plain = value.get_plain_text(dst=self.ranks[who])
                if who == self.me:
                    self._record_metric(round, name, float(plain.item()))
        return shares

    def metrics_output(self) -> list[cpb.PartyOutput]:
        """The metrics file, when this party is one of their recipients."""
        if self.me not in recipients(self.spec, jpb.OUTPUT_METRICS):
            return []
        return [self._output(jpb.OUTPUT_METRICS, self.results / "metrics.jsonl", [])]

    def _record_metric(self, round: int, name: str, value: float) -> None:
        log.info("job %s round %d: %s = %.6f", self.job_id, round, name, value)
        self.results.mkdir(parents=True, exist_ok=True)
        with (self.results / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"round": round, name: value, "at": time.time()}) + "\n")

    def weights(self, tensors: dict[str, Any], rows: int) -> list[cpb.PartyOutput]:
        """Reveal the trained parameters (by state_dict key) to their recipients.

        `rows`: the rows they were trained on in this job.
        """
        out = []
        for who in recipients(self.spec, jpb.OUTPUT_WEIGHTS):
            self._audit("weights", who, rows, tensors=len(tensors))
            state = {k: t.get_plain_text(dst=self.ranks[who]) for k, t in tensors.items()}
            if who == self.me:  # only the recipient holds values; on its host for the file
                state = {k: v.cpu() for k, v in state.items()}
                path = self.results / "weights.pt"
                atomic_write(path, lambda f, s=state: torch.save(s, f))
                out.append(self._output(jpb.OUTPUT_WEIGHTS, path, []))
        return out

    def predictions(
        self, predictions: Any, ids: np.ndarray | None, rank: int
    ) -> list[cpb.PartyOutput]:
        """Reveal the predictions, with their row ids, to their recipients."""
        out = []
        for who in recipients(self.spec, jpb.OUTPUT_PREDICTIONS):
            self._audit("predictions", who, int(predictions.size(0)))
            plain = predictions.get_plain_text(dst=self.ranks[who])
            row_ids = self._row_ids(who, ids, rank, int(predictions.size(0)))
            if who == self.me:
                path = self.results / "predictions.npz"
                plain = plain.cpu()
                arrays = {"predictions": plain.numpy()}
                if row_ids is not None:
                    arrays["ids"] = row_ids
                atomic_write(path, lambda f, a=arrays: np.savez(f, **a))
                out.append(self._output(jpb.OUTPUT_PREDICTIONS, path, list(plain.shape)))
        return out

    def _row_ids(self, who: str, ids: np.ndarray | None, rank: int, rows: int) -> np.ndarray | None:
        """The aligned row ids for a recipient, who needs them to use the predictions.

        A recipient holding one of the job's bindings has them: every holder took part in the
        intersection. Any other gets them from the first feature party, where that party's
        policy allows it (`outputs_to.ids`, checked when the job was vetted), to `who` only,
        over the data plane, as a JSON list of the ids' text.
        """
        if not self.spec.align_on or self.spec.split != jpb.SPLIT_VERTICAL:
            return ids
        if who in {b.party for b in [*self.spec.features, *self.spec.labels]}:
            return ids if who == self.me else None
        src, dst = self.ranks[self.spec.features[0].party], self.ranks[who]
        if rank == src:
            texts = [str(v) for v in (ids if ids is not None else [])]
            self._audit("ids", who, len(texts))
            CommChannel().send(dst, json.dumps(texts).encode())
            return None
        if who != self.me:
            return None
        received = json.loads(CommChannel().recv(src))
        if (
            not isinstance(received, list)
            or len(received) != rows
            or not all(isinstance(v, str) for v in received)
        ):
            sender = self.spec.features[0].party
            raise DataError(f"the row ids from party {sender!r} came malformed")
        return np.array(received, dtype=str)
