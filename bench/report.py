"""The benchmark report: every benchmark of bench/ in one run, written to bench/REPORT.md.

`make bench` runs this (`make bench QUICK=1`: the smallest workloads, on LAN and WAN, within
about 10 minutes on 2 cores). Each benchmark is its own script, run here as a subprocess
exactly as the report says; those that write figures (`--json`) are also plotted. Written:
`bench/REPORT.md` (each section: the command, its table as printed, its plots),
`bench/report/*.png` (matplotlib) and `bench/results.json` (every figure, raw).

The WAN rows run mpcml with the delay and bandwidth imposed by its own transport
(mpcml/transport/shaping.py), and stock CrypTen with a sleep of the same length at each round
it counts (its gloo path has no hook of its own): these machines have no traffic shaping.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench"
# Run as a script, bench/ leads sys.path, and bench/transformers.py would shadow Hugging Face's.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))
WAN = "rtt=40ms,bandwidth=352mbit"
"""TF Encrypted's ABY3 setting: 40 ms round trip, 352 Mbit/s."""


@dataclass(frozen=True)
class Suite:
    """One benchmark run: a script of bench/ and its arguments."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    figures: bool = False
    """The script takes `--json FILE`."""
    quick: bool = False
    """Part of `make bench QUICK=1`."""

    def command(self, quick: bool, smoke: bool = False) -> list[str]:
        """The command line, as the report prints it."""
        args = list(self.args)
        if (quick or smoke) and self.script in ("train.py", "transformers.py"):
            args += ["--only", "0"]  # logistic regression; small BERT
        if (quick or smoke) and self.script in ("scaling.py", "consortium.py", "estimate.py"):
            args += ["--quick"]
        if not (quick or smoke) and self.script == "transformers.py":
            args += ["--parties", "2", "3", "4"]
        if not smoke and "--network" in args:
            args += ["--epochs", "2"]  # stock CrypTen takes 70 s an epoch of logreg on WAN
        if smoke and self.script == "train.py":
            args += ["--epochs", "2", "--mpcml-only", "--variants", "fused"]
        return ["python", f"bench/{self.script}", *args]


CONSORTIUM = Suite(
    "Daemon jobs: parties, batch size, delay", "consortium.py", figures=True, quick=True
)
SUITES = [
    Suite("Training and inference, loopback (LAN)", "train.py", figures=True, quick=True),
    Suite(
        f"Training and inference, emulated WAN ({WAN})",
        "train.py",
        ("--network", WAN, "--variants", "fused"),
        figures=True,
        quick=True,
    ),
    Suite("Transformers, loopback", "transformers.py", figures=True, quick=True),
    Suite("Scaling: parties, rows, width, batch, delay", "scaling.py", figures=True, quick=True),
    CONSORTIUM,
    Suite("The data plane", "transport.py"),
    Suite("Failure detection", "failure_detection.py"),
    Suite("Share randomness (PRG)", "prg.py"),
    Suite("Private set intersection", "psi.py", figures=True),
    Suite("Load", "load.py"),
    Suite("Model zoo", "models.py"),
    Suite("Resource estimates against measured runs", "estimate.py", quick=True),
]


def run(suite: Suite, quick: bool, index: int, total: int, smoke: bool = False) -> dict[str, Any]:
    """Run one suite; its printed table, its figures, its seconds."""
    command = suite.command(quick, smoke)
    print(f"[{index}/{total}] {suite.name}: {' '.join(command)}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="mpcml-report-") as tmp:
        figures_file = Path(tmp) / "figures.json"
        argv = [sys.executable, *command[1:]]
        if suite.figures:
            argv += ["--json", str(figures_file)]
        began = time.monotonic()
        process = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        progress = _Progress(f"[{index}/{total}]", began)
        out, err = process.communicate() if not sys.stderr.isatty() else progress.follow(process)
        seconds = time.monotonic() - began
        figures = json.loads(figures_file.read_text()) if figures_file.exists() else None
    if process.returncode:
        tail = "\n".join(err.strip().splitlines()[-20:])
        print(f"  failed (exit {process.returncode}):\n{tail}", file=sys.stderr)
    print(f"  done in {seconds:.0f} s", file=sys.stderr, flush=True)
    return {
        "name": suite.name,
        "command": " ".join(command),
        "returncode": process.returncode,
        "table": out.rstrip(),
        "error": "" if not process.returncode else err.strip()[-4000:],
        "figures": figures,
        "seconds": seconds,
    }


class _Progress:
    """A one-line progress display on a terminal: elapsed time and the script's last word."""

    def __init__(self, label: str, began: float) -> None:
        self.label, self.began = label, began

    def follow(self, process: subprocess.Popen[str]) -> tuple[str, str]:
        assert process.stderr is not None and process.stdout is not None
        lines: list[str] = []
        for line in process.stderr:
            lines.append(line)
            elapsed = time.monotonic() - self.began
            print(f"\r{self.label} {elapsed:6.0f} s  {line.strip()[:60]:<60}", end="", flush=True)
        print(file=sys.stderr)
        return process.stdout.read(), "".join(lines)


