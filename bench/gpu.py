"""Secure inference and training of CNNs on GPU and CPU, beside CryptGPU's and Piranha's figures.

Not part of `make bench` (its CPU rows alone take minutes). Three parties in `mpcml.session` on
one machine, each its own process (bench/sessions.py's `run_parties`, bench/party.py's `gpu-model`
role), over gRPC with mutual TLS, on mpcml's dealer unless `--provider tfp`:

- LeNet (MNIST shape, 1x28x28): inference at batch 1, one training iteration at batch 128;
- AlexNet and VGG16 (CIFAR-10 shape, 3x32x32): inference at batch 1; VGG16 one training
  iteration at batch 32.

Per row: seconds (the slowest party, barrier to barrier, median of `--reps` after `--warmup`),
MiB each party sent (CrypTen's count, plus what it took from the dealer), peak GPU memory per
party. GPU rows put every party on `cuda:(rank % devices)`: with one GPU, all three share it
and the loopback network costs next to nothing, unlike the published set-ups (a GPU per party,
a LAN between them). CPU rows run LeNet only unless `--big-on-cpu`. Without CUDA the GPU rows
are reported as not run, with the reason. Last, a micro-table: block matmul and convolution
(runtime/blocks.py, float64) against torch's int64 on CPU, and on CUDA when present.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.sessions import open_session, run_parties  # noqa: E402
from bench.transport import BenchError  # noqa: E402
from tests.support.parties import make_pki  # noqa: E402

PARTIES = 3
MIB = 1 << 20


@dataclass(frozen=True)
class Workload:
    """One row: a model, inference or one training iteration, a batch size."""

    model: str
    task: str
    batch: int
    big: bool
    """Run on CPU only with --big-on-cpu."""


WORKLOADS = [
    Workload("LeNet", "inference", 1, False),
    Workload("LeNet", "training", 128, False),
    Workload("AlexNet", "inference", 1, True),
    Workload("VGG16", "inference", 1, True),
    Workload("VGG16", "training", 32, True),
]

PUBLISHED: dict[tuple[str, str], tuple[float, float]] = {
    ("LeNet", "inference"): (0.38, 0.031),
    ("LeNet", "training"): (2.21, 0.888),
    ("VGG16", "inference"): (2.14, 0.469),
    ("VGG16", "training"): (12.14, 7.47),
}
"""Seconds as published: (CryptGPU, Piranha), 3 parties, one GPU each, over a LAN."""

SHAPES = {"LeNet": (1, 28, 28), "AlexNet": (3, 32, 32), "VGG16": (3, 32, 32)}


def lenet() -> nn.Module:
    """LeNet as CryptGPU and Falcon run it on MNIST."""
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10),
    )  # fmt: skip


def alexnet() -> nn.Module:
    """AlexNet for 32x32 inputs (CIFAR-10): five convolutions, three linear layers."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=2, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 192, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 4096), nn.ReLU(),
        nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10),
    )  # fmt: skip


