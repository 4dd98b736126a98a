"""A job's estimate against what its run measures: peak memory per party, bytes and rounds.

`make bench` runs this. Each model is trained for one epoch through the daemons (the bench's
parties, mutual TLS, the dealer) and then runs inference on the test rows; the table puts
`JobStatus.estimate`, what the coordinator stored at submission, beside the workers' peak
resident memory (VmHWM, `JobResult.peak_memory_bytes`) and CrypTen's byte and round counts.
The models: bench/train.py's three, a ReLU MLP and a ReLU CNN with max pooling (comparisons),
two-layer models 2000, 20000 and 60000 units wide (the issue's kind of model, narrowed to fit
this machine), a model with a square hidden layer (2000 units: many parameters, few
activations) at batch 64 and 8, and torchvision's resnet18, alexnet and vgg11 run by bob's
private weights on alice's image (bench/models.py's set-up), inference only.

`--fit` fits the estimate's coefficients to these runs and writes mpcml/jobs/estimate.json:
memory as `worker + a x parameters + b x activations + c x tuples` per task kind and for rank 0
and the others (least squares, no negative coefficient), the products' bytes per operand and output
element, a comparison's bytes per element, the backward pass as a multiple of the forward
products, the optimizer's bytes per parameter; rounds as the runs count them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.optimize import nnls  # type: ignore[import-untyped]  # noqa: E402
from torch import nn  # noqa: E402

from bench.train import BATCH, LR, MOMENTUM, SEED, TASKS, _parties  # noqa: E402
from mpcml.api.client import Client  # noqa: E402
from mpcml.api.job import Job, row_shape  # noqa: E402
from mpcml.demo.cluster import LocalCluster  # noqa: E402
from mpcml.jobs import estimate  # noqa: E402
from mpcml.proto.v1 import coordinator_pb2 as cpb  # noqa: E402
from mpcml.proto.v1 import job_pb2 as jpb  # noqa: E402

MIB = 2**20
COMMAND = "python -m bench.estimate --fit"
BC = ({"alice": "bc-train", "bob": "bc-train"}, {"carol": "bc-train-labels"})
BC_TEST = {"alice": "bc-test", "bob": "bc-test"}
DIGITS = (
    {"alice": "digits-train-left", "bob": "digits-train-right"},
    {"carol": "digits-train-labels"},
)
DIGITS_TEST = {"alice": "digits-test-left", "bob": "digits-test-right"}
IMAGES = ({"alice": "digits-train-images"}, {"carol": "digits-train-labels"})
IMAGES_TEST = {"alice": "digits-test-images"}


class Square(nn.Sequential):
    """A hidden layer `width` x `width`: parameters grow with its square, activations not."""

    def __init__(self, width: int) -> None:
        super().__init__(
            nn.Linear(30, width), nn.Linear(width, width), nn.Linear(width, 1), nn.Sigmoid()
        )


class Wide(nn.Module):
    """Two linear layers `width` units wide: memory that grows with one line of Python."""

    def __init__(self, width: int, inputs: int = 30, outputs: int = 1) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(inputs, width), nn.Linear(width, outputs)
        self.head: nn.Module = nn.Sigmoid() if outputs == 1 else nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.b(self.a(x)))  # type: ignore[no-any-return]


def relu_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), nn.Softmax(dim=1))


def relu_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
        nn.Softmax(dim=1),
    )


@dataclass
class Case:
    """One model on the bench's parties."""

    name: str
    model: Any
    loss: str
    data: tuple[dict[str, str], dict[str, str]]
    test: dict[str, str]
    batch: int = BATCH

    def train_job(self, **reveal: list[str]) -> Job:
        """One epoch of training on the bench's hyper-parameters, rows aligned by id."""
        features, labels = self.data
        return Job.train(
            model=self.model(),
            features=features,
            labels=labels,
            align_on="id",
            epochs=1,
            lr=LR,
            batch_size=self.batch,
            momentum=MOMENTUM,
            seed=SEED,
            loss=self.loss,
            reveal=reveal,
        )


def cases(quick: bool = False) -> list[Case]:
    """The models the estimate is checked (and fitted) on."""
    out = [Case(t.name, t.model, t.loss, (t.features, t.labels), t.test_features) for t in TASKS]
    out += [
        Case("ReLU MLP, digits", relu_mlp, "cross_entropy", DIGITS, DIGITS_TEST),
        Case("ReLU CNN, digits", relu_cnn, "cross_entropy", IMAGES, IMAGES_TEST),
        Case("wide 2000", lambda: Wide(2000), "bce", BC, BC_TEST),
        Case("wide 20000", lambda: Wide(20000), "bce", BC, BC_TEST),
        Case("wide 20000, batch 256", lambda: Wide(20000), "bce", BC, BC_TEST, batch=256),
        Case("square 2000", lambda: Square(2000), "bce", BC, BC_TEST),
        Case("square 2000, batch 8", lambda: Square(2000), "bce", BC, BC_TEST, batch=8),
        Case(
            "wide 20000, 2 parties",
            lambda: Wide(20000, 64, 10),
            "cross_entropy",
            FLAT,
            {"alice": "digits-test-flat"},
        ),
    ]
    if not quick:
        out.append(Case("wide 60000", lambda: Wide(60000), "bce", BC, BC_TEST))
    return out


