"""How secure training grows: time, rounds and bytes against parties, rows, width, batch, delay.

`make bench` runs this. One epoch of a ReLU MLP (64 features, one hidden layer, binary
cross-entropy, SGD) in `mpcml.session`: every party its own process on this machine, gRPC with
mutual TLS, mpcml's dealer; party 0 holds the features, the last party the labels. Each sweep
varies one setting from the base (3 parties, 512 rows, batches of 64, width 64, loopback) and
states the growth rate: the exponent k of time ~ setting^k, fitted on the sweep's ends. Every
row also gives the round-trip floor, rounds x one-way delay + this party's bytes / bandwidth,
on the emulated network (mpcml/transport/shaping.py); on loopback it is about zero, and what
the time holds above it is computation, the transport's own cost, and the parties' waiting on
one another on 2 shared cores. The stack sweep takes one layer of mpcml's away at a time (its
CrypTen patches, the dealer, TLS, the ChaCha20 share randomness) to show what each costs, and
ends with stock CrypTen (gloo, TFP) on the same epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sessions import peak_rss, run_parties  # noqa: E402
from bench.transport import Group  # noqa: E402
from mpcml.transport.shaping import Shaping  # noqa: E402
from tests.support.parties import make_pki  # noqa: E402

FEATURES = 64


@dataclass(frozen=True)
class Setting:
    """One run: the parties, the rows of the epoch, the batch, the hidden width, the network."""

    parties: int = 3
    rows: int = 512
    batch: int = 64
    width: int = 64
    network: str = ""
    stack: str = "mpcml"
    """What of mpcml's stack runs (STACKS)."""


STACKS = {
    "mpcml": "mutual TLS, mpcml's dealer, mpcml's CrypTen patches",
    "CrypTen's paths": "CrypTen's own config reads, A2B and share shells (compat.stock())",
    "TFP": "CrypTen's TFP provider instead of the dealer (INSECURE: party 0 learns inputs)",
    "TFP, no TLS": "TFP, and plaintext gRPC (insecure=True): against TFP, what TLS costs",
    "torch PRG": "share randomness from CrypTen's torch generators, not ChaCha20 (INSECURE)",
    "stock CrypTen": "CrypTen as shipped: torch.distributed/gloo, TFP, its launcher, no TLS",
}
"""The stack sweep: each row takes one layer of mpcml's away, to show what it costs."""


BASE = Setting()
SWEEPS: dict[str, list[Setting]] = {
    "parties": [replace(BASE, parties=n) for n in (2, 3, 4)],
    "rows": [replace(BASE, rows=n) for n in (256, 512, 1024)],
    "width": [replace(BASE, width=n) for n in (16, 64, 256)],
    "batch": [replace(BASE, batch=n) for n in (32, 64, 128)],
    "delay (one-way)": [replace(BASE, network=f"delay={d}ms") for d in (0, 5, 20)],
    "stack": [replace(BASE, stack=name) for name in STACKS],
}
QUICK = {
    "parties": SWEEPS["parties"][:2],
    "delay (one-way)": SWEEPS["delay (one-way)"][::2],
    "stack": SWEEPS["stack"],
}


def party(spec: dict[str, Any], session: Any) -> dict[str, Any]:
    """One party's epoch: seconds (barrier to barrier), rounds, the bytes it sent, peak memory."""
    import crypten
    import crypten.communicator as comm
    import torch

    s = Setting(**spec["setting"])
    if s.stack == "CrypTen's paths":
        from mpcml.runtime import compat

        compat.stock()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(s.rows, FEATURES, generator=generator)
    y = (x[:, :4].sum(1, keepdim=True) > 0).float()
    last = session.world_size - 1
    xs = crypten.cryptensor(x if session.rank == 0 else torch.zeros_like(x), src=0)
    ys = crypten.cryptensor(y if session.rank == last else torch.zeros_like(y), src=last)
    torch.manual_seed(0)
    model = crypten.nn.Sequential(
        crypten.nn.Linear(FEATURES, s.width), crypten.nn.ReLU(), crypten.nn.Linear(s.width, 1)
    ).encrypt(src=0)
    model.train()
    loss = crypten.nn.BCEWithLogitsLoss()
    crypten.cfg.communicator.verbose = True
    before = session.communication_stats()
    comm.get().barrier()
    began = time.perf_counter()
    for start in range(0, s.rows, s.batch):
        out = model(xs[start : start + s.batch])
        value = loss(out, ys[start : start + s.batch])
        model.zero_grad()
        value.backward()
        model.update_parameters(0.1)
    comm.get().barrier()
    seconds = time.perf_counter() - began
    after = session.communication_stats()
    return {
        "seconds": seconds,
        "rounds": after["rounds"] - before["rounds"],
        "bytes": after["bytes"] - before["bytes"],
        "peak_rss": peak_rss(),
    }


def run(tmp: Path, pki: dict[str, dict[str, str]], s: Setting, label: str) -> dict[str, Any]:
    """One setting's epoch: the slowest party's seconds, rounds, the most bytes a party sent."""
    if s.stack == "stock CrypTen":  # on loopback: the stack sweep's base
        with Group(tmp, label) as group:
            group.start({"role": "scaling-gloo", "setting": asdict(s), "world_size": s.parties})
            (launcher,) = group.wait(1800)
        return _figures(s, launcher["parties"])
    return _figures(s, _session_parties(tmp, pki, s, label))


