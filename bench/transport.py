"""Benchmark mpcml's gRPC data plane against stock CrypTen on gloo and against raw TCP.

`make bench` runs this. It prints two tables. The first: the wall time of four 3-party CrypTen
workloads over mpcml (gRPC, mutual TLS) and over torch.distributed/gloo, both on CrypTen's TFP
provider; the same workloads on mpcml's secure defaults (the dealer, ChaCha20 shares, mTLS)
against stock CrypTen's insecure ones (TFP, mt19937, gloo); and the two-party throughput of
1 MiB and 64 MiB tensors over mpcml against a plain TCP socket. The second: what the dealer
adds to the traffic, per workload and per tuple. Every party is a separate OS
process on 127.0.0.1; process start-up and session set-up are never timed. Targets are printed
beside the numbers (PASS/MISS) but a miss never fails the run: the numbers are what they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpcml.transport.address import free_ports  # noqa: E402
from tests.support.parties import dealer_process, make_pki  # noqa: E402

WORKLOADS: dict[str, str] = {
    "matmul": "matmul 256x256",
    "relu": "relu 100k",
    "softmax": "softmax 128x128",
    "logreg": "logreg epoch 569x30",
}
"""Workload keys (see bench/workloads.py), in table order, with the label the table prints."""

MIB = 1 << 20
TPUT_PLAN = [(1 * MIB, 128, 3), (64 * MIB, 4, 3)]
"""(bytes per tensor, tensors per trial, timed trials) of the throughput test."""

TPUT_ROWS = [
    ("grpc-tput-tls", "mpcml gRPC+mTLS"),
    ("grpc-tput-plain", "mpcml plaintext"),
    ("gloo-tput", "CrypTen gloo"),
    ("grpc-bare-tput", "bare gRPC stream, mTLS"),
]
"""Throughput suites, each compared with raw TCP; only mpcml over mTLS at 64 MiB is graded."""

MPC_TARGET = 1.0
"""grpc/gloo wall-time ratio at or under which a workload passes."""
TPUT_TARGET = 0.70
"""Share of raw-TCP throughput at or over which the 64 MiB transfer passes."""
MPC_TIMEOUT_S = 300.0
TPUT_TIMEOUT_S = 120.0


class BenchError(Exception):
    """A benchmark process failed; the message carries the end of its log."""


class Group:
    """Party processes started together; leaving the block always kills and reaps them all.

    Each process leads its own process group, so that killing the group also takes down what
    it forked (CrypTen's launcher forks the gloo parties).
    """

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp = tmp / name
        self.tmp.mkdir(parents=True)
        self.name = name
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.logs: list[Path] = []

    def __enter__(self) -> Group:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()

    def start(self, spec: dict[str, Any]) -> None:
        """Start one `bench.party` process running `spec`."""
        i = len(self.procs)
        out, log, spec_file = (self.tmp / f"{i}.{ext}" for ext in ("out.json", "log", "json"))
        spec_file.write_text(json.dumps({**spec, "out": str(out)}))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        with log.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.party", str(spec_file)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.outs.append(out)
        self.logs.append(log)

    def wait(self, timeout: float) -> list[Any]:
        """Every process's result, in start order; a failure or a hang raises BenchError."""
        deadline = time.monotonic() + timeout
        while self._running():
            failed = [i for i, p in enumerate(self.procs) if p.returncode not in (None, 0)]
            if failed:
                # The others learn of it from their transport; give them a moment, then stop.
                self._settle(5.0)
                raise BenchError(self._report(failed[0]))
            if time.monotonic() > deadline:
                hung = [i for i, p in enumerate(self.procs) if p.poll() is None]
                raise BenchError(
                    f"{self.name}: process {hung[0]} still running after "
                    f"{timeout:g} s\n{self._tail(hung[0])}"
                )
            time.sleep(0.05)
        for i, p in enumerate(self.procs):
            if p.returncode != 0:
                raise BenchError(self._report(i))
        return [json.loads(out.read_text())["result"] for out in self.outs]

    def _running(self) -> bool:
        # Poll every process (not any(), which would stop at the first one still running).
        return [p.poll() for p in self.procs].count(None) > 0

    def _settle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self._running():
            time.sleep(0.05)

    def _report(self, i: int) -> str:
        out = self.outs[i]
        detail = ""
        if out.exists():
            status = json.loads(out.read_text())
            detail = status.get("traceback") or status.get("error", "")
        return (
            f"{self.name}: process {i} exited with {self.procs[i].returncode}\n"
            f"{detail}\n{self._tail(i)}"
        )

    def _tail(self, i: int, lines: int = 20) -> str:
        text = self.logs[i].read_text(errors="replace") if self.logs[i].exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """Kill every process group still alive and reap the processes."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# -- the suites --------------------------------------------------------------------------------


def _tls_spec(pki: dict[str, dict[str, str]] | None, name: str) -> dict[str, str] | None:
    return None if pki is None else pki[name]


def run_grpc_mpc(
    tmp: Path, pki: dict[str, dict[str, str]], reps: int, warmup: int, dealer: bool = False
) -> dict[str, Any]:
    """The workloads on 3 parties in `mpcml.session` over mTLS, on TFP or on a dealer."""
    if dealer:
        with dealer_process(tmp, tmp / "pki", log_level="info") as address:
            return _grpc_mpc(tmp, "grpc-mpc-dealer", pki, reps, warmup, address)
    return _grpc_mpc(tmp, "grpc-mpc", pki, reps, warmup, None)


def _grpc_mpc(
    tmp: Path,
    label: str,
    pki: dict[str, dict[str, str]],
    reps: int,
    warmup: int,
    dealer: str | None,
) -> dict[str, Any]:
    names = [f"party{i}" for i in range(3)]
    peers = [f"127.0.0.1:{p}" for p in free_ports(3)]
    with Group(tmp, label) as group:
        for rank in range(3):
            group.start(
                {
                    "role": "grpc-mpc",
                    "rank": rank,
                    "world_size": 3,
                    "peers": peers,
                    "peer_names": names,
                    "tls": _tls_spec(pki, names[rank]),
                    "session_id": "bench-mpc",
                    "dealer": dealer,
                    "workloads": list(WORKLOADS),
                    "reps": reps,
                    "warmup": warmup,
                }
            )
        return _merge(group.wait(MPC_TIMEOUT_S))


def run_gloo_mpc(tmp: Path, reps: int, warmup: int) -> dict[str, Any]:
    """The same workloads on stock CrypTen over gloo, launched by CrypTen's run_multiprocess."""
    with Group(tmp, "gloo-mpc") as group:
        group.start(
            {
                "role": "gloo-mpc",
                "world_size": 3,
                "workloads": list(WORKLOADS),
                "reps": reps,
                "warmup": warmup,
            }
        )
        (launcher,) = group.wait(MPC_TIMEOUT_S)
        return _merge(launcher["parties"])


def _merge(parties: list[dict[str, Any]]) -> dict[str, Any]:
    # A repetition lasts as long as its slowest party; the table shows the median repetition.
    times = {}
    for name in WORKLOADS:
        per_rep = [max(col) for col in zip(*(p["times"][name] for p in parties), strict=True)]
        times[name] = statistics.median(per_rep)
    errors = {name: max(p["errors"][name] for p in parties) for name in WORKLOADS}
    traffic = {
        name: {k: sum(p["traffic"][name][k] for p in parties) for k in parties[0]["traffic"][name]}
        for name in WORKLOADS
    }
    return {"times": times, "errors": errors, "traffic": traffic, "dataset": parties[0]["dataset"]}


def run_grpc_tput(tmp: Path, pki: dict[str, dict[str, str]] | None) -> dict[str, Any]:
    """MiB/s from rank 0 to rank 1 over CrypTen's communicator in an mpcml session."""
    names = ["party0", "party1"]
    peers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    label = "grpc-tput-tls" if pki is not None else "grpc-tput-plain"
    with Group(tmp, label) as group:
        for rank in range(2):
            group.start(
                {
                    "role": "grpc-tput",
                    "rank": rank,
                    "peers": peers,
                    "peer_names": names,
                    "tls": _tls_spec(pki, names[rank]),
                    "session_id": "bench-tput",
                    "plan": TPUT_PLAN,
                }
            )
        parties = group.wait(TPUT_TIMEOUT_S)
        return {"rates": _rates(parties[0]), "round": [p["round"] for p in parties]}


def run_tcp_tput(tmp: Path) -> dict[str, Any]:
    """MiB/s from rank 0 to rank 1 over a plain TCP socket: the ceiling of loopback in Python."""
    (port,) = free_ports(1)
    with Group(tmp, "tcp-tput") as group:
        for rank in (1, 0):  # the listener first
            group.start({"role": "tcp-tput", "rank": rank, "port": port, "plan": TPUT_PLAN})
        return {"rates": _rates(group.wait(TPUT_TIMEOUT_S)[1])}


def run_grpc_bare_tput(tmp: Path, pki: dict[str, dict[str, str]]) -> dict[str, Any]:
    """MiB/s of a bare gRPC stream over mTLS: what gRPC-python manages with no mpcml at all."""
    (port,) = free_ports(1)
    with Group(tmp, "grpc-bare-tput") as group:
        for rank in (1, 0):  # the server first
            group.start(
                {
                    "role": "grpc-bare-tput",
                    "rank": rank,
                    "plan": TPUT_PLAN,
                    "address": f"127.0.0.1:{port}",
                    "tls": pki[f"party{rank}"],
                }
            )
        return {"rates": _rates(group.wait(TPUT_TIMEOUT_S)[1])}


def run_gloo_tput(tmp: Path) -> dict[str, Any]:
    """MiB/s from rank 0 to rank 1 over stock CrypTen on gloo, for reference."""
    with Group(tmp, "gloo-tput") as group:
        group.start({"role": "gloo-tput", "plan": TPUT_PLAN})
        (launcher,) = group.wait(TPUT_TIMEOUT_S)
        parties = launcher["parties"]
        return {"rates": _rates(parties[0]), "round": [p["round"] for p in parties]}


def _rates(sender: dict[str, Any]) -> dict[int, float]:
    # Rank 0's clock runs from the first send to the receiver's ack of the last tensor.
    out = {}
    for nbytes, count, _ in TPUT_PLAN:
        seconds = statistics.median(sender["seconds"][str(nbytes)])
        out[nbytes] = count * nbytes / MIB / seconds
    return out


# -- the table ---------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB"


def build_rows(results: dict[str, Any]) -> list[list[str]]:
    """Rows of the table from whatever suites succeeded."""
    rows = [["measurement", "mpcml", "baseline", "", "ratio", "target", "result"]]
    grpc, gloo = results.get("grpc-mpc"), results.get("gloo-mpc")
    for key, label in WORKLOADS.items():
        ours = f"{grpc['times'][key]:.3f} s" if grpc else "ERROR"
        base = f"{gloo['times'][key]:.3f} s" if gloo else "ERROR"
        ratio, verdict = "-", "ERROR"
        if grpc and gloo:
            value = grpc["times"][key] / gloo["times"][key]
            ratio, verdict = f"{value:.2f}", _verdict(value <= MPC_TARGET)
        target = f"<= {MPC_TARGET:.2f}"
        rows.append([f"{label}, 3 parties, gRPC+mTLS", ours, "gloo", base, ratio, target, verdict])
    secure = results.get("grpc-mpc-dealer")
    for key, label in WORKLOADS.items():
        ours = f"{secure['times'][key]:.3f} s" if secure else "ERROR"
        base = f"{gloo['times'][key]:.3f} s" if gloo else "ERROR"
        ratio = f"{secure['times'][key] / gloo['times'][key]:.2f}" if secure and gloo else "-"
        rows.append([f"{label}, secure defaults", ours, "insecure", base, ratio, "(info)", "-"])
    tcp = results["tcp-tput"]["rates"] if "tcp-tput" in results else None
    for suite, what in TPUT_ROWS:
        ours_rates = results[suite]["rates"] if suite in results else None
        for nbytes, _, _ in TPUT_PLAN:
            label = f"send {_size(nbytes)}, 2 parties, {what}"
            ours = f"{ours_rates[nbytes]:.0f} MiB/s" if ours_rates else "ERROR"
            base = f"{tcp[nbytes]:.0f} MiB/s" if tcp else "ERROR"
            graded = suite == "grpc-tput-tls" and nbytes == 64 * MIB
            target = f">= {TPUT_TARGET:.2f}" if graded else "(info)"
            if ours_rates and tcp:
                ratio = ours_rates[nbytes] / tcp[nbytes]
                verdict = _verdict(ratio >= TPUT_TARGET) if graded else "-"
                rows.append([label, ours, "raw TCP", base, f"{ratio:.2f}", target, verdict])
            else:
                rows.append([label, ours, "raw TCP", base, "-", target, "ERROR"])
    return rows


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:.0f} KiB"