FLAT = ({"alice": "digits-train-flat"}, {"carol": "digits-train-labels"})


def _flat_digits(parties: Path) -> None:
    """Alice's images as flat rows, for a two-party wide model."""
    from mpcml.demo import data

    dg = data.digits()
    alice = parties / "alice"
    for split, x, ids in (("train", dg.x_train, dg.id_train), ("test", dg.x_test, dg.id_test)):
        np.savez(alice / "data" / f"digits_{split}_flat.npz", x=x, id=ids)
        with (alice / "party.toml").open("a") as f:
            f.write(
                f'\n[datasets.digits-{split}-flat]\npath = "data/digits_{split}_flat.npz"\n'
                'id_column = "id"\n'
            )


def _measure(client: Client, case: Case) -> dict[str, Any]:
    train = case.train_job(weights=["carol"])
    train = train.captured(row_shape(train.spec, client.parties()))
    out: dict[str, Any] = {"name": case.name}
    for kind in ("train", "infer"):
        job = train
        if kind == "infer":
            job = Job.infer(
                from_job=out["train"]["job_id"],
                features=case.test,
                align_on="id",
                reveal={"predictions": ["carol"]},
                batch_size=case.batch,
            )
        began = time.monotonic()
        handle = client.submit(job)
        status = handle.wait(timeout=3600)
        if status.state != cpb.COMPLETED:
            print(f"  {case.name} ({kind}) failed: {status.reason}", file=sys.stderr)
            out["failed"] = f"{kind}: {status.reason}"
            return out
        result = handle.result()
        spec = jpb.JobSpec.FromString(job.spec.SerializeToString())
        spec.graph.CopyFrom(train.spec.graph)
        spec.ClearField("parties")
        spec.parties.extend(status.parties)
        batches = max((c.calls for c in result.profile if not c.node.startswith("(")), default=1)
        n = len(status.parties)
        out[kind] = {
            "job_id": status.job_id,
            "seconds": time.monotonic() - began,
            "spec": spec.SerializeToString().hex(),
            "rows": status.rows,
            "parties": list(status.parties),
            "estimate": json.loads(_json(status.estimate)),
            "peak": dict(result.peak_memory_bytes),
            "bytes_per_batch": result.bytes_sent / n / batches,
            "rounds_per_batch": result.communication_rounds / batches,
            "profile": {
                c.node: (c.rounds / max(c.calls, 1), c.bytes / n / max(c.calls, 1), c.calls)
                for c in result.profile
            },
            "batches": batches,
        }
    return out


def _json(message: Any) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(message, preserving_proto_field_name=True)


def _infer_spec(infer: jpb.JobSpec, train: jpb.JobSpec) -> jpb.JobSpec:
    spec = jpb.JobSpec.FromString(infer.SerializeToString())
    spec.graph.CopyFrom(train.graph)
    return spec


ZOO = ["resnet18", "alexnet", "vgg11"]
"""Torchvision classifiers run by bob's private weights on alice's image (bench/models.py):
inference with many parameters and few activations."""


def _measure_zoo(client: Client, name: str) -> dict[str, Any]:
    from bench import zoo
    from bench.models import zoo_job

    job = zoo_job(name).captured(tuple(zoo.input_shape(name)))
    handle = client.submit(job)
    status = handle.wait(timeout=1800)
    if status.state != cpb.COMPLETED:
        print(f"  {name} failed: {status.reason}", file=sys.stderr)
        return {"name": name, "failed": status.reason}
    result = handle.result()
    spec = jpb.JobSpec.FromString(job.spec.SerializeToString())
    spec.parties.extend(status.parties)
    n = len(status.parties)
    return {
        "name": f"{name} (zoo)",
        "infer": {
            "job_id": status.job_id,
            "spec": spec.SerializeToString().hex(),
            "rows": status.rows,
            "parties": list(status.parties),
            "estimate": json.loads(_json(status.estimate)),
            "peak": dict(result.peak_memory_bytes),
            "bytes_per_batch": result.bytes_sent / n,
            "rounds_per_batch": result.communication_rounds,
            "profile": {},
            "batches": 1,
        },
    }


