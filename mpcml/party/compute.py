"""One party's side of a job's secure computation, inside an `mpcml.session`.

Every party runs the same sequence of CrypTen calls, in the same order: share every binding's
data (its owner supplies the values, the others only its shape), build the model, run the
rounds' batches, and reveal each output only to its recipients (`get_plain_text(dst=...)`).
Metrics revealed to the coordinator are sent as this party's additive share, which the
coordinator alone can combine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import crypten
import crypten.communicator as crypten_comm
import numpy as np
import torch

from mpcml.graph.build import build, load_weights
from mpcml.graph.init import initial_state
from mpcml.graph.ops import GraphError
from mpcml.graph.shapes import infer_shapes
from mpcml.jobs.order import epoch_order
from mpcml.jobs.spec import (
    COORDINATOR,
    RoundPlan,
    batch_size,
    recipients,
    round_plan,
)
from mpcml.party import catalogue, policy, provenance
from mpcml.party.catalogue import DataError
from mpcml.party.config import PartyConfig
from mpcml.party.durable import (
    atomic_write,
    discard_uncommitted,
    read_checkpoint,
    write_checkpoint,
)
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.runtime.crypten_session import Session

log = logging.getLogger(__name__)

SHARES_FILE = "model.shares.pt"


class JobComputation:
    """The job as this party computes it."""

    def __init__(self, session: Session, start: cpb.StartJob, config: PartyConfig) -> None:
        self.session = session
        self.start = start
        self.spec = start.spec
        self.config = config
        self.me = config.name
        self.rank = start.rank
        self.ranks = {p.name: i for i, p in enumerate(start.peers)}
        self.model: Any = None
        self.optimizer: Any = None
        self.x: Any = None
        self.y: Any = None
        self.plan: RoundPlan | None = None
        self.predictions: Any = None
        self.ids: np.ndarray | None = None
        self.results = config.job_results(start.job_id)
        crypten.cfg.communicator.verbose = True  # CrypTen counts rounds and bytes only then

    # --- inputs -----------------------------------------------------------------------------

    def _mine(self, binding: jpb.DataBinding) -> tuple[np.ndarray, np.ndarray | None]:
        entry = self.config.datasets.get(binding.dataset)
        if entry is None:
            raise DataError(f"party {self.me!r} has no dataset {binding.dataset!r}")
        table = catalogue.read(entry)
        return catalogue.select(table, entry, list(binding.columns), self.spec.align_on)

    def _share(
        self, bindings: list[jpb.DataBinding], what: str
    ) -> tuple[list[Any], list[list[Any]], list[np.ndarray | None]]:
        """Each binding's shared tensor and its owner's public (rows, row shape, id digest)."""
        comm = crypten_comm.get()
        local: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        metas: list[list[Any]] = []
        for i, b in enumerate(bindings):
            meta: list[Any] | None = None
            if b.party == self.me:
                values, ids = self._mine(b)
                local[i] = (values, ids)
                digest = (
                    hashlib.sha256(np.sort(ids).tobytes()).hexdigest() if ids is not None else ""
                )
                meta = [int(values.shape[0]), [int(d) for d in values.shape[1:]], digest]
            metas.append(comm.broadcast_obj(meta, self.ranks[b.party]))
        self._check(bindings, metas, what)
        shared, ids_out = [], []
        for i, (b, meta) in enumerate(zip(bindings, metas, strict=True)):
            shape = (meta[0], *meta[1])
            if i in local:
                value = torch.from_numpy(self._prepare(local[i][0], what, b))
                ids_out.append(local[i][1])
            else:
                value = torch.zeros(self._prepared_shape(shape, what))
                ids_out.append(None)
            shared.append(crypten.cryptensor(value, src=self.ranks[b.party]))
        return shared, metas, ids_out

    def _check(self, bindings: list[jpb.DataBinding], metas: list[list[Any]], what: str) -> None:
        first, m0 = bindings[0], metas[0]
        for b, m in zip(bindings[1:], metas[1:], strict=True):
            if self.spec.split == jpb.SPLIT_VERTICAL and m[0] != m0[0]:
                raise DataError(
                    f"{what}: party {b.party!r} dataset {b.dataset!r} has {m[0]} rows; party "
                    f"{first.party!r} dataset {first.dataset!r} has {m0[0]}"
                )
            if self.spec.split == jpb.SPLIT_HORIZONTAL and m[1] != m0[1]:
                raise DataError(
                    f"{what}: party {b.party!r} dataset {b.dataset!r} has rows of shape {m[1]}; "
                    f"party {first.party!r} dataset {first.dataset!r} has {m0[1]}"
                )

    def _check_alignment(self, bindings: list[jpb.DataBinding], metas: list[list[Any]]) -> None:
        if not self.spec.align_on or self.spec.split != jpb.SPLIT_VERTICAL:
            return
        for b, m in zip(bindings[1:], metas[1:], strict=True):
            if m[2] != metas[0][2]:
                raise DataError(
                    f"party {b.party!r} dataset {b.dataset!r} holds other row ids "
                    f"({self.spec.align_on!r}) than party {bindings[0].party!r} dataset "
                    f"{bindings[0].dataset!r}: rows cannot be aligned"
                )

    def _classes(self) -> int:
        return int(self.output_shape[0])

    def _prepare(self, values: np.ndarray, what: str, b: jpb.DataBinding) -> np.ndarray:
        if what != "labels" or self.spec.hyper.loss != jpb.LOSS_CROSS_ENTROPY:
            return values.astype(np.float32)
        labels = values.reshape(-1)
        classes = self._classes()
        if not np.all((labels == np.round(labels)) & (labels >= 0) & (labels < classes)):
            raise DataError(
                f"labels of party {b.party!r} dataset {b.dataset!r} must be class numbers "
                f"0..{classes - 1} for cross-entropy"
            )
        return np.eye(classes, dtype=np.float32)[labels.astype(np.int64)]

    def _prepared_shape(self, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
        if what == "labels" and self.spec.hyper.loss == jpb.LOSS_CROSS_ENTROPY:
            return (shape[0], self._classes())
        return shape

    def load(self) -> int:
        """Share the inputs and build the model; returns the rows of the job's input."""
        spec = self.spec
        feature_parts, metas, ids = self._share(list(spec.features), "features")
        if spec.split == jpb.SPLIT_HORIZONTAL or len(metas) == 1:
            row_shape = tuple(metas[0][1])
        else:
            row_shape = (sum(m[1][0] for m in metas),)
        try:
            self.output_shape = infer_shapes(spec.graph, row_shape)
        except GraphError as exc:
            raise DataError(f"the model does not fit the data: {exc}") from None
        dim = 0 if spec.split == jpb.SPLIT_HORIZONTAL else 1
        self.x = (
            feature_parts[0] if len(feature_parts) == 1 else crypten.cat(feature_parts, dim=dim)
        )
        all_metas = list(metas)
        if spec.labels:
            label_parts, label_metas, _ = self._share(list(spec.labels), "labels")
            all_metas += label_metas
            self.y = label_parts[0] if len(label_parts) == 1 else crypten.cat(label_parts, dim=0)
            if spec.split == jpb.SPLIT_VERTICAL and label_metas[0][0] != metas[0][0]:
                lb = spec.labels[0]
                raise DataError(
                    f"labels: party {lb.party!r} dataset {lb.dataset!r} has {label_metas[0][0]} "
                    f"rows; the features have {metas[0][0]}"
                )
        self._check_alignment([*spec.features, *spec.labels], all_metas)
        self.ids = next((i for i in ids if i is not None), None)
        rows = int(self.x.size(0))
        self.plan = round_plan(spec, rows)
        self._build_model()
        return rows

    # --- the model --------------------------------------------------------------------------

    def _build_model(self) -> None:
        spec, graph = self.spec, self.spec.graph
        net = build(graph)
        source = spec.weights.WhichOneof("source")
        src = 0
        if source == "init_seed":
            if self.rank == 0:
                load_weights(net, graph, initial_state(graph, spec.weights.init_seed))
        elif source == "private":
            owner = spec.weights.private
            src = self.ranks[owner.party]
            if owner.party == self.me:
                path = self.config.models.get(owner.model)
                if path is None:
                    raise DataError(f"party {self.me!r} has no model {owner.model!r}")
                try:
                    state = torch.load(path, weights_only=True, map_location="cpu")
                except (OSError, RuntimeError, ValueError) as exc:
                    raise DataError(f"model {owner.model!r}: cannot load {path}: {exc}") from None
                load_weights(net, graph, state)
        net.encrypt(src=src)
        if source == "from_job":
            self._load_shares(net, spec.weights.from_job)
        if spec.task == jpb.TASK_TRAIN:
            net.train()
            h = spec.hyper
            self.optimizer = crypten.optim.SGD(
                net.parameters(),
                lr=h.learning_rate,
                momentum=h.momentum,
                weight_decay=h.weight_decay,
            )
        else:
            net.eval()
        self.model = net

    def _tensors(self, net: Any) -> dict[str, Any]:
        out = {}
        for node in self.spec.graph.nodes:
            module = net._modules[node.name]
            for p in node.parameters:
                out[f"{node.module}.{p.name}"] = getattr(module, p.name)
        return out

    def _load_shares(self, net: Any, job_id: str) -> None:
        path = self.config.job_state(job_id) / SHARES_FILE
        try:
            saved = torch.load(path, weights_only=True)
        except FileNotFoundError:
            raise DataError(
                f"party {self.me!r} holds no shares of job {job_id}'s model ({path})"
            ) from None
        if saved.get("rank") != self.rank:
            raise DataError(
                f"party {self.me!r} held rank {saved.get('rank')} in job {job_id}, not {self.rank}"
            )
        self._put_shares(net, saved["shares"], f"its saved model of job {job_id}")

    def _shares(self) -> dict[str, torch.Tensor]:
        """Copies of the parameters' shares, by name: what the party keeps and checkpoints."""
        return {k: t.share.clone() for k, t in self._tensors(self.model).items()}

    def _put_shares(self, net: Any, shares: dict[str, torch.Tensor], origin: str) -> None:
        """Set `net`'s parameters to saved shares, each checked against the graph's shape."""
        for key, tensor in self._tensors(net).items():
            share = shares.get(key)
            if share is None or tuple(share.shape) != tuple(tensor.share.shape):
                raise DataError(
                    f"party {self.me!r}: {origin} holds no share of {key!r} of the right shape"
                )
            tensor.share = share

    # --- checkpoints -------------------------------------------------------------------------

    def _momentum(self) -> dict[str, Any]:
        """The optimiser's momentum buffers by parameter name (none before the first step)."""
        if self.optimizer is None:
            return {}
        state = self.optimizer.state
        return {
            k: state[id(t)]["momentum_buffer"]
            for k, t in self._tensors(self.model).items()
            if "momentum_buffer" in state.get(id(t), {})
        }

    def checkpoint(self, round: int) -> str:
        """Write this party's shares of the training state after `round`; returns the digest.

        Tasks that keep no state between rounds write nothing and return "".
        """
        if self.spec.task != jpb.TASK_TRAIN:
            return ""
        state = {
            "job_id": self.start.job_id,
            "rank": self.rank,
            "round": round,
            "shares": self._shares(),
            "momentum": {k: b.share.clone() for k, b in self._momentum().items()},
        }
        return write_checkpoint(self.config.job_state(self.start.job_id), round, state)

    def restore(self, round: int, digest: str) -> None:
        """Load this party's checkpoint of `round` into the model and the optimiser."""
        directory = self.config.job_state(self.start.job_id)
        discard_uncommitted(directory, round)  # what the failed run left behind
        saved = read_checkpoint(directory, round, digest, self.me)
        if saved.get("rank") != self.rank or saved.get("round") != round:
            raise DataError(
                f"party {self.me!r}: the checkpoint of round {round} is of rank "
                f"{saved.get('rank')} round {saved.get('round')}, not rank {self.rank}"
            )
        self._put_shares(self.model, saved["shares"], f"its checkpoint of round {round}")
        tensors = self._tensors(self.model)
        for key, share in saved["momentum"].items():
            buffer = tensors[key].clone().detach()
            buffer.share = share
            self.optimizer.state[id(tensors[key])]["momentum_buffer"] = buffer

    def _loss(self) -> Any:
        return {
            jpb.LOSS_BCE: crypten.nn.BCELoss,
            jpb.LOSS_CROSS_ENTROPY: crypten.nn.CrossEntropyLoss,
            jpb.LOSS_MSE: crypten.nn.MSELoss,
        }[self.spec.hyper.loss]()

    # --- rounds -----------------------------------------------------------------------------

    def _order(self, epoch: int) -> torch.Tensor | None:
        h = self.spec.hyper
        if not h.shuffle or self.plan is None:
            return None
        return epoch_order(self.plan.rows, int(h.shuffle_seed), epoch)

    def run_round(self, round: int) -> list[cpb.MetricShare]:
        """The round's batches; returns this party's shares of the metrics for the coordinator."""
        assert self.plan is not None
        if self.spec.task != jpb.TASK_TRAIN:
            self._predict()
            return []
        plan, loss_fn, total = self.plan, self._loss(), None
        batches = plan.batches(round)
        for g in batches:
            epoch, b = divmod(g, plan.batches_per_epoch)
            start, stop = b * plan.batch_size, min((b + 1) * plan.batch_size, plan.rows)
            order = self._order(epoch)
            if order is None:
                xb, yb = self.x[start:stop], self.y[start:stop]
            else:
                idx = order[start:stop]
                xb, yb = self.x[idx], self.y[idx]
            loss = loss_fn(self.model(xb), yb)
            self.model.zero_grad()
            loss.backward()
            self.optimizer.step()
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None, f"round {round} has no batches"
        mean = total / len(batches)
        return self._reveal_metrics(round, {"loss": mean})

    def _predict(self) -> None:
        assert self.plan is not None
        size = batch_size(self.spec)
        with crypten.no_grad():
            parts = [self.model(self.x[i : i + size]) for i in range(0, self.plan.rows, size)]
        self.predictions = parts[0] if len(parts) == 1 else crypten.cat(parts, dim=0)

    def _reveal_metrics(self, round: int, metrics: dict[str, Any]) -> list[cpb.MetricShare]:
        shares: list[cpb.MetricShare] = []
        for who in recipients(self.spec, jpb.OUTPUT_METRICS):
            for name, value in metrics.items():
                if who == COORDINATOR:
                    shares.append(
                        cpb.MetricShare(
                            name=name, share=int(value.share.item()), scale=int(value.encoder.scale)
                        )
                    )
                    continue
                plain = value.get_plain_text(dst=self.ranks[who])
                if who == self.me:
                    self._record_metric(round, name, float(plain.item()))
        return shares

    def _record_metric(self, round: int, name: str, value: float) -> None:
        log.info("job %s round %d: %s = %.6f", self.start.job_id, round, name, value)
        self.results.mkdir(parents=True, exist_ok=True)
        with (self.results / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"round": round, name: value, "at": time.time()}) + "\n")

    # --- the end ----------------------------------------------------------------------------

    def finish(self) -> tuple[list[cpb.PartyOutput], list[cpb.MetricShare]]:
        """Keep or reveal the outputs; returns what this party received, and metric shares."""
        outputs: list[cpb.PartyOutput] = []
        shares: list[cpb.MetricShare] = []
        task = self.spec.task
        if task == jpb.TASK_TRAIN:
            self._keep_shares()
            outputs += self._reveal_weights()
        if task == jpb.TASK_EVALUATE:
            shares = self._reveal_metrics(0, self._evaluation())
            if self.me in recipients(self.spec, jpb.OUTPUT_METRICS):
                outputs.append(self._output(jpb.OUTPUT_METRICS, self.results / "metrics.jsonl", []))
        if task in (jpb.TASK_INFER, jpb.TASK_EVALUATE):
            outputs += self._reveal_predictions()
        return outputs, shares

    def _output(self, output: jpb.Output, path: Path, shape: list[int]) -> cpb.PartyOutput:
        return cpb.PartyOutput(party=self.me, output=output, path=str(path), shape=shape)

    def _keep_shares(self) -> None:
        shares = self._shares()
        directory = self.config.job_state(self.start.job_id)
        trained_on = policy.sources(self.spec, self.me, provenance.lineage(self.config))
        provenance.record(directory, trained_on[jpb.OUTPUT_WEIGHTS])
        atomic_write(
            directory / SHARES_FILE, lambda f: torch.save({"rank": self.rank, "shares": shares}, f)
        )

    def _reveal_weights(self) -> list[cpb.PartyOutput]:
        out = []
        for who in recipients(self.spec, jpb.OUTPUT_WEIGHTS):
            state = {
                k: t.get_plain_text(dst=self.ranks[who])
                for k, t in self._tensors(self.model).items()
            }
            if who == self.me:
                path = self.results / "weights.pt"
                atomic_write(path, lambda f, s=state: torch.save(s, f))
                out.append(self._output(jpb.OUTPUT_WEIGHTS, path, []))
        return out

    def _row_ids(self, who: str) -> np.ndarray | None:
        """The aligned row ids for a recipient, who needs them to use the predictions.

        They are sent by the first feature party, to `who` only.
        """
        if not self.spec.align_on or self.spec.split != jpb.SPLIT_VERTICAL:
            return self.ids
        src = self.ranks[self.spec.features[0].party]
        rows = int(self.predictions.size(0))
        mine = self.ids if self.rank == src and self.ids is not None else np.zeros(rows)
        shared = crypten.cryptensor(torch.from_numpy(mine.astype(np.float64)), src=src)
        plain = shared.get_plain_text(dst=self.ranks[who])
        return plain.round().long().numpy() if who == self.me else None

    def _reveal_predictions(self) -> list[cpb.PartyOutput]:
        out = []
        for who in recipients(self.spec, jpb.OUTPUT_PREDICTIONS):
            plain = self.predictions.get_plain_text(dst=self.ranks[who])
            ids = self._row_ids(who)
            if who == self.me:
                path = self.results / "predictions.npz"
                arrays = {"predictions": plain.numpy()}
                if ids is not None:
                    arrays["ids"] = ids
                atomic_write(path, lambda f, a=arrays: np.savez(f, **a))
                out.append(self._output(jpb.OUTPUT_PREDICTIONS, path, list(plain.shape)))
        return out

    def _evaluation(self) -> dict[str, Any]:
        loss = self._loss()(self.predictions, self.y)
        if self.spec.hyper.loss == jpb.LOSS_BCE:
            hit = self.predictions > 0.5  # 0/1, as are the labels
            correct = hit * self.y + (1 - hit) * (1 - self.y)
        elif self.spec.hyper.loss == jpb.LOSS_CROSS_ENTROPY:
            correct = (self.predictions.argmax(dim=1, one_hot=True) * self.y).sum(1)
        else:
            return {"loss": loss}
        return {"loss": loss, "accuracy": correct.mean()}

    def stats(self) -> tuple[int, int]:
        """(bytes sent, communication rounds) as CrypTen counts them for this party."""
        s = self.session.communication_stats()
        return int(s.get("bytes", 0)), int(s.get("rounds", 0))
