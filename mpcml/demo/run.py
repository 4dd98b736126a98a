"""`mpcml demo` / `make demo`: the main job, end to end on loopback, nothing to start by hand.

It makes a fresh CA and certificates, starts the coordinator and the three party daemons of
`parties/` as separate processes, and through the public job API:

1. trains a logistic regression and an MLP on the breast-cancer data split vertically (alice 15
   columns, bob 15, carol the labels) as customer lists that overlap only partly: the rows every
   party holds are found by private set intersection on the text ids, and the weights stay
   secret-shared;
2. runs each trained model on the held-out rows, predictions revealed to carol only;
3. runs bob's private digits model on alice's images, predictions revealed to alice only;
4. runs bob's private BERT sentiment classifier (a Hugging Face model) on alice's token
   sequences, the logits revealed to alice only.

Each secure result is compared with plaintext PyTorch on the same data, initial weights,
hyper-parameters and batches. The demo plays every organisation, so it reads carol's and
alice's revealed predictions from their result folders; in a real deployment only they can.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mpcml.api.client import Client, JobHandle
from mpcml.api.job import Job
from mpcml.demo import data, models, sentiment
from mpcml.demo.cluster import LocalCluster
from mpcml.graph import hf
from mpcml.graph.init import model_initial_state
from mpcml.jobs.events import EventKind
from mpcml.jobs.order import epoch_order
from mpcml.proto.v1 import coordinator_pb2 as cpb

EPOCHS = 10
LR = 0.5
BATCH = 64
MOMENTUM = 0.5
SEED = 7


@dataclass
class TaskResult:
    """One row of the demo's table."""

    name: str
    secure_accuracy: float
    plaintext_accuracy: float
    max_abs_diff: float
    rounds: int
    bytes: int
    seconds: float
    rows: str
    """The rows the jobs ran on (train/test); for the customer lists, the intersection's size."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _follow(handle: JobHandle, label: str) -> cpb.JobResult:
    """Show a job's progress; its public result once it completed."""
    for e in handle.watch():
        if e.kind == EventKind.ROUND_DONE:
            loss = f" loss {e.metrics['loss']:.4f}" if "loss" in e.metrics else ""
            _say(f"  {label}: round {e.round}/{e.total_rounds}{loss}")
        elif e.kind == EventKind.STATE:
            reason = f" ({e.message})" if e.message else ""
            _say(f"  {label}: {cpb.JobState.Name(e.state)}{reason}")
    return handle.result()