def run_zoo() -> list[dict[str, Any]]:
    """The `ZOO` models, through a cluster of their own."""
    from bench import models, zoo

    if zoo.torchvision() is None:
        print(f"  torchvision is not installed in {zoo.ZOO}: no zoo rows", file=sys.stderr)
        return []
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parties = models._parties(root, ZOO)
        with LocalCluster(root / "cluster", parties_dir=parties, log_level="warning") as cluster:
            client = cluster.start()
            for name in ZOO:
                measured = _measure_zoo(client, name)
                if "failed" not in measured:
                    results.append(measured)
                    print(f"  measured {name}", file=sys.stderr, flush=True)
    return results


def run(quick: bool) -> list[dict[str, Any]]:
    """Every case, train and infer, through one local cluster; then the zoo's."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parties = _parties(root)
        _flat_digits(parties)
        with LocalCluster(root / "cluster", parties_dir=parties, log_level="warning") as cluster:
            client = cluster.start()
            for case in cases(quick):
                measured = _measure(client, case)
                if "failed" not in measured:
                    results.append(measured)
                    print(f"  measured {case.name}", file=sys.stderr, flush=True)
    return results + run_zoo()


# --- fitting ------------------------------------------------------------------------------


def _nonneg(rows: list[list[float]], targets: list[float]) -> list[float]:
    solution, _ = nnls(np.array(rows, dtype=float), np.array(targets, dtype=float))
    return [float(v) for v in solution]


def fit(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The coefficients of mpcml/jobs/estimate.json from measured runs."""
    memory: dict[str, Any] = {}
    for kind in ("train", "infer"):
        groups: dict[str, tuple[list[list[float]], list[float]]] = {
            "rank0": ([], []),
            "other": ([], []),
        }
        for r in results:
            run_ = r.get(kind)
            if not run_:
                continue
            spec = jpb.JobSpec.FromString(bytes.fromhex(run_["spec"]))
            f = estimate.features(spec, len(run_["parties"]), run_["rows"])
            shares, own = estimate.data_bytes(spec, run_["rows"], f)
            for rank, party in enumerate(run_["parties"]):
                fixed = shares + own[party]
                group = groups["rank0" if rank == 0 else "other"]
                group[0].append([1.0, f.parameters, f.activations, f.largest_product])
                group[1].append(int(run_["peak"][party]) - fixed)
        memory[kind] = {}
        for name, (rows, targets) in groups.items():
            w, a, b, c = _nonneg(rows, targets)
            memory[kind][name] = {
                "worker": round(w / MIB, 1),
                "parameters": round(a, 2),
                "activations": round(b, 2),
                "tuples": round(c, 2),
            }
    communication: dict[str, Any] = {}
    for n in (2, 3):
        communication[str(n)] = _fit_communication(
            [r["train"] for r in results if "train" in r and len(r["train"]["parties"]) == n], n
        )
    return {
        "command": COMMAND,
        "note": (
            "memory: MiB (worker) and bytes per element (parameters, activations) of a job "
            "worker's peak resident memory; communication: bytes each party sends per element "
            "and rounds, as CrypTen counts them; fitted to runs of bench/estimate.py on one "
            "machine through the daemons"
        ),
        "memory": memory,
        "communication": communication,
    }