def traffic_rows(results: dict[str, Any]) -> list[list[str]]:
    """Per workload and repetition, all parties together: bytes on each provider.

    The dealer's count is serialized requests and rank 0's correcting shares.
    """
    rows = [
        [
            "workload (per repetition)",
            "gloo TFP",
            "gRPC TFP",
            "gRPC dealer",
            "tuples",
            "dealer bytes",
            "per tuple",
        ]
    ]
    runs = [results.get(s) for s in ("gloo-mpc", "grpc-mpc", "grpc-mpc-dealer")]
    for key, label in WORKLOADS.items():
        cells = [_kib(r["traffic"][key]["bytes"]) if r else "ERROR" for r in runs]
        dealer = runs[2]["traffic"][key] if runs[2] else None
        if dealer and dealer["dealer_tuples"]:
            per = dealer["dealer_bytes"] / dealer["dealer_tuples"]
            cells += [
                f"{dealer['dealer_tuples']:.0f}",
                _kib(dealer["dealer_bytes"]),
                f"{per:.0f} B",
            ]
        else:
            cells += ["-", "-", "-"]
        rows.append([label, *cells])
    return rows


def round_rows(results: dict[str, Any]) -> list[list[str]]:
    """What one round costs with nothing to compute: wall time, and CPU per party."""
    rows = [["small round (all_reduce of 8 elements, 2 parties)", "mpcml", "baseline", ""]]
    rows[0] += ["ratio", "target", "result"]
    gloo_round = results.get("gloo-tput", {}).get("round")
    for suite, what in TPUT_ROWS[:2]:
        ours_round = results.get(suite, {}).get("round")
        for key, figure in (("wall", "wall per round"), ("cpu", "CPU per round per party")):
            label = f"{what}: {figure}"
            if not ours_round or not gloo_round:
                rows.append([label, "ERROR", "gloo", "ERROR", "-", "(info)", "ERROR"])
                continue
            ours = 1e6 * max(r[key] for r in ours_round)
            base = 1e6 * max(r[key] for r in gloo_round)
            ratio = f"{ours / base:.2f}"
            rows.append([label, f"{ours:.0f} us", "gloo", f"{base:.0f} us", ratio, "(info)", "-"])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per workload")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        metavar="SUITE",
        help="run only these suites (grpc-mpc grpc-mpc-dealer gloo-mpc grpc-tput-tls "
        "grpc-tput-plain gloo-tput grpc-bare-tput tcp-tput)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mpcml-bench-") as tmp_name:
        tmp = Path(tmp_name)
        pki = make_pki(tmp / "pki", [f"party{i}" for i in range(3)])
        suites: list[tuple[str, Callable[[], Any]]] = [
            ("grpc-mpc", lambda: run_grpc_mpc(tmp, pki, args.reps, args.warmup)),
            ("grpc-mpc-dealer", lambda: run_grpc_mpc(tmp, pki, args.reps, args.warmup, True)),
            ("gloo-mpc", lambda: run_gloo_mpc(tmp, args.reps, args.warmup)),
            ("grpc-tput-tls", lambda: run_grpc_tput(tmp, pki)),
            ("grpc-tput-plain", lambda: run_grpc_tput(tmp, None)),
            ("gloo-tput", lambda: run_gloo_tput(tmp)),
            ("grpc-bare-tput", lambda: run_grpc_bare_tput(tmp, pki)),
            ("tcp-tput", lambda: run_tcp_tput(tmp)),
        ]
        for name, suite in suites:
            if args.only is not None and name not in args.only:
                continue
            print(f"running {name} ...", file=sys.stderr, flush=True)
            try:
                results[name] = suite()
            except BenchError as exc:
                errors[name] = str(exc)
                print(f"{name} FAILED:\n{exc}", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - began
    print("mpcml transport benchmark: mpcml's gRPC data plane vs CrypTen on gloo and raw TCP")
    print()
    print(_table(build_rows(results)))
    print()
    print("What the dealer adds to the traffic (bytes CrypTen counts, all parties together)")
    print()
    print(_table(traffic_rows(results)))
    print()
    print("What one round costs the data plane (rounds set a protocol's time, not bytes)")
    print()
    print(_table(round_rows(results)))
    print()
    print(_footer(results, errors, args.reps, args.warmup, elapsed))
    return 1 if errors else 0


def _footer(
    results: dict[str, Any], errors: dict[str, str], reps: int, warmup: int, elapsed: float
) -> str:
    suites = ("grpc-mpc", "grpc-mpc-dealer", "gloo-mpc")
    dataset = next((results[s]["dataset"] for s in suites if s in results), "?")
    lines = [
        f"MPC: median of {reps} repetitions after {warmup} warm-up, each the slowest party's time "
        "between barriers (encryption untimed), outputs checked against plaintext PyTorch; "
        "1 torch thread per party. gRPC+mTLS rows run CrypTen's TFP provider like the gloo "
        "baseline (the transport alone); 'secure defaults' rows run mpcml's dealer and "
        "ChaCha20 shares over mTLS against stock CrypTen (TFP, mt19937, gloo).",
        "Traffic: per repetition of a workload, encryption and decryption included; 'dealer "
        "bytes' is the serialized size of rank 0's requests and the correcting shares it gets "
        "(the other ranks draw their tuples from their keys and send nothing).",
        f"Throughput: rank 0 sends {', '.join(f'{c} x {_size(n)}' for n, c, _ in TPUT_PLAN)} "
        "and waits for rank 1's 1-element ack; median of "
        f"{TPUT_PLAN[0][2]} trials after a warm-up. The bare gRPC row streams pre-built 4 MiB "
        "messages with mpcml's channel options and nothing else: gRPC-python's own ceiling.",
        "Small round: 2000 all_reduce calls of 8 int64 each way after 200 untimed, in the "
        "throughput sessions; wall per round, and the CPU time of each party's whole process "
        "(every thread) per round, the larger party's.",
        f"logreg data: {dataset}; batch 32, SGD, BCE on sigmoid(Linear(30, 1)).",
    ]
    for suite in ("grpc-mpc", "grpc-mpc-dealer", "gloo-mpc"):
        if suite in results:
            bad = {k: v for k, v in results[suite]["errors"].items() if not v <= 1e-3}
            if bad:
                lines.append(f"WARNING: {suite}: share of elements off plaintext by > 0.05: {bad}")
    lines.append(
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, all "
        f"parties on 127.0.0.1; bench took {elapsed:.0f} s."
    )
    lines.extend(f"ERROR in {suite}: {msg.splitlines()[0]}" for suite, msg in errors.items())
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in lines)


if __name__ == "__main__":
    sys.exit(main())