# --- plots ------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(lan: dict[str, Any], wan: dict[str, Any] | None, folder: Path) -> list[str]:
    """Seconds per epoch per system (and mpcml on WAN), and mpcml's time by layer."""
    plt = _pyplot()
    written = []
    tasks = lan["tasks"]
    fig, ax = plt.subplots(figsize=(8, 4))
    systems: list[tuple[str, Callable[[str], float | None]]] = [
        ("stock CrypTen", lambda i: lan["stock"].get(i, {}).get("epoch_seconds")),
        ("SPU", lambda i: _spu(lan, i)),
        ("mpcml (fused)", lambda i: lan["ours"][i].get("fused", {}).get("epoch_seconds")),
        ("mpcml (fused + tuned)", lambda i: lan["ours"][i].get("tuned", {}).get("epoch_seconds")),
    ]
    if wan is not None:
        systems.append(
            (
                f"mpcml (fused), WAN {WAN}",
                lambda i: wan["ours"].get(i, {}).get("fused", {}).get("epoch_seconds"),
            )
        )
    width = 0.8 / len(systems)
    for k, (label, value) in enumerate(systems):
        colour = plt.cm.tab10(k)
        xs, ys = [], []
        for n, i in enumerate(tasks):
            v = value(i)
            if v is not None:
                xs.append(n + k * width)
                ys.append(v)
        ax.bar(xs, ys, width, label=label, color=colour)
    ax.set_xticks([n + width * (len(systems) - 1) / 2 for n in range(len(tasks))])
    ax.set_xticklabels([tasks[i] for i in tasks])
    ax.set_ylabel("seconds per epoch (log)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"Training time per epoch, 3 parties (CNN: 2), one machine, {lan['network']}")
    fig.tight_layout()
    fig.savefig(folder / "training.png", dpi=100)
    written.append("training.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for n, i in enumerate(tasks):
        fused = lan["ours"][i].get("fused")
        if not fused:
            continue
        bottom = 0.0
        per_op: dict[str, float] = {}
        for _, op, _, share in fused["layers"]:
            per_op[op] = per_op.get(op, 0.0) + share
        for op, share in sorted(per_op.items(), key=lambda kv: -kv[1]):
            seconds = share * fused["median_batch"]
            ax.bar(n, seconds, 0.6, bottom=bottom, label=op if n == 0 else None)
            bottom += seconds
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([tasks[i] for i in tasks])
    ax.set_ylabel("seconds per training batch")
    ax.set_title("Where a training batch's time goes (mpcml, fused gradient, party 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "training-layers.png", dpi=100)
    written.append("training-layers.png")
    plt.close(fig)

    from bench.train import VARIANTS  # the variants' labels, as train.py prints them

    fig, ax = plt.subplots(figsize=(8, 4))
    accuracies: list[tuple[str, Callable[[str], float | None]]] = [
        ("plaintext PyTorch", lambda i: lan["plain"][i]),
        ("stock CrypTen", lambda i: lan["stock"].get(i, {}).get("accuracy")),
        *[
            (VARIANTS[v], lambda i, v=v: lan["ours"][i].get(v, {}).get("accuracy"))
            for v in VARIANTS
        ],
    ]
    width = 0.8 / len(accuracies)
    for k, (label, value) in enumerate(accuracies):
        points = [(n + k * width, value(i)) for n, i in enumerate(tasks)]
        kept = [(x, y) for x, y in points if y is not None]
        ax.bar(
            [x for x, _ in kept], [y for _, y in kept], width, label=label, color=plt.cm.tab10(k)
        )
    ax.set_xticks([n + width * (len(accuracies) - 1) / 2 for n in range(len(tasks))])
    ax.set_xticklabels([tasks[i] for i in tasks])
    ax.set_ylim(0.5, 1.0)
    ax.set_ylabel("test accuracy after training")
    ax.set_title(
        f"Secure against plaintext accuracy, the same rows and settings ({lan['network']})"
    )
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(folder / "accuracy.png", dpi=100)
    written.append("accuracy.png")
    plt.close(fig)
    return written


def _spu(lan: dict[str, Any], i: str) -> float | None:
    peer = lan["spu"].get(i)
    return peer.get("epoch_seconds") if isinstance(peer, dict) else None


def plot_transformers(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    """Seconds per model and plan, stacked by op (party 0's profile)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = []
    ops = sorted({op for r in rows for op in r["ops"]})
    colours = {op: plt.cm.tab20(k % 20) for k, op in enumerate(ops)}
    for n, r in enumerate(rows):
        parties = r.get("parties", 3)
        labels.append(
            f"{r['model'].split(' (')[0]}\n{r['plan']}" + (f", {parties}p" if parties != 3 else "")
        )
        bottom = 0.0
        for op, (seconds, _, _) in sorted(r["ops"].items(), key=lambda kv: -kv[1][0]):
            ax.bar(n, seconds, 0.6, bottom=bottom, color=colours[op])
            bottom += seconds
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[op]) for op in ops]
    names = [op.removeprefix("aten.").removesuffix(".default") for op in ops]
    ax.legend(handles, names, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("seconds (party 0)")
    ax.set_title("Secure transformer inference, 3 parties (2p, 4p: 2, 4): where the time goes")
    fig.tight_layout()
    fig.savefig(folder / "transformers.png", dpi=100)
    plt.close(fig)
    return ["transformers.png"]


def plot_scaling(
    sweeps: dict[str, list[dict[str, Any]]],
    folder: Path,
    name: str = "scaling.png",
    title: str = "one epoch of a secure MLP, mpcml.session",
) -> list[str]:
    """Time against each swept setting (spread as error bars), the round-trip floor beside it."""
    plt = _pyplot()
    sweeps = {k: v for k, v in sweeps.items() if k != "stack"}  # a table, not a curve
    if not sweeps:
        return []
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4 * len(sweeps), 3.5), squeeze=False)
    for ax, (sweep, rows) in zip(axes[0], sweeps.items(), strict=True):
        key = "network" if sweep.startswith("delay") else sweep.split(",")[0]
        xs = [_setting_value(r["setting"], key) for r in rows]
        ys = [r["seconds"] for r in rows]
        spread = [r.get("spread") or [r["seconds"]] for r in rows]
        below = [y - min(t) for y, t in zip(ys, spread, strict=True)]
        above = [max(t) - y for y, t in zip(ys, spread, strict=True)]
        ax.errorbar(xs, ys, yerr=[below, above], fmt="o-", capsize=3, label="measured (median)")
        ax.plot(xs, [r["floor"] for r in rows], "s--", label="round-trip floor")
        ax.set_xlabel("one-way delay (ms)" if key == "network" else key)
        ax.set_ylabel("seconds per epoch")
        ax.set_title(sweep, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(folder / name, dpi=100)
    plt.close(fig)
    return [name]


def plot_stack(rows: list[dict[str, Any]], folder: Path) -> list[str]:
    """Where one epoch's time goes: each layer of mpcml's stack as the time it adds.

    Each layer's part is the difference between two rows of the stack sweep, each a median of
    its own runs: differences of noisy times, clipped at 0 (a layer whose cost is below the
    noise shows as nothing).
    """
    by = {r["setting"]["stack"]: r["seconds"] for r in rows}
    needed = ("mpcml", "TFP", "TFP, no TLS", "torch PRG")
    if not all(k in by for k in needed):
        return []
    parts = [
        (
            "compute, transport, waiting (TFP, no TLS)",
            by["TFP, no TLS"] - _gap(by, "mpcml", "torch PRG"),
        ),
        ("TLS (TFP against TFP, no TLS)", _gap(by, "TFP", "TFP, no TLS")),
        ("dealer over TFP (mpcml against TFP)", _gap(by, "mpcml", "TFP")),
        ("ChaCha20 over torch's generator", _gap(by, "mpcml", "torch PRG")),
    ]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bottom = 0.0
    for k, (label, seconds) in enumerate(parts):
        ax.bar(0, max(seconds, 0.0), 0.5, bottom=bottom, label=label, color=plt.cm.tab10(k))
        bottom += max(seconds, 0.0)
    others = [(name, by[name]) for name in by if name != "mpcml"]
    ax.bar(
        range(1, len(others) + 1),
        [t for _, t in others],
        0.5,
        color=plt.cm.tab10(7),
        label="the sweep's other stacks",
    )
    ax.set_xticks(range(len(others) + 1))
    ax.set_xticklabels(["mpcml", *[n for n, _ in others]], fontsize=7, rotation=15)
    ax.set_ylabel("seconds per epoch (median)")
    ax.set_title("Where an epoch's time goes (secure MLP, 3 parties, loopback)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(folder / "stack.png", dpi=100)
    plt.close(fig)
    return ["stack.png"]


def _gap(by: dict[str, float], slower: str, faster: str) -> float:
    return max(by[slower] - by[faster], 0.0)


def _setting_value(setting: dict[str, Any], key: str) -> float:
    if key == "network":
        from mpcml.transport.shaping import Shaping

        return 1000 * Shaping.parse(setting["network"]).delay_s
    return float(setting[key])


# --- the report -------------------------------------------------------------------------------


def machine() -> str:
    """The machine the report ran on, in words."""
    memory = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages / 2**30:.0f} GiB memory"
    except (ValueError, OSError):
        pass
    return (
        f"{os.cpu_count()} CPUs{memory}, {platform.system()} {platform.machine()}, Python "
        f"{platform.python_version()}; every party, the dealer and the coordinator on this one "
        "machine, over loopback with mutual TLS; no GPU"
    )


def commit() -> str:
    """The checkout's commit (with "+changes" when its tree differs), or "unknown"."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head + ("+changes" if dirty else "")) or "unknown"


def floor_table(figures: dict[str, Any]) -> list[str]:
    """Each WAN training row against its round-trip floor: rounds x delay + bytes / bandwidth.

    A round here is one exchange of shares, which waits one one-way delay; the bytes are all
    parties' (CrypTen's count), each party's own link carrying its share of them.
    """
    from mpcml.transport.shaping import Shaping

    link = Shaping.parse(figures["network"])
    parties = {str(i): 3 if i != 2 else 2 for i in range(3)}
    lines = [
        "| task | variant | rounds / epoch | MiB / epoch | floor s | measured s | x floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, variants in figures["ours"].items():
        for variant, o in variants.items():
            per_party = o["mib"] * 2**20 / parties.get(i, 3)
            floor = o["rounds"] * link.delay_s + (
                per_party / link.bytes_per_s if link.bytes_per_s else 0.0
            )
            lines.append(
                f"| {figures['tasks'][i]} | {variant} | {o['rounds']:.0f} | {o['mib']:.1f} | "
                f"{floor:.2f} | {o['epoch_seconds']:.2f} | {o['epoch_seconds'] / floor:.2f} |"
            )
    return lines


def why(by_name: dict[str, dict[str, Any]]) -> list[str]:
    """Where mpcml is slower than stock CrypTen, SPU or its own targets, and why, from the run."""
    lines: list[str] = []
    lan = by_name.get(SUITES[0].name, {}).get("figures")
    if lan:
        from bench.train import TRAIN_TARGETS

        for i, task in lan["tasks"].items():
            fused = lan["ours"].get(i, {}).get("fused")
            stock = lan["stock"].get(i)
            if not fused or not stock:
                continue
            ratio = stock["epoch_seconds"] / fused["epoch_seconds"]
            per_op: dict[str, float] = {}
            for node, _, _, share in fused["layers"]:
                per_op[node] = per_op.get(node, 0.0) + share
            top = sorted(per_op.items(), key=lambda kv: -kv[1])[:2]
            ms = 1000 * fused["median_batch"] / max(fused["batch_rounds"], 1)
            target = TRAIN_TARGETS.get(task)
            verdict = "" if target is None or ratio >= target else f" (target {target:g}x: missed)"
            lines.append(
                f"- **{task}**: mpcml's default trains {ratio:.2f}x faster per epoch than stock "
                f"CrypTen{verdict}. A batch takes {fused['batch_rounds']:.0f} rounds in "
                f"{1000 * fused['median_batch']:.0f} ms, {ms:.1f} ms a round; most of it in "
                + ", ".join(f"{node} ({share:.0%})" for node, share in top)
                + ". The time is rounds, not arithmetic: each round is a Python-level gRPC "
                "exchange between 3 processes (and the dealer) sharing 2 cores."
            )
            spu = lan["spu"].get(i)
            if isinstance(spu, dict) and spu["epoch_seconds"] < fused["epoch_seconds"]:
                lines.append(
                    f"  - **SPU is {fused['epoch_seconds'] / spu['epoch_seconds']:.1f}x faster** "
                    f"than mpcml here ({spu['epoch_seconds']:.2f} s against "
                    f"{fused['epoch_seconds']:.2f} s an epoch): its runtime is C++ with XLA-"
                    "compiled programs and ABY3's 3-party protocols (fewer, cheaper rounds per "
                    "non-linear function, no dealer), where mpcml runs CrypTen's Python "
                    "protocols over Python gRPC, one round at a time."
                )
            if fused["accuracy"] < stock["accuracy"] - 0.005:
                lines.append(
                    f"  - accuracy {fused['accuracy']:.3f} against stock CrypTen's "
                    f"{stock['accuracy']:.3f}: fixed-point noise on few test rows."
                )
    scaling = by_name.get(SUITES[3].name, {}).get("figures") or {}
    by = {r["setting"]["stack"]: r["seconds"] for r in scaling.get("stack", [])}
    if "mpcml" in by:
        base = by["mpcml"]
        if "stock CrypTen" in by:
            lines.append(
                f"- **The same epoch in one session** (no job API): mpcml {base:.2f} s, stock "
                f"CrypTen on gloo {by['stock CrypTen']:.2f} s "
                f"({by['stock CrypTen'] / base:.2f}x mpcml's time)."
            )
        if "TFP" in by and by["TFP"] < base:
            lines.append(
                f"- **The dealer costs {base - by['TFP']:.2f} s of {base:.2f} s** (against "
                "CrypTen's TFP provider, which is insecure: party 0 learns every input): the "
                "dealer is a fourth process on the same 2 cores, and each tuple request it "
                "answers sits on the critical path. On separate machines it would not contend."
            )
        if "TFP, no TLS" in by and "TFP" in by:
            lines.append(
                f"- **TLS**: TFP {by['TFP']:.2f} s against {by['TFP, no TLS']:.2f} s without "
                "TLS; a difference this small is within this machine's noise."
            )
        if "torch PRG" in by:
            lines.append(
                f"- **ChaCha20 share randomness**: {base:.2f} s against {by['torch PRG']:.2f} s "
                "with CrypTen's (insecure) torch generators."
            )
    plane = by_name.get("The data plane", {})
    missed = [line.split("  ")[0] for line in plane.get("table", "").splitlines() if "MISS" in line]
    if missed:
        lines.append(
            f"- **The data plane** misses {len(missed)} of its targets ("
            + "; ".join(missed)
            + "): what it pays over gloo and a raw socket is gRPC's Python layer (each message "
            "serialized to protobuf bytes and handed between threads) and TLS encryption, "
            "which gloo and the raw socket do without."
        )
    consortium = by_name.get(CONSORTIUM.name, {}).get("figures")
    if consortium:
        rows = [r for sweep in consortium["sweeps"].values() for r in sweep]
        outside = statistics.median(r["outside_compute"] for r in rows)
        lines.append(
            f"- **The job API, coordinator and daemons**: in the median daemon job "
            f"{outside:.0%} of the run time is outside the workers' profiled compute (job "
            "start, worker set-up, data loading, round hand-offs); short jobs pay it most."
        )
    transformers: list[dict[str, Any]] = by_name.get(SUITES[2].name, {}).get("figures") or []
    for r in transformers:
        if r["plan"] != "tuned" or r.get("parties", 3) != 3:
            continue
        base_row = next(
            (b for b in transformers if b["model"] == r["model"] and b["plan"] == "crypten"), None
        )
        if base_row is None:
            continue
        ratio = base_row["seconds"] / r["seconds"]
        op, (op_seconds, _, _) = max(r["ops"].items(), key=lambda kv: kv[1][0])
        peak = max(r["peak_mib"]) / max(base_row["peak_mib"])
        lines.append(
            f"- **{r['model']}**: tuned {ratio:.2f}x CrypTen's approximations (target 2x); "
            f"{op.removeprefix('aten.')} takes {op_seconds / r['seconds']:.0%} of the tuned "
            f"time; peak memory {peak:.2f}x the CrypTen plan's. Random weights give wide "
            "activation ranges, so the tuned plan keeps comparisons (which cost the same in "
            "both plans) where a trained model's narrower ranges would not need them."
        )
    return lines or ["- nothing to say: no suite with figures ran"]


def write(results: list[dict[str, Any]], command: str, out: Path, pending: int = 0) -> None:
    """REPORT.md, the plots and results.json under `out` (bench/ by default).

    Written again after every suite: a long run cut short keeps what it measured (`pending`:
    the suites still to run, said at the top).
    """
    folder = out / "report"
    folder.mkdir(parents=True, exist_ok=True)
    by_name = {r["name"]: r for r in results}
    plots: dict[str, list[str]] = {}
    lan = by_name.get(SUITES[0].name, {}).get("figures")
    wan = by_name.get(SUITES[1].name, {}).get("figures")
    if lan:
        plots[SUITES[0].name] = plot_training(lan, wan, folder)
    elif wan:  # the smoke run: the WAN rows alone
        plots[SUITES[1].name] = plot_training(wan, None, folder)
    transformers = by_name.get(SUITES[2].name, {}).get("figures")
    if transformers:
        plots[SUITES[2].name] = plot_transformers(transformers, folder)
    scaling = by_name.get(SUITES[3].name, {}).get("figures")
    if scaling:
        plots[SUITES[3].name] = plot_scaling(scaling, folder)
        plots[SUITES[3].name] += plot_stack(scaling.get("stack", []), folder)
    consortium = by_name.get(CONSORTIUM.name, {}).get("figures")
    if consortium:
        plots[CONSORTIUM.name] = plot_scaling(
            consortium["sweeps"],
            folder,
            "consortium.png",
            "daemon jobs through the job API: seconds per epoch",
        )
    lines = [
        "# mpcml benchmark report",
        "",
        f"Written by `{command}` on {time.strftime('%Y-%m-%d')} at commit {commit()}. "
        f"Machine: {machine()}."
        + (f" **Incomplete: {pending} suites had not run yet.**" if pending else "")
        + (
            " It reran the sections that give their run time and kept the others from the "
            "run before it."
            if len({(r.get("date"), r.get("commit")) for r in results}) > 1
            else ""
        ),
        "",
        "Every figure below is printed by the command above its table; rerun it to check it. "
        "Timing noise on a shared 2-core machine is large: compare rows of one run. The WAN "
        f"rows ({WAN}) impose the delay and bandwidth in mpcml's own transport on each party's "
        "inbound streams (mpcml/transport/shaping.py), and on stock CrypTen as a sleep of the "
        "same length at each round it counts (its gloo path has no hook of its own): these "
        "machines have no traffic shaping.",
        "",
    ]
    misses = [
        f"- {r['name']}: `{line.strip()}`"
        for r in results
        for line in r["table"].splitlines()
        if "MISS" in line
    ]
    lines += [
        "## Where mpcml misses its targets in this run",
        "",
        *(misses or ["- none: every target a benchmark printed was met"]),
        "",
        "Each benchmark prints its targets beside its figures and says why it is where it is "
        "in its notes (and, for the transformers, where each row's time goes); a miss never "
        "fails a run. Failed benchmarks are marked in their sections.",
        "",
        "## Where mpcml is slower, and why (computed from this run's figures)",
        "",
        *why(by_name),
        "",
    ]
    for r in results:
        when = f", run {r['date']} at {r.get('commit', 'unknown')}" if r.get("date") else ""
        lines += [f"## {r['name']}", "", f"`{r['command']}` ({r['seconds']:.0f} s{when})", ""]
        if r["returncode"]:
            lines += [f"**Failed** (exit {r['returncode']}):", "", "```", r["error"], "```", ""]
        lines += ["```", r["table"], "```", ""]
        figures = r["figures"]
        if r["name"] == SUITES[1].name and figures:
            lines += [
                "The round-trip floor of each epoch (rounds x one-way delay + each party's "
                "bytes / bandwidth) beside the measured time: what is left above it is "
                "computation and the parties' waiting on one another.",
                "",
                *floor_table(figures),
                "",
            ]
        for png in plots.get(r["name"], []):
            lines += [f"![{png}](report/{png})", ""]
    (out / "REPORT.md").write_text("\n".join(lines))
    (out / "results.json").write_text(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest workloads only")
    parser.add_argument("--only", nargs="*", help="suites whose name starts with one of these")
    parser.add_argument("--out", type=Path, default=HERE, help="where REPORT.md goes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest workloads only (logistic regression, 2 epochs, mpcml's default, on the "
        "emulated WAN; daemon jobs at 2 and 3 parties): what the test suite runs so that this "
        "code cannot rot",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the other suites' results from OUT/results.json and rerun only the chosen "
        "ones (with --only): each section keeps the command and date of its own run",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="run nothing: write REPORT.md and the plots again from OUT/results.json (after a "
        "change to this file's tables, plots or text)",
    )
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads((args.out / "results.json").read_text())
        runs = sorted((r.get("date", ""), r.get("report_command", "")) for r in results)
        write(results, runs[-1][1] or "python bench/report.py", args.out)
        print(f"wrote {args.out / 'REPORT.md'}")
        return 0
    chosen = [s for s in SUITES if s.quick or not (args.quick or args.smoke)]
    if args.smoke:
        chosen = [
            s
            for s in chosen
            if (s.script == "train.py" and "--network" in s.args) or s is CONSORTIUM
        ]
    if args.only:
        chosen = [s for s in chosen if any(s.name.startswith(p) for p in args.only)]
    command = "python bench/report.py " + " ".join(argv if argv is not None else sys.argv[1:])
    kept: list[dict[str, Any]] = []
    if args.update and (args.out / "results.json").exists():
        names = {s.name for s in chosen}
        kept = [
            r for r in json.loads((args.out / "results.json").read_text()) if r["name"] not in names
        ]
    order = {s.name: i for i, s in enumerate(SUITES)}
    results = list(kept)
    for k, s in enumerate(chosen):
        result = run(s, args.quick, k + 1, len(chosen), args.smoke)
        result["report_command"] = command.strip()
        result["date"] = time.strftime("%Y-%m-%d %H:%M")
        result["commit"] = commit()
        results.append(result)
        results.sort(key=lambda r: order.get(r["name"], len(order)))
        write(results, command.strip(), args.out, pending=len(chosen) - k - 1)
    print(f"wrote {args.out / 'REPORT.md'}")
    failed = [r["name"] for r in results if r["returncode"]]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