def _fit_communication(trains: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Bytes and rounds of each kind of node and phase, from training runs with `n` parties."""
    products: Fit = ([], [])
    comparisons: Fit = ([], [])
    nonlinear: Fit = ([], [])
    nonlinear_rounds: Fit = ([], [])
    heads: dict[str, tuple[list[float], list[float]]] = {}
    optimizer: Fit = ([], [])
    product_rounds: list[float] = []
    comparison_rounds: list[float] = []
    optimizer_rounds: list[float] = []
    found = []
    for run_ in trains:
        spec = jpb.JobSpec.FromString(bytes.fromhex(run_["spec"]))
        f = estimate.features(spec, n, run_["rows"])
        found.append(f)
        for node, (kind, operands, elements, table_bytes, table_rounds) in f.nodes.items():
            rounds, sent, _ = run_["profile"][node]
            if kind == "product":
                _add(products, [operands, elements], sent)
                product_rounds.append(rounds)
            elif kind == "comparison":
                _add(comparisons, [elements], sent)
                comparison_rounds.append(rounds)
            else:
                _add(nonlinear, [table_bytes], sent)
                _add(nonlinear_rounds, [table_rounds], rounds)
        gradient = run_["profile"]["(loss gradient)"]
        if f.head:
            per_element, rounds = heads.setdefault(f.head, ([], []))
            per_element.append(gradient[1] / max(f.head_elements, 1))
            rounds.append(gradient[0])
        _add(optimizer, [f.parameters], run_["profile"]["(optimizer)"][1])
        optimizer_rounds.append(run_["profile"]["(optimizer)"][0])
    pi, po = _nonneg(*products)
    (comparison,) = _nonneg(*comparisons) if comparisons[0] else (0.0,)
    backward: Fit = ([], [])
    backward_rounds: Fit = ([], [])
    for run_, f in zip(trains, found, strict=True):
        sent = run_["profile"]["(backward)"]
        _add(backward, [pi * f.product_inputs + po * f.product_outputs, f.comparisons], sent[1])
        _add(backward_rounds, [f.products + f.comparison_nodes], sent[0])
    k, kc = _nonneg(*backward)
    return {
        "product_input": round(pi, 3),
        "product_output": round(po, 3),
        "product_rounds": statistics.median(product_rounds),
        "comparison": round(comparison, 2),
        "comparison_rounds": statistics.median(comparison_rounds or [0.0]),
        "comparison_backward": round(kc, 2),
        "nonlinear": round(_nonneg(*nonlinear)[0], 3) if nonlinear[0] else 1.0,
        "nonlinear_rounds": round(_nonneg(*nonlinear_rounds)[0], 3) if nonlinear[0] else 1.0,
        "head": {
            name: [round(statistics.median(b), 2), statistics.median(r)]
            for name, (b, r) in sorted(heads.items())
        },
        "backward": round(k, 3),
        "backward_rounds": round(_nonneg(*backward_rounds)[0], 3),
        "optimizer": round(_nonneg(*optimizer)[0], 3),
        "optimizer_rounds": statistics.median(optimizer_rounds),
    }


Fit = tuple[list[list[float]], list[float]]
"""Rows of features and the measured values they should give."""


def _add(fit_: Fit, row: list[float], value: float) -> None:
    fit_[0].append([float(v) for v in row])
    fit_[1].append(float(value))


# --- the table ----------------------------------------------------------------------------


def _ratio(estimated: float, measured: float) -> str:
    return f"{estimated / measured:.2f}" if measured else "-"


def _local(run_: dict[str, Any]) -> dict[str, Any]:
    """The estimate computed here, for measurements saved before the status carried it."""
    spec = jpb.JobSpec.FromString(bytes.fromhex(run_["spec"]))
    found = estimate.estimate(spec, run_["rows"]).to_proto()
    return dict(json.loads(_json(found)))


def report(results: list[dict[str, Any]], local: bool = False) -> str:
    """Estimate against measurement, each model and task; the ratio is estimate / measured."""
    lines = [
        f"{'model':<24} {'task':<6} {'peak MiB est/meas (ratio) per party':<58} "
        f"{'MiB/batch est/meas':>20} {'ratio':>6} {'rounds/batch est/meas':>22}",
    ]
    ratios: list[float] = []
    for r in results:
        for kind in ("train", "infer"):
            run_ = r.get(kind)
            if not run_:
                continue
            e = _local(run_) if local or not run_["estimate"] else run_["estimate"]
            peaks = []
            for party in run_["parties"]:
                est = int(e.get("peak_memory_bytes", {}).get(party, 0))
                meas = int(run_["peak"][party])
                ratios.append(est / meas if meas else 0.0)
                peaks.append(f"{party} {est / MIB:.0f}/{meas / MIB:.0f} ({_ratio(est, meas)})")
            b_est = int(e.get("bytes_per_batch", 0))
            lines.append(
                f"{r['name']:<24} {kind:<6} {', '.join(peaks):<58} "
                f"{b_est / MIB:>9.2f}/{run_['bytes_per_batch'] / MIB:<10.2f} "
                f"{_ratio(b_est, run_['bytes_per_batch']):>6} "
                f"{int(e.get('rounds_per_batch', 0)):>10}/{run_['rounds_per_batch']:<11.1f}"
            )
    if ratios:
        lines.append(
            f"peak memory, estimate / measured: {min(ratios):.2f} to {max(ratios):.2f} "
            f"over {len(ratios)} workers"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="write mpcml/jobs/estimate.json")
    parser.add_argument("--quick", action="store_true", help="leave out the 60000-wide model")
    parser.add_argument("--add-zoo", action="store_true", help="with --load: run the zoo, add it")
    parser.add_argument("--save", type=Path, help="write the measurements here (JSON)")
    parser.add_argument("--load", type=Path, help="use saved measurements instead of running")
    parser.add_argument(
        "--local", action="store_true", help="estimate here with the current coefficients"
    )
    args = parser.parse_args(argv)
    results = json.loads(args.load.read_text()) if args.load else run(args.quick)
    if args.load and args.add_zoo:
        results = [r for r in results if not r["name"].endswith("(zoo)")] + run_zoo()
    if args.save:
        args.save.write_text(json.dumps(results))
    if args.fit:
        estimate.TABLE.write_text(json.dumps(fit(results), indent=1) + "\n")
        print(f"wrote {estimate.TABLE}")
        return 0
    print("Resource estimate against measured runs (one epoch each; estimate / measured)")
    print(report(results, args.local))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
