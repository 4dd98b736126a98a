"""One party's side of a job's secure computation, inside an `mpcml.session`.

Every party runs the same sequence of CrypTen calls, in the same order: share every binding's
data (`inputs.py`), build the model, run the rounds' batches, and reveal each output only to its
recipients (`outputs.py`). The model's shares are checkpointed after every training round.
"""

from __future__ import annotations

import logging
from typing import Any

import crypten
import numpy as np
import torch

from mpcml.approx.plan import resolve
from mpcml.graph import aten_eval
from mpcml.graph.build import build, load_weights
from mpcml.graph.init import initial_state
from mpcml.graph.ops import GraphError
from mpcml.graph.opspec import parameter_key
from mpcml.graph.shapes import infer_shapes
from mpcml.jobs.coverage import dataset_rows
from mpcml.jobs.order import epoch_order
from mpcml.jobs.spec import RoundPlan, batch_size, recipients, round_plan
from mpcml.party import policy, provenance
from mpcml.party.audit import AuditLog
from mpcml.party.catalogue import DataError, committed_model
from mpcml.party.config import PartyConfig
from mpcml.party.durable import (
    atomic_write,
    discard_uncommitted,
    read_checkpoint,
    write_checkpoint,
)
from mpcml.party.inputs import FEATURES, LABELS, InputSharer
from mpcml.party.outputs import Revealer
from mpcml.party.training import BatchedSGD, Trainer, trainer
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.runtime import profile
from mpcml.runtime.crypten_session import Session
from mpcml.runtime.provider import batch_begins

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
        self.placement = session.placement
        """Where this party's tensors live; shares cross to the host only through it."""
        self.rank = start.rank
        self.ranks = {p.name: i for i, p in enumerate(start.peers)}
        self.model: Any = None
        self.optimizer: Any = None
        self.trainer: Trainer | None = None
        self.x: Any = None
        self.y: Any = None
        self.plan: RoundPlan | None = None
        self.predictions: Any = None
        self.ids: np.ndarray | None = None
        self.rows: policy.Rows = ([], [])
        """The rows of each features and labels binding, as shared."""
        self.audit = AuditLog(config.state_dir)
        self.reveal = Revealer(
            self.spec,
            start.job_id,
            self.me,
            self.ranks,
            config.job_results(start.job_id),
            self.audit,
        )
        crypten.cfg.communicator.verbose = True  # CrypTen counts rounds and bytes only then

    # --- inputs -----------------------------------------------------------------------------

    def load(self) -> int:
        """Share the inputs and build the model; returns the rows of the job's input."""
        spec = self.spec
        sharer = InputSharer(spec, self.config, self.ranks, self.placement)
        shared = sharer.align([*spec.features, *spec.labels])
        if shared is not None:  # the policy's floor on the rows the job will use, before sharing
            if not shared:
                raise DataError(
                    f"the parties share no row ids ({spec.align_on!r}): the job has no rows"
                )
            self.rows = ([shared] * len(spec.features), [shared] * len(spec.labels))
            self.audit.append(
                "psi",
                self.start.job_id,
                on=spec.align_on,
                shared_rows=shared,
                sizes=sharer.psi_sizes,
            )
            self._recheck_policy()
        features = sharer.share(list(spec.features), FEATURES)
        metas = features.metas
        if spec.split == jpb.SPLIT_HORIZONTAL or len(metas) == 1:
            row_shape = metas[0].row_shape
        else:
            row_shape = (sum(m.row_shape[0] for m in metas),)
        try:
            self.output_shape = infer_shapes(spec.graph, row_shape)
            if spec.graph.op_table:  # the recorded output shape, checked by torch's own rules
                derived = aten_eval.output_shape(spec.graph, tuple(row_shape))
                if derived != tuple(self.output_shape):
                    raise GraphError(
                        f"the graph says its output rows have shape {list(self.output_shape)}, "
                        f"its ops give {list(derived)}"
                    )
        except GraphError as exc:
            raise DataError(f"the model does not fit the data: {exc}") from None
        dim = 0 if spec.split == jpb.SPLIT_HORIZONTAL else 1
        parts = features.parts
        self.x = parts[0] if len(parts) == 1 else crypten.cat(parts, dim=dim)
        all_metas = list(metas)
        if spec.labels:
            classes = int(self.output_shape[0]) if spec.hyper.loss == jpb.LOSS_CROSS_ENTROPY else 0
            labels = sharer.share(list(spec.labels), LABELS, classes)
            all_metas += labels.metas
            self.y = labels.parts[0] if len(labels.parts) == 1 else crypten.cat(labels.parts)
            if spec.split == jpb.SPLIT_VERTICAL and labels.metas[0].rows != metas[0].rows:
                lb = spec.labels[0]
                raise DataError(
                    f"labels: party {lb.party!r} dataset {lb.dataset!r} has "
                    f"{labels.metas[0].rows} rows; the features have {metas[0].rows}"
                )
        sharer.check_alignment([*spec.features, *spec.labels], all_metas)
        self.rows = ([m.rows for m in metas], [m.rows for m in all_metas[len(metas) :]])
        self._recheck_policy()
        self.ids = features.ids
        rows = int(self.x.size(0))
        self.plan = round_plan(spec, rows)
        self._build_model()
        self._check_placement()
        return rows

    def _check_placement(self) -> None:
        """Every share this party holds is on its device, as CrypTen holds shares there."""
        held = {"the features": self.x, **({"the labels": self.y} if self.y is not None else {})}
        held.update({f"parameter {k!r}": t for k, t in self._tensors(self.model).items()})
        held.update({f"momentum of {k!r}": b for k, b in self._momentum().items()})
        for what, tensor in held.items():
            self.placement.check(what, tensor.share)

    def _recheck_policy(self) -> None:
        """The party's policy once more, with the rows every party really shared.

        The vet counted the rows the coordinator reported; the floor under revealed aggregates
        (`min_rows`) holds on the true counts, before anything is computed or revealed.
        """
        verdict = policy.check(
            self.config.policy,
            self.me,
            self.spec,
            self.start.submitter,
            provenance.lineage(self.config),
            self.rows,
        )
        if not verdict.allowed:
            raise DataError(f"party {self.me!r} refuses the job: {verdict.reason}")

    # --- the model --------------------------------------------------------------------------

    def _build_model(self) -> None:
        spec, graph = self.spec, self.spec.graph
        choices = resolve(spec.approximations, graph)
        net = build(graph, choices)
        source = spec.weights.WhichOneof("source")
        src = 0
        if source == "init_seed":
            if self.rank == 0:
                load_weights(net, graph, initial_state(graph, spec.weights.init_seed))
        elif source == "private":
            owner = spec.weights.private
            src = self.ranks[owner.party]
            if owner.party == self.me:
                models = self.config.models
                state = committed_model(models, self.me, owner.model, owner.commitment)
                self.audit.append(
                    "model_committed",
                    self.start.job_id,
                    model=owner.model,
                    commitment=owner.commitment,
                )
                load_weights(net, graph, state)
        self.placement.module(net).encrypt(src=src)
        if source == "from_job":
            self._load_shares(net, spec.weights.from_job)
        if spec.task == jpb.TASK_TRAIN:
            net.train()
            h = spec.hyper
            self.optimizer = BatchedSGD(
                self._trainable(net),
                lr=h.learning_rate,
                momentum=h.momentum,
                weight_decay=h.weight_decay,
            )
            want_loss = bool(recipients(spec, jpb.OUTPUT_METRICS))
            self.trainer = trainer(spec, net, self.optimizer, want_loss, choices)
        else:
            net.eval()
        self.model = net

    def _trainable(self, net: Any) -> list[Any]:
        """The parameters the job trains; the others (`trainable` fine-tuning) stay fixed."""
        prefixes = list(self.spec.hyper.trainable)
        if not prefixes:
            return list(net.parameters())
        out = []
        for node in self.spec.graph.nodes:
            module = net._modules[node.name]
            chosen = any(node.module == p or node.module.startswith(p + ".") for p in prefixes)
            for spec_param in node.parameters:
                tensor = getattr(module, spec_param.name)
                if spec_param.buffer:
                    continue
                tensor.requires_grad = chosen  # autograd stops where nothing trains
                if chosen:
                    out.append(tensor)
        return out

    def _tensors(self, net: Any) -> dict[str, Any]:
        out = {}
        for node in self.spec.graph.nodes:
            module = net._modules[node.name]
            for p in node.parameters:
                out[parameter_key(node.module, p.name)] = getattr(module, p.name)
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
        """Host copies of the parameters' shares, by name: what the party keeps and checkpoints."""
        return {k: self.placement.host(t.share) for k, t in self._tensors(self.model).items()}

    def _put_shares(self, net: Any, shares: dict[str, torch.Tensor], origin: str) -> None:
        """Set `net`'s parameters to saved shares, each checked against the graph's shape."""
        for key, tensor in self._tensors(net).items():
            share = shares.get(key)
            if share is None or tuple(share.shape) != tuple(tensor.share.shape):
                raise DataError(
                    f"party {self.me!r}: {origin} holds no share of {key!r} of the right shape"
                )
            tensor.share = self.placement.share(share)

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
            "momentum": {k: self.placement.host(b.share) for k, b in self._momentum().items()},
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
            buffer.share = self.placement.share(share)
            self.optimizer.state[id(tensors[key])]["momentum_buffer"] = buffer
        self._check_placement()

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
        assert self.trainer is not None
        plan = self.plan
        rows = 0
        for g in plan.batches(round):
            epoch, b = divmod(g, plan.batches_per_epoch)
            start, stop = b * plan.batch_size, min((b + 1) * plan.batch_size, plan.rows)
            order = self._order(epoch)
            if order is None:
                xb, yb = self.x[start:stop], self.y[start:stop]
            else:
                idx = order[start:stop]
                xb, yb = self.x[idx], self.y[idx]
            rows += stop - start
            batch_begins()
            with profile.batch():
                self.trainer.step(xb, yb)
        loss = self.trainer.round_loss()
        return [] if loss is None else self.reveal.metrics(round, {"loss": loss}, rows)

    def _predict(self) -> None:
        assert self.plan is not None
        size = batch_size(self.spec)
        parts = []
        with crypten.no_grad():
            for i in range(0, self.plan.rows, size):
                batch_begins()
                with profile.batch():
                    parts.append(self.model(self.x[i : i + size]))
        self.predictions = parts[0] if len(parts) == 1 else crypten.cat(parts, dim=0)

    # --- the end ----------------------------------------------------------------------------

    def finish(self) -> tuple[list[cpb.PartyOutput], list[cpb.MetricShare]]:
        """Keep or reveal the outputs; returns what this party received, and metric shares."""
        outputs: list[cpb.PartyOutput] = []
        shares: list[cpb.MetricShare] = []
        task = self.spec.task
        if task == jpb.TASK_TRAIN:
            self._keep_shares()
            assert self.plan is not None
            outputs += self.reveal.weights(self._tensors(self.model), self.plan.rows)
            outputs += self.reveal.metrics_output()  # each round's loss, as it was revealed
        if task == jpb.TASK_EVALUATE:
            assert self.plan is not None
            shares = self.reveal.metrics(0, self._evaluation(), self.plan.rows)
            outputs += self.reveal.metrics_output()
        if task in (jpb.TASK_INFER, jpb.TASK_EVALUATE):
            outputs += self.reveal.predictions(self.predictions, self.ids, self.rank)
        return outputs, shares

    def _keep_shares(self) -> None:
        shares = self._shares()
        directory = self.config.job_state(self.start.job_id)
        lineage = provenance.lineage(self.config)
        trained_on = policy.sources(self.spec, self.me, lineage)
        rows = {d: n for (p, d), n in dataset_rows(self.spec, *self.rows).items() if p == self.me}
        if self.spec.weights.WhichOneof("source") == "from_job":
            for name, n in lineage(self.spec.weights.from_job).rows.items():
                rows[name] = max(n, rows.get(name, 0))
        start = policy.weights(self.spec, lineage).start
        provenance.record(directory, trained_on[jpb.OUTPUT_WEIGHTS], rows, start)
        atomic_write(
            directory / SHARES_FILE, lambda f: torch.save({"rank": self.rank, "shares": shares}, f)
        )

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