def plaintext_train(
    model: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float = LR,
    batch_size: int = BATCH,
    momentum: float = MOMENTUM,
    seed: int = SEED,
    shuffle_seed: int | None = None,
    loss: str = "bce",
    losses: list[float] | None = None,
) -> torch.nn.Module:
    """What a secure train job does, in plaintext PyTorch.

    The same initial weights (from `seed`), batches in row order (or shuffled as a job with
    `shuffle_seed` shuffles them), SGD with momentum, and the loss (`bce` on a model ending in
    Sigmoid, `cross_entropy` on its logits with labels 0..C-1). Each epoch's mean batch loss
    (what a one-epoch round reports) is appended to `losses`.
    """
    model.load_state_dict(model_initial_state(model, tuple(x.shape[1:]), seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(y)
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    if loss == "bce":
        yt, loss_fn = yt.reshape(-1, 1), torch.nn.functional.binary_cross_entropy
    else:
        yt, loss_fn = yt.reshape(-1).long(), torch.nn.functional.cross_entropy
    for epoch in range(epochs):
        order = torch.arange(len(xt))
        if shuffle_seed is not None:  # the permutation a shuffled job derives (jobs/spec.py)
            order = epoch_order(len(xt), shuffle_seed, epoch)
        batch_losses = []
        for start in range(0, len(xt), batch_size):
            batch = order[start : start + batch_size]
            batch_loss = loss_fn(model(xt[batch]), yt[batch])
            opt.zero_grad()
            torch.autograd.backward(batch_loss)
            opt.step()
            batch_losses.append(float(batch_loss.detach()))
        if losses is not None:
            losses.append(sum(batch_losses) / len(batch_losses))
    return model


def by_id(ids: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
    """`arrays` in the row order of a job aligned on ids (ascending)."""
    order = np.argsort(ids, kind="stable")
    return [a[order] for a in arrays]


def predictions(result: cpb.JobResult, party: str) -> tuple[np.ndarray, np.ndarray]:
    """The predictions and row ids `party` received (read from its result folder)."""
    path = next(o.path for o in result.outputs if o.party == party)
    with np.load(path) as npz:
        return npz["predictions"], npz["ids"]


def breast_cancer_task(
    client: Client, name: str, model: torch.nn.Module, epochs: int
) -> TaskResult:
    """Secure training then inference of `model`, against the same in plaintext."""
    split = data.breast_cancer()
    began = time.monotonic()
    train = client.submit(
        Job.train(
            model=model,
            features={"alice": "customers-train", "bob": "customers-train"},
            labels={"carol": "customers-train-labels"},
            align_on="id",
            epochs=epochs,
            lr=LR,
            batch_size=BATCH,
            momentum=MOMENTUM,
            seed=SEED,
            loss="bce",
            reveal={"metrics": ["carol", "coordinator"]},
            name=f"{name}-train",
        ),
        idempotency_key=f"demo-{name}-train-{time.time_ns()}",
    )
    trained = _follow(train, f"{name} train")
    infer = client.submit(
        Job.infer(
            from_job=train.id,
            features={"alice": "customers-test", "bob": "customers-test"},
            align_on="id",
            reveal={"predictions": ["carol"]},
            name=f"{name}-infer",
        )
    )
    inferred = _follow(infer, f"{name} infer")
    seconds = time.monotonic() - began
    secure, ids = predictions(inferred, "carol")
    _, x_train, y_train = data.shared_customers(split.x_train, split.y_train, split.id_train)
    plaintext_train(model, x_train, y_train, epochs=epochs)
    id_test, x_test, y_test = data.shared_customers(split.x_test, split.y_test, split.id_test)
    assert ids.tolist() == id_test.tolist(), "carol's predictions are not the shared rows by id"
    with torch.no_grad():
        plain = model(torch.from_numpy(x_test)).numpy()
    return TaskResult(
        name=f"{name} (train {epochs} epochs + infer)",
        secure_accuracy=float(((secure.reshape(-1) > 0.5) == (y_test > 0.5)).mean()),
        plaintext_accuracy=float(((plain.reshape(-1) > 0.5) == (y_test > 0.5)).mean()),
        max_abs_diff=float(np.abs(secure - plain).max()),
        rounds=trained.status.total_rounds + inferred.status.total_rounds,
        bytes=trained.bytes_sent + inferred.bytes_sent,
        seconds=seconds,
        rows=f"{trained.status.rows}/{inferred.status.rows}",
    )


def digits_task(client: Client, cluster: LocalCluster) -> TaskResult:
    """Bob's private model on alice's images; only alice learns the predictions."""
    split = data.digits()
    began = time.monotonic()
    handle = client.submit(
        Job.infer(
            model=models.DigitsMLP(),
            weights={"bob": "digits-mlp"},
            features={"alice": "digits-test"},
            reveal={"predictions": ["alice"]},
            name="digits-private-model",
        )
    )
    result = _follow(handle, "digits infer")
    seconds = time.monotonic() - began
    secure, ids = predictions(result, "alice")
    assert np.array_equal(ids.astype(np.int64), split.id_test), (
        "alice's predictions are out of order"
    )
    net = models.DigitsMLP()
    # Only to print the plaintext column: the demo plays bob too and reads his file.
    net.load_state_dict(
        torch.load(cluster.parties_dir / "bob" / "models" / "digits_mlp.pt", weights_only=True)
    )
    with torch.no_grad():
        plain = net(torch.from_numpy(split.x_test)).numpy()
    y = split.y_test.astype(np.int64)
    return TaskResult(
        name="digits (bob's private model, alice's images)",
        secure_accuracy=float((secure.argmax(1) == y).mean()),
        plaintext_accuracy=float((plain.argmax(1) == y).mean()),
        max_abs_diff=float(np.abs(secure - plain).max()),
        rounds=result.status.total_rounds,
        bytes=result.bytes_sent,
        seconds=seconds,
        rows=f"-/{result.status.rows}",
    )


def sentiment_task(client: Client, cluster: LocalCluster) -> TaskResult:
    """Bob's private BERT on alice's token sequences; only alice learns the logits."""
    config = hf.read_config(cluster.parties_dir / "bob" / "models" / "sentiment_bert.json")
    model = hf.from_config(sentiment.CLASS, config)  # the architecture is public, not the weights
    began = time.monotonic()
    handle = client.submit(
        Job.infer(
            model=hf.SequenceModel(model, sentiment.SEQUENCE),
            weights={"bob": "sentiment-bert"},
            features={"alice": "reviews"},
            reveal={"predictions": ["alice"]},
            name="sentiment-private-bert",
        )
    )
    result = _follow(handle, "sentiment infer")
    seconds = time.monotonic() - began
    secure, ids = predictions(result, "alice")
    with np.load(cluster.parties_dir / "alice" / "data" / "reviews.npz") as reviews:
        tokens, mask, labels = reviews["input_ids"], reviews["attention_mask"], reviews["label"]
        assert np.array_equal(ids.astype(np.int64), reviews["id"]), (
            "alice's predictions are out of order"
        )
    # Only to print the plaintext column: the demo plays bob too and reads his file.
    state = torch.load(
        cluster.parties_dir / "bob" / "models" / "sentiment_bert.pt", weights_only=True
    )
    model.load_state_dict(state)
    with torch.no_grad():
        plain = model(
            input_ids=torch.from_numpy(tokens), attention_mask=torch.from_numpy(mask)
        ).logits.numpy()
    return TaskResult(
        name="sentiment (bob's private BERT, alice's text)",
        secure_accuracy=float((secure.argmax(1) == labels).mean()),
        plaintext_accuracy=float((plain.argmax(1) == labels).mean()),
        max_abs_diff=float(np.abs(secure - plain).max()),
        rounds=result.status.total_rounds,
        bytes=result.bytes_sent,
        seconds=seconds,
        rows=f"-/{result.status.rows}",
    )


def table(rows: list[TaskResult]) -> str:
    """The results as a text table."""
    head = (
        f"{'task':<46} {'secure':>7} {'plain':>7} {'max|diff|':>9} {'rounds':>6} {'MiB':>8} "
        f"{'s':>6} {'rows':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:<46} {r.secure_accuracy:>7.3f} {r.plaintext_accuracy:>7.3f} "
            f"{r.max_abs_diff:>9.4f} {r.rounds:>6} {r.bytes / 2**20:>8.1f} {r.seconds:>6.1f} "
            f"{r.rows:>7}"
        )
    lines.append(
        "rows: the rows each job ran on (train/test); the breast-cancer tasks' are the customers "
        "alice and bob both hold, found by private set intersection"
    )
    return "\n".join(lines)


@contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mpcml-demo-") as tmp:
        yield Path(tmp)


def _interruptible() -> None:
    """Make Ctrl-C stop the demo even when its parent ignored or blocked SIGINT.

    Both pass through exec, and Python then installs no KeyboardInterrupt handler: started under
    such a parent, the demo trained on after Ctrl-C.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main(json_output: bool = False, workdir: Path | None = None, epochs: int | None = None) -> int:
    """Run the demo; returns the exit code."""
    _interruptible()
    epochs = epochs or int(os.environ.get("MPCML_DEMO_EPOCHS", EPOCHS))
    with _workdir(workdir) as work:
        cluster = LocalCluster(work)
        _say(
            f"mpcml demo: coordinator, dealer and parties {', '.join(cluster.parties)} on "
            f"127.0.0.1, mutual TLS with a fresh CA in {cluster.certs} (logs in {cluster.logs})"
        )
        try:
            with cluster, cluster.start() as client:
                _say("all parties registered; running the jobs")
                rows = [
                    breast_cancer_task(client, "logreg", models.LogisticRegression(), epochs),
                    breast_cancer_task(client, "mlp", models.BreastCancerMLP(), epochs),
                    digits_task(client, cluster),
                    sentiment_task(client, cluster),
                ]
        except KeyboardInterrupt:
            _say("interrupted: every process the demo started was stopped")
            return 130
        except Exception as exc:
            _say(f"the demo failed: {exc}")
            _say(cluster.tails())
            return 1
    print(table(rows))
    if json_output:
        report: dict[str, Any] = {
            "tasks": [asdict(r) for r in rows],
            "provider": "dealer",
            "tls": True,
        }
        print(json.dumps(report))
    return 0