def vgg16() -> nn.Module:
    """VGG16 for 32x32 inputs: 13 3x3 convolutions (up to 512 channels), three linear layers."""
    layers: list[nn.Module] = []
    channels = 3
    for width in [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0]:
        if width == 0:
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
    layers += [nn.Flatten(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


MODELS: dict[str, Callable[[], nn.Module]] = {"LeNet": lenet, "AlexNet": alexnet, "VGG16": vgg16}


# -- one party (run by bench/party.py's `gpu-model` role) ---------------------------------------


def party(spec: dict[str, Any]) -> dict[str, Any]:
    """One party's seconds, bytes and peak GPU memory for each workload of `spec`."""
    import crypten
    import crypten.communicator as comm

    rows = []
    with open_session(spec) as session:
        crypten.cfg.communicator.verbose = True  # count bytes
        device = torch.device(spec["device"])
        for item in spec["workloads"]:
            work = Workload(**item)
            times, sent, peak = [], [], []
            model = _model(work, device)
            for _ in range(spec["warmup"] + spec["reps"]):
                x, y = _inputs(work, device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                before = session.communication_stats()
                comm.get().barrier()
                began = time.perf_counter()
                _step(work, model, x, y)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                comm.get().barrier()
                times.append(time.perf_counter() - began)
                after = session.communication_stats()
                sent.append(
                    after["bytes"]
                    - before["bytes"]
                    + after["dealer_bytes"]
                    - before["dealer_bytes"]
                )
                peak.append(torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0)
            skip = spec["warmup"]
            rows.append({"times": times[skip:], "bytes": sent[skip:], "peak": max(peak[skip:])})
    return {"rows": rows}


def _model(work: Workload, device: torch.device) -> Any:
    import crypten

    torch.manual_seed(0)
    dummy = torch.zeros(1, *SHAPES[work.model])
    model = crypten.nn.from_pytorch(MODELS[work.model](), dummy).encrypt(src=0).to(device)
    return model.train() if work.task == "training" else model.eval()


def _inputs(work: Workload, device: torch.device) -> tuple[Any, Any]:
    import crypten

    x = torch.randn(work.batch, *SHAPES[work.model])
    labels = torch.nn.functional.one_hot(torch.randint(0, 10, (work.batch,)), 10).float()
    return (
        crypten.cryptensor(x, src=1, device=device),
        crypten.cryptensor(labels, src=PARTIES - 1, device=device),
    )


def _step(work: Workload, model: Any, x: Any, y: Any) -> None:
    import crypten

    if work.task == "inference":
        with crypten.no_grad():
            model(x)
        return
    loss = crypten.nn.CrossEntropyLoss()(model(x), y)
    model.zero_grad()
    loss.backward()
    model.update_parameters(0.01)


# -- the driver --------------------------------------------------------------------------------


def run_row(
    tmp: Path,
    pki: dict[str, dict[str, str]],
    device: str,
    work: Workload,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One workload on 3 party processes on `device` ("cpu" or "cuda"), in a session of its own.

    Raises BenchError (with the failing party's log) on a failure or after `--row-timeout`.
    """
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    threads = args.threads or (1 if device == "cpu" else 4)
    label = f"{work.model}-{work.task}-{device}"

    parties = run_parties(
        tmp,
        pki,
        f"gpu-bench-{label}",
        lambda rank: {
            "role": "gpu-model",
            "workloads": [asdict(work)],
            "reps": args.reps,
            "warmup": args.warmup,
        },
        args.row_timeout,
        provider=args.provider,
        device=lambda rank: f"cuda:{rank % gpus}" if gpus else "cpu",
        threads=threads,
    )
    per_party = [p["rows"][0] for p in parties]
    reps = zip(*(r["times"] for r in per_party), strict=True)
    return {
        "seconds": statistics.median(max(rep) for rep in reps),
        "mib": [statistics.median(r["bytes"]) / MIB for r in per_party],
        "peak_mib": [r["peak"] / MIB for r in per_party],
    }


def micro_rows(device: str) -> list[list[str]]:
    """Block products (float64) against torch's int64 on CPU, per shape: milliseconds.

    Convolutions in both layouts of runtime/blocks.py: one grouped convolution over the block
    pairs, and one dense convolution over all blocks x all blocks; each checked exact.
    """
    from mpcml.runtime import blocks

    def ring(*shape: int) -> torch.Tensor:
        return torch.randint(-(2**63), 2**63 - 1, shape)

    Case = tuple[str, str, Callable[[], Any], Callable[[], Any] | None, Callable[[], Any]]
    cases: list[Case] = []
    for m, n, p in [(256, 256, 256), (64, 4096, 64)]:
        a, b = ring(m, n), ring(n, p)
        mm = functools.partial(blocks.matmul, a, b, device=device)
        product = functools.partial(torch.matmul, a, b)
        cases.append((f"matmul {m}x{n}x{p}", str(blocks.plan(n)), mm, None, product))
    for channels, groups, size in [(64, 1, 16), (256, 1, 8), (512, 1, 4), (256, 256, 16)]:
        x = ring(8, channels, size, size)
        w = ring(channels, channels // groups, 3, 3)
        label = f"conv3x3 {channels}ch {size}x{size} b8" + (" depthwise" if groups > 1 else "")
        kw: dict[str, Any] = {"padding": 1, "groups": groups, "device": device}
        pairs = functools.partial(blocks.conv2d, x, w, **kw)
        dense = functools.partial(blocks.conv2d, x, w, dense=True, **kw)
        int64 = functools.partial(torch.conv2d, x, w, padding=1, groups=groups)
        plan = str(blocks.plan(channels // groups * 9, 9))
        cases.append((label, plan, pairs, dense, int64))
    rows = []
    for label, plan, ours, other, reference in cases:
        expected = reference()
        exact = torch.equal(ours().cpu(), expected)
        if other is not None:
            exact = exact and torch.equal(other().cpu(), expected)
        dense_ms = _ms(other, device) if other is not None else "-"
        rows.append(
            [
                label,
                plan,
                _ms(ours, device),
                dense_ms,
                _ms(reference, "cpu"),
                "yes" if exact else "NO",
            ]
        )
    return rows


def _ms(fn: Callable[[], Any], device: str) -> str:
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(3):
        began = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - began)
    return f"{1000 * min(times):.1f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _cells(work: Workload, device: str, result: dict[str, Any] | str) -> list[str]:
    published = PUBLISHED.get((work.model, work.task))
    theirs = [f"{published[0]:g}", f"{published[1]:g}"] if published else ["-", "-"]
    head = [work.model, work.task, str(work.batch), device]
    if isinstance(result, str):
        return [*head, result, "", "", *theirs]
    mib = "/".join(f"{m:.0f}" for m in result["mib"])
    peak = "/".join(f"{m:.0f}" for m in result["peak_mib"]) if device == "cuda" else "-"
    return [*head, f"{result['seconds']:.3f}", mib, peak, *theirs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1, help="timed repetitions per row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    parser.add_argument("--big-on-cpu", action="store_true", help="AlexNet and VGG16 on CPU too")
    parser.add_argument("--no-cpu", action="store_true", help="GPU rows only")
    parser.add_argument("--no-micro", action="store_true", help="no block micro-table")
    parser.add_argument("--models", default="LeNet,AlexNet,VGG16", help="comma-separated")
    parser.add_argument("--provider", choices=["dealer", "tfp"], default="dealer")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per party")
    parser.add_argument("--row-timeout", type=float, default=900.0, help="seconds per row")
    args = parser.parse_args(argv)
    # The cheap rows first: a run cut short still has them (each is also logged as it ends).
    chosen = sorted(
        (w for w in WORKLOADS if w.model in args.models.split(",")),
        key=lambda w: (w.task == "training", w.big),
    )
    cuda = torch.cuda.is_available()
    began = time.monotonic()
    gpus = torch.cuda.device_count() if cuda else 0
    where = f"{gpus} GPU(s), {torch.cuda.get_device_name(0)}" if cuda else "no GPU on this machine"
    micro_device = "cuda" if cuda else "cpu"
    if not args.no_micro:
        print(f"block products (runtime/blocks.py) on {micro_device}, int64 reference on cpu:")
        micro = micro_rows(micro_device)
        print(
            _table(["shape", "plan", f"blocks {micro_device} ms", "int64 cpu ms", "exact"], micro)
        )
        print(flush=True)
    plan: list[tuple[Workload, str, str | None]] = []
    for w in chosen:
        why = None if cuda else f"not run: no CUDA device (torch {torch.__version__})"
        plan.append((w, "cuda", why))
    if not args.no_cpu:
        for w in chosen:
            plan.append(
                (w, "cpu", None if args.big_on_cpu or not w.big else "skipped (--big-on-cpu)")
            )
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="mpcml-bench-gpu-") as tmp:
        pki = make_pki(Path(tmp) / "pki", [f"party{i}" for i in range(PARTIES)])
        for work, device, why in plan:
            result: dict[str, Any] | str
            if why is not None:
                result = why
            else:
                try:
                    result = run_row(Path(tmp), pki, device, work, args)
                except BenchError as exc:
                    print(exc, file=sys.stderr)
                    result = f"FAILED: {str(exc).splitlines()[0][:60]}"
            rows.append(_cells(work, device, result))
            print("  ".join(rows[-1][:7]), file=sys.stderr, flush=True)
    header = ["model", "task", "batch", "device", "seconds", "MiB per party",
              "peak GPU MiB per party", "CryptGPU s", "Piranha s"]  # fmt: skip
    print(f"3 parties on one machine ({where}), provider {args.provider}, mTLS over loopback;")
    print("all parties on one GPU: no network cost (the published figures: one GPU per party,")
    print("over a LAN). seconds: slowest party, median of", args.reps, "after", args.warmup)
    print(
        "warm-up; MiB: CrypTen's count of its traffic plus the dealer's, per party (rank 0/1/2).\n"
    )
    print(_table(header, rows))
    print(f"\n{time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
