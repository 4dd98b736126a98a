"""Daemon jobs as a consortium runs them: time against parties, batch size and round-trip time.

`make bench` runs this. Every job goes the way a user's does: the job API, the coordinator,
one daemon per party and the dealer, each its own process on this machine, gRPC with mutual
TLS. Two workloads: logistic regression on breast cancer and the Tanh MLP on the digits
(bench/train.py's models, rows, seeds and hyper-parameters), their feature columns split
evenly between 1, 2 or 3 feature parties (alice, bob, dave) and the labels at carol, so a job
has 2, 3 or 4 parties. The CNN is not here: its images are one party's, so it is a 2-party job
by nature (bench/train.py). Each setting is run `--repeats` times in fresh jobs: the median
epoch and the fastest and slowest. Each job trains 2 epochs (the first, which also starts the
workers, is timed apart), then infers the test rows once.

Columns: seconds per epoch (the coordinator's committed round); rounds and MiB per epoch
(CrypTen's count, summed over the parties); the floor (rounds x one-way delay + the busiest
party's bytes / bandwidth, on the emulated network of mpcml/transport/shaping.py); outside
compute: the share of the job's run time not spent in the workers' profiled compute (job
start, workers' set-up, data loading and the coordinator's round hand-offs: what the job API,
the coordinator and the daemons cost over a session); inference seconds and test accuracy
against plaintext PyTorch's.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.train import (  # noqa: E402
    BATCH,
    LR,
    MOMENTUM,
    SEED,
    TASKS,
    Task,
    _accuracy,
    _parties,
    _round_seconds,
    plaintext_accuracy,
)
from mpcml.api.client import Client  # noqa: E402
from mpcml.api.job import Job  # noqa: E402
from mpcml.demo.cluster import LocalCluster  # noqa: E402
from mpcml.proto.v1 import coordinator_pb2 as cpb  # noqa: E402
from mpcml.transport.shaping import Shaping  # noqa: E402

HOLDERS = ("alice", "bob", "dave")
"""The feature parties, in the order the columns are split between them."""
LABELS = "carol"
WORKLOADS = {"logreg": TASKS[0], "MLP": TASKS[1]}


@dataclass(frozen=True)
class Setting:
    """One job: the workload, its parties (labels included), the batch, the network."""

    workload: str = "MLP"
    parties: int = 3
    batch: int = BATCH
    network: str = ""


BASE = Setting()
SWEEPS: dict[str, list[Setting]] = {
    "parties, logreg": [replace(BASE, workload="logreg", parties=n) for n in (2, 3, 4)],
    "parties, MLP": [replace(BASE, parties=n) for n in (2, 3, 4)],
    "batch, MLP": [replace(BASE, batch=n) for n in (32, 64, 128)],
    "delay, MLP": [replace(BASE, network=f"delay={d}ms") for d in (0, 5, 20)],
}
QUICK = {"parties, logreg": SWEEPS["parties, logreg"][:2]}


def _split_datasets(parties: Path) -> None:
    """Each workload's train and test columns split between 1, 2 and 3 feature parties."""
    dave = parties / "dave"
    (dave / "data").mkdir(parents=True)
    (dave / "party.toml").write_text(
        'name = "dave"\ndata_address = "127.0.0.1:7104"\ncoordinator = "127.0.0.1:7000"\n'
        'dealer = "127.0.0.1:7200"\nstate_dir = "state"\nresults_dir = "results"\n'
        '[policy]\nsubmitters = ["analyst"]\ndatasets = "*"\nmin_rows = 32\ngraphs = "*"\n'
        'outputs_to = { predictions = ["carol"], weights = ["carol"], '
        'metrics = ["carol", "coordinator"] }\n'
        '[tls]\nca = "../certs/ca.pem"\ncert = "../certs/dave.pem"\nkey = "../certs/dave.key"\n'
    )
    for workload, task in WORKLOADS.items():
        split = task.split()
        for n in (1, 2, 3):
            bounds = np.linspace(0, split.x_train.shape[1], n + 1).astype(int)
            for k, holder in enumerate(HOLDERS[:n]):
                columns = slice(bounds[k], bounds[k + 1])
                for part, x, ids in (
                    ("train", split.x_train, split.id_train),
                    ("test", split.x_test, split.id_test),
                ):
                    name = f"{workload}-{part}-{n}"
                    file = f"{name}.npz"
                    np.savez(parties / holder / "data" / file, x=x[:, columns], id=ids)
                    with (parties / holder / "party.toml").open("a") as f:
                        f.write(f'\n[datasets.{name}]\npath = "data/{file}"\nid_column = "id"\n')