def _session_parties(
    tmp: Path, pki: dict[str, dict[str, str]], s: Setting, label: str
) -> list[dict[str, Any]]:
    return run_parties(
        tmp,
        {n: pki[n] for n in list(pki)[: s.parties]},
        label,
        lambda rank: {
            "role": "scaling",
            "setting": asdict(s),
            "network": s.network,
            "insecure": s.stack == "TFP, no TLS",
            "torch_prg": s.stack == "torch PRG",
        },
        timeout=1800,
        provider="tfp" if s.stack.startswith("TFP") else "dealer",
    )


def _figures(s: Setting, parties: list[dict[str, Any]]) -> dict[str, Any]:
    link = Shaping.parse(s.network)
    rounds = max(p["rounds"] for p in parties)
    sent = max(p["bytes"] for p in parties)
    floor = rounds * link.delay_s + (sent / link.bytes_per_s if link.bytes_per_s else 0.0)
    return {
        "setting": asdict(s),
        "seconds": max(p["seconds"] for p in parties),
        "rounds": rounds,
        "mib": sent / 2**20,
        "floor": floor,
        "peak_mib": max(p["peak_rss"] for p in parties) / 2**20,
    }


def _value(s: Setting, sweep: str) -> float:
    if sweep == "delay (one-way)":
        return 1000 * Shaping.parse(s.network).delay_s
    return float(getattr(s, sweep))


def growth(rows: list[dict[str, Any]], sweep: str) -> str:
    """The exponent k of time ~ setting^k from the sweep's ends (delay: seconds per ms)."""
    first, last = rows[0], rows[-1]
    if sweep == "stack":
        base = first["seconds"]
        return "; ".join(
            f"{r['setting']['stack']}: {r['seconds'] / base:.2f}x the full stack's time"
            for r in rows[1:]
        )
    a = _value(Setting(**first["setting"]), sweep)
    b = _value(Setting(**last["setting"]), sweep)
    if sweep == "delay (one-way)":
        slope = (last["seconds"] - first["seconds"]) / (b - a)
        return f"+{slope:.2f} s per ms of delay ({last['rounds']} rounds)"
    k = math.log(last["seconds"] / first["seconds"]) / math.log(b / a)
    return f"time ~ {sweep}^{k:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 and 3 parties; 0 and 20 ms")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each setting: the median and the spread"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    sweeps = QUICK if args.quick else SWEEPS
    began = time.monotonic()
    figures: dict[str, list[dict[str, Any]]] = {}
    head = (
        f"{'sweep':<16} {'stack':<15} {'parties':>7} {'rows':>5} {'batch':>5} {'width':>5} "
        f"{'network':<12} {'seconds':>8} {'spread':>11} {'rounds':>7} {'MiB':>7} {'floor s':>8} "
        f"{'peak MiB':>8}"
    )
    print("one epoch of secure MLP training (mpcml.session, mutual TLS, dealer), this machine")
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory(prefix="mpcml-bench-scaling-") as tmp:
        pki = make_pki(Path(tmp) / "pki", [f"party{i}" for i in range(4)])
        for sweep, settings in sweeps.items():
            rows = []
            for k, s in enumerate(settings):
                print(f"{sweep} {k + 1}/{len(settings)} ...", file=sys.stderr, flush=True)
                runs = [
                    run(Path(tmp), pki, s, f"{sweep.split()[0]}-{k}-{n}")
                    for n in range(args.repeats)
                ]
                times = sorted(r["seconds"] for r in runs)
                r = {**runs[0], "seconds": statistics.median(times), "spread": times}
                rows.append(r)
                spread = f"{times[0]:.2f}-{times[-1]:.2f}" if len(times) > 1 else ""
                print(
                    f"{sweep:<16} {s.stack:<15} {s.parties:>7} {s.rows:>5} {s.batch:>5} "
                    f"{s.width:>5} "
                    f"{s.network or 'loopback':<12} {r['seconds']:>8.2f} {spread:>11} "
                    f"{r['rounds']:>7} {r['mib']:>7.1f} {r['floor']:>8.2f} {r['peak_mib']:>8.0f}",
                    flush=True,
                )
            print(f"  {growth(rows, sweep)}")
            figures[sweep] = rows
    print(
        "seconds: the median of the runs of the slowest party, barrier to barrier (spread: the "
        "fastest and slowest run); MiB: the most any party sent; floor: "
        "rounds x one-way delay + those bytes / bandwidth (the emulated network's; loopback 0); "
        "peak MiB: the largest peak resident memory of a party's process"
    )
    print("stack: " + "; ".join(f"{name}: {what}" for name, what in STACKS.items()))
    print(
        "Not swept here: the gRPC data plane against gloo and raw TCP (bench/transport.py), "
        "and the job API with the coordinator (bench/consortium.py: the share of each daemon "
        "job's time outside the workers' compute)."
    )
    print(f"({time.monotonic() - began:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
