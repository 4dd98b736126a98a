"""A daemon job with alice on a GPU against the same job with every party on the CPU.

Not part of `make bench`: on a machine without a GPU it can only set the CPU beside the CUDA
emulation (`cuda_emulation = true`: the GPU path's code with its data on the CPU, which is slower
than the CPU by construction and says nothing about a GPU's speed). `scripts/gpu-check` runs it.

Each placement of alice (`cpu`, `cuda:0` where there is one, `cuda:0` emulated) gets a fresh
deployment on loopback (coordinator, dealer, three party daemons, mutual TLS: bench/train.py's
parties), bob and carol on the CPU. Each model of bench/train.py, and bench/estimate.py's ReLU
CNN, is trained for one epoch and then run on the test rows from the kept model. Per job: the
seconds from submission to completion, alice's worker's peak resident memory, and the largest
difference of its predictions from the all-CPU run's (the same model and data; the job ids,
hence the randomness, differ, so the fixed-point rounding does too).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.estimate import Case, cases  # noqa: E402
from bench.train import _parties  # noqa: E402
from mpcml.api.client import Client  # noqa: E402
from mpcml.api.job import Job  # noqa: E402
from mpcml.demo.cluster import LocalCluster  # noqa: E402
from mpcml.demo.run import predictions  # noqa: E402
from mpcml.proto.v1 import coordinator_pb2 as cpb  # noqa: E402

MIB = 2**20
CASES = ("logreg, breast cancer", "Tanh MLP, digits", "CNN, digits", "ReLU CNN, digits")
PLACEMENTS = {
    "cpu": 'device = "cpu"\n',
    "cuda:0": 'device = "cuda:0"\n',
    "cuda:0 emulated": 'device = "cuda:0"\ncuda_emulation = true\n',
}


def _job(client: Client, case: Case) -> dict[str, Any]:
    """Train `case` for one epoch, then infer the test rows; seconds, peaks, predictions."""
    out: dict[str, Any] = {}
    train = client.submit(case.train_job())
    for kind in ("train", "infer"):
        began = time.monotonic()
        handle = train
        if kind == "infer":
            handle = client.submit(
                Job.infer(
                    from_job=train.id,
                    features=case.test,
                    align_on="id",
                    reveal={"predictions": ["carol"]},
                )
            )
        status = handle.wait(timeout=3600)
        if status.state != cpb.COMPLETED:
            raise RuntimeError(f"{case.name} ({kind}): {status.reason}")
        result = handle.result()
        out[kind] = {
            "seconds": time.monotonic() - began,
            "alice_mib": result.peak_memory_bytes.get("alice", 0) / MIB,
            "device": result.devices.get("alice", "?"),
        }
        if kind == "infer":
            out["predictions"] = predictions(result, "carol")[0]
    return out


def run(placement: str, chosen: list[Case]) -> dict[str, dict[str, Any]]:
    """Every chosen case through one deployment with alice at `placement`."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mpcml-bench-gpu-party-") as tmp:
        root = Path(tmp)
        parties = _parties(root)
        toml = parties / "alice" / "party.toml"
        toml.write_text(toml.read_text().replace('device = "cpu"\n', PLACEMENTS[placement], 1))
        with LocalCluster(root / "cluster", parties_dir=parties, log_level="warning") as cluster:
            client = cluster.start()
            for case in chosen:
                try:
                    results[case.name] = _job(client, case)
                except RuntimeError as exc:
                    print(f"  alice on {placement}: {exc}", file=sys.stderr)
                    results[case.name] = {"failed": str(exc).splitlines()[0][:60]}
                print(f"  alice on {placement}: {case.name} done", file=sys.stderr, flush=True)
    return results


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=";".join(CASES), help="case names, ';' between")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.cases.split(";")]
    chosen = [c for c in cases(quick=True) if c.name in wanted]
    if len(chosen) != len(wanted):
        known = "; ".join(c.name for c in cases(quick=True))
        parser.error(f"unknown case in {args.cases!r}; the cases: {known}")
    placements = ["cpu", "cuda:0", "cuda:0 emulated"]
    if not torch.cuda.is_available():
        placements.remove("cuda:0")
        print(f"no CUDA device (torch {torch.__version__}): the cuda:0 column is not run")
    began = time.monotonic()
    runs = {p: run(p, chosen) for p in placements}
    header = ["model", "job", *(f"alice {p} s (peak MiB)" for p in placements)]
    header += [f"{p} / cpu" for p in placements[1:]]
    header += [f"{p}: max |pred - cpu's|" for p in placements[1:]]
    rows = []
    for case in chosen:
        for kind in ("train", "infer"):
            cells = [case.name, kind]
            got = [runs[p][case.name] for p in placements]
            for r in got:
                cells.append(
                    r["failed"]
                    if "failed" in r
                    else f"{r[kind]['seconds']:.1f} ({r[kind]['alice_mib']:.0f})"
                )
            base = got[0]
            for r in got[1:]:
                ok = "failed" not in r and "failed" not in base
                ratio = r[kind]["seconds"] / base[kind]["seconds"] if ok else float("nan")
                cells.append(f"{ratio:.2f}" if ok else "-")
            for r in got[1:]:
                ok = kind == "infer" and "failed" not in r and "failed" not in base
                diff = np.abs(r["predictions"] - base["predictions"]).max() if ok else None
                cells.append(f"{diff:.4f}" if diff is not None else "-")
            rows.append(cells)
    print("3 parties on one machine, mTLS over loopback, the dealer; bob and carol on the CPU;")
    print("seconds from submission to completion (one run each); peak: alice's worker's VmHWM.")
    print("Emulated CUDA runs the GPU path's code on the CPU: a check, not a speed figure.\n")
    print(_table(header, rows))
    print(f"\n{time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