def job(client: Client, s: Setting) -> dict[str, Any]:
    """Train `s` 2 epochs through the daemons, then infer the test rows: its figures."""
    task: Task = WORKLOADS[s.workload]
    holders = HOLDERS[: s.parties - 1]
    n = len(holders)
    train = client.submit(
        Job.train(
            model=task.model(),
            features={h: f"{s.workload}-train-{n}" for h in holders},
            labels=task.labels,
            align_on="id",
            epochs=2,
            lr=LR,
            batch_size=s.batch,
            momentum=MOMENTUM,
            seed=SEED,
            loss=task.loss,
            reveal={"weights": [LABELS]},
        )
    )
    status = train.wait(timeout=3600)
    if status.state != cpb.COMPLETED:
        raise SystemExit(f"{s} failed: {status.reason}")
    result = train.result()
    epochs = _round_seconds(client, train.id)
    profiled = sum(c.seconds for c in result.profile)
    infer = client.submit(
        Job.infer(
            from_job=train.id,
            features={h: f"{s.workload}-test-{n}" for h in holders},
            align_on="id",
            reveal={"predictions": [LABELS]},
            batch_size=len(task.split().x_test),
        )
    )
    done = infer.wait(timeout=3600)
    if done.state != cpb.COMPLETED:
        raise SystemExit(f"{s} inference failed: {done.reason}")
    inferred = infer.result()
    link = Shaping.parse(s.network)
    rounds = result.communication_rounds / 2
    busiest = result.bytes_sent / 2 / s.parties  # the parties send alike
    return {
        "setting": asdict(s),
        "seconds": epochs[1],
        "first_epoch": epochs[0],
        "rounds": rounds,
        "mib": result.bytes_sent / 2 / 2**20,
        "floor": rounds * link.delay_s + (busiest / link.bytes_per_s if link.bytes_per_s else 0),
        "outside_compute": max(0.0, 1 - profiled / result.seconds) if result.seconds else 0.0,
        "infer_seconds": _round_seconds(client, infer.id)[0],
        "accuracy": _accuracy(task, inferred, LABELS),
    }


def _x(s: Setting, sweep: str) -> float:
    if sweep.startswith("delay"):
        return 1000 * Shaping.parse(s.network).delay_s
    return float(getattr(s, sweep.split(",")[0]))


def growth(rows: list[dict[str, Any]], sweep: str) -> str:
    """The exponent k of time ~ setting^k from the sweep's ends (delay: seconds per ms)."""
    first, last = rows[0], rows[-1]
    a, b = _x(Setting(**first["setting"]), sweep), _x(Setting(**last["setting"]), sweep)
    if sweep.startswith("delay"):
        slope = (last["seconds"] - first["seconds"]) / (b - a)
        return f"+{slope:.2f} s per ms of one-way delay ({last['rounds']:.0f} rounds an epoch)"
    k = math.log(last["seconds"] / first["seconds"]) / math.log(b / a)
    return f"time per epoch ~ {sweep.split(',')[0]}^{k:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="logreg at 2 and 3 parties, once")
    parser.add_argument("--repeats", type=int, default=3, help="jobs per setting (default 3)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    sweeps = QUICK if args.quick else SWEEPS
    began = time.monotonic()
    head = (
        f"{'sweep':<16} {'parties':>7} {'batch':>5} {'network':<12} {'s/epoch':>8} "
        f"{'spread':>11} {'rounds':>7} {'MiB':>7} {'floor s':>8} {'outside':>7} "
        f"{'infer s':>7} {'acc':>6} {'plain':>6}"
    )
    print("daemon jobs (job API, coordinator, dealer, mutual TLS), one machine, per epoch")
    print(head)
    print("-" * len(head))
    plain = {w: plaintext_accuracy(t) for w, t in WORKLOADS.items()}
    figures: dict[str, list[dict[str, Any]]] = {}
    done: dict[Setting, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mpcml-bench-consortium-") as tmp:
        root = Path(tmp)
        parties = _parties(root)
        _split_datasets(parties)
        for network in dict.fromkeys(s.network for ss in sweeps.values() for s in ss):
            work = root / f"run-{len(list(root.glob('run-*')))}"
            with LocalCluster(
                work, parties=(*HOLDERS, LABELS), parties_dir=parties, network=network
            ) as cluster:
                client = cluster.start()
                for sweep, settings in sweeps.items():
                    for s in settings:
                        if s.network != network or s in done:
                            continue
                        print(f"{sweep}: {s} ...", file=sys.stderr, flush=True)
                        runs = [job(client, s) for _ in range(args.repeats)]
                        times = sorted(r["seconds"] for r in runs)
                        done[s] = {**runs[0], "seconds": statistics.median(times), "spread": times}
            shutil.rmtree(work, ignore_errors=True)
        for sweep, settings in sweeps.items():
            rows = [done[s] for s in settings]
            for s, r in zip(settings, rows, strict=True):
                times = r["spread"]
                spread = f"{times[0]:.2f}-{times[-1]:.2f}" if len(times) > 1 else ""
                print(
                    f"{sweep:<16} {s.parties:>7} {s.batch:>5} {s.network or 'loopback':<12} "
                    f"{r['seconds']:>8.2f} {spread:>11} {r['rounds']:>7.0f} {r['mib']:>7.1f} "
                    f"{r['floor']:>8.2f} {100 * r['outside_compute']:>6.0f}% "
                    f"{r['infer_seconds']:>7.2f} {r['accuracy']:>6.3f} {plain[s.workload]:>6.3f}"
                )
            print(f"  {growth(rows, sweep)}")
            figures[sweep] = rows
    print(
        f"s/epoch: the median of {args.repeats} jobs' second epochs (spread: fastest-slowest); "
        "outside: the share of the job's run time outside the workers' profiled compute (job "
        "start, set-up, data loading, round hand-offs); acc: secure test accuracy, plain: "
        "plaintext PyTorch's, same rows and initial weights"
    )
    print(f"({time.monotonic() - began:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"plain": plain, "sweeps": figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
