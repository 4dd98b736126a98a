"""Load test: many small jobs submitted at once to one coordinator with three parties.

`make bench` runs this. A fresh deployment on loopback (`LocalCluster`: a new CA, the
coordinator, the dealer and the party daemons alice, bob and carol as separate processes, mutual
TLS) receives `--jobs` copies of the demo's quickest job, bob's private digits model on alice's
images with the predictions revealed to alice, all at once from a thread pool, each with its own
idempotency key. Every submission is then sent a second time with the same key, as a client whose
first answer got lost would.

Correctness is checked, not timed: every job must be COMPLETED and alice must hold its
predictions, and the coordinator's job list must hold exactly the jobs submitted, once each, by
job id and by idempotency key. The run exits 1 naming what went wrong otherwise. Timings are
printed, never graded.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import re
import signal
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.transport import _table  # noqa: E402
from mpcml.api.client import TERMINAL, Client, ClientError  # noqa: E402
from mpcml.api.job import Job  # noqa: E402
from mpcml.demo import data, models  # noqa: E402
from mpcml.demo.cluster import LocalCluster  # noqa: E402
from mpcml.demo.run import predictions  # noqa: E402
from mpcml.proto.v1 import coordinator_pb2 as cpb  # noqa: E402

DEFAULT_JOBS = 50
DEFAULT_TIMEOUT_S = 1200.0
POLL_S = 0.5
BARRIER_TIMEOUT_S = 120.0
"""How long the submitting threads wait for one another (each traces its model first)."""
BATCH = 360
"""Every one of alice's 360 test images in one batch: the fewest communication rounds."""
LOG_LEVEL = re.compile(r" (WARNING|ERROR|CRITICAL) ")


def digits_job() -> Job:
    """Bob's private digits model on alice's images; only alice learns the predictions."""
    return Job.infer(
        model=models.DigitsMLP(),
        weights={"bob": "digits-mlp"},
        features={"alice": "digits-test"},
        reveal={"predictions": ["alice"]},
        batch_size=BATCH,
        name="load-digits",
    )


@dataclass
class Submission:
    """One job as the client saw it."""

    index: int
    key: str
    submitted_at: float = 0.0
    """time.time() just before the submit call."""
    submit_s: float = 0.0
    """How long the submit call took (the coordinator has every party vet the job)."""
    job_id: str | None = None
    retry_id: str | None = None
    """What the second submission with the same key returned."""
    error: str | None = None


@dataclass
class Outcome:
    """What the checks found."""

    statuses: dict[str, cpb.JobStatus] = field(default_factory=dict)
    """The coordinator's final job list, by job id."""
    problems: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0


# -- submitting and waiting --------------------------------------------------------------------


def _submit(client: Client, sub: Submission, start: threading.Barrier) -> None:
    job = digits_job()  # traced before the barrier, so that the submit calls race
    start.wait()
    sub.submitted_at = time.time()
    try:
        sub.job_id = client.submit(job, idempotency_key=sub.key).id
        sub.submit_s = time.time() - sub.submitted_at
        sub.retry_id = client.submit(job, idempotency_key=sub.key).id
    except ClientError as exc:
        sub.error = str(exc)


def submit_all(client: Client, subs: list[Submission]) -> None:
    """Submit every job from its own thread, all released at once, then again with its key."""
    start = threading.Barrier(len(subs), timeout=BARRIER_TIMEOUT_S)
    pool = ThreadPoolExecutor(max_workers=len(subs), thread_name_prefix="submit")
    try:
        futures: list[Future[None]] = [pool.submit(_submit, client, s, start) for s in subs]
        for future in futures:
            future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def wait_all(client: Client, subs: list[Submission], timeout: float) -> list[cpb.JobStatus]:
    """Poll the coordinator's job list until every accepted job has ended, or the timeout."""
    ids = {s.job_id for s in subs if s.job_id}
    deadline = time.monotonic() + timeout
    step = max(1, len(ids) // 10)
    said = -1
    while True:
        jobs = client.jobs()
        ended = sum(1 for j in jobs if j.job_id in ids and j.state in TERMINAL)
        if ended // step != said // step or (ended == len(ids) and said != ended):
            _say(f"  {ended}/{len(ids)} jobs ended")
            said = ended
        if ended >= len(ids) or time.monotonic() > deadline:
            return jobs
        time.sleep(POLL_S)


# -- the checks --------------------------------------------------------------------------------


def _check_predictions(client: Client, job_id: str, expected_ids: np.ndarray) -> str | None:
    """None if alice holds this job's predictions for all her images, in her order."""
    try:
        result = client.job(job_id).result()
        scores, ids = predictions(result, "alice")
    except (ClientError, StopIteration, OSError, KeyError, ValueError) as exc:
        return f"job {job_id}: alice has no predictions ({type(exc).__name__}: {exc})"
    if scores.shape != (len(expected_ids), 10) or not np.array_equal(
        ids.astype(np.int64), expected_ids
    ):
        return f"job {job_id}: alice's predictions have shape {scores.shape}, not one per image"
    return None


def check(client: Client, subs: list[Submission], jobs: list[cpb.JobStatus]) -> Outcome:
    """Every submitted job in the coordinator's list exactly once, COMPLETED, with its output.

    Duplicated: every entry of the list beyond one per submitted idempotency key (the same job
    listed twice, a second job for a key, a job nobody submitted), and every job id a second
    submission with the same key answered that is neither the first answer nor in the list.
    """
    out = Outcome(statuses={j.job_id: j for j in jobs})
    by_id = Counter(j.job_id for j in jobs)
    by_key = Counter(j.idempotency_key for j in jobs)
    keys = {s.key for s in subs}
    out.duplicated = len(jobs) - len(keys & set(by_key))
    out.problems += [f"job {i} is listed {n} times" for i, n in by_id.items() if n > 1]
    out.problems += [
        f"idempotency key {k} has {n} jobs" for k, n in by_key.items() if n > 1 and k in keys
    ]
    out.problems += [
        f"job {j.job_id} (key {j.idempotency_key!r}) was never submitted"
        for j in jobs
        if j.idempotency_key not in keys
    ]
    image_ids = data.digits().id_test
    for s in subs:
        if s.error is not None:
            out.problems.append(f"job {s.index} (key {s.key}): submit failed: {s.error}")
        if s.retry_id is not None and s.retry_id != s.job_id:
            out.duplicated += int(s.retry_id not in by_id)
            out.problems.append(
                f"job {s.index}: submitted again with key {s.key}, got job {s.retry_id} "
                f"instead of {s.job_id}"
            )
        status = out.statuses.get(s.job_id or "")
        if status is None or by_key[s.key] == 0:
            out.lost += 1
            out.problems.append(f"job {s.index} (key {s.key}, id {s.job_id}) is not in the list")
        elif status.state == cpb.COMPLETED:
            problem = _check_predictions(client, status.job_id, image_ids)
            if problem:
                out.problems.append(problem)
        else:
            state = cpb.JobState.Name(status.state)
            reason = f": {status.reason}" if status.reason else ""
            out.problems.append(f"job {status.job_id} is {state}{reason}")
    return out


def _submitted(subs: list[Submission], out: Outcome) -> list[tuple[Submission, cpb.JobStatus]]:
    return [(s, out.statuses[s.job_id]) for s in subs if s.job_id in out.statuses]


# -- the tables --------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile: the smallest value with at least p% of them at or below."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def _ended_at(status: cpb.JobStatus) -> float:
    return status.state_times[cpb.JobState.Name(status.state)]


def _spread(values: Sequence[float], digits: int) -> list[str]:
    if not values:
        return ["-", "-", "-"]
    return [
        f"{v:.{digits}f}" for v in (percentile(values, 50), percentile(values, 99), max(values))
    ]


def summary_rows(subs: list[Submission], out: Outcome) -> list[list[str]]:
    """The run in one row: counts, wall time, throughput and job latency."""
    ended = [(s, j) for s, j in _submitted(subs, out) if j.state in TERMINAL]
    completed = sum(1 for _, j in ended if j.state == cpb.COMPLETED)
    latency = [_ended_at(j) - s.submitted_at for s, j in ended]
    wall = max(_ended_at(j) for _, j in ended) - min(s.submitted_at for s in subs) if ended else 0
    header = ["jobs", "submitted", "completed", "failed", "lost", "duplicated", "wall s"]
    header += ["jobs/min", "p50 s", "p99 s", "max s"]
    row = [f"digits infer {BATCH}x64, alice+bob", str(len(subs)), str(completed)]
    row += [str(len(ended) - completed), str(out.lost), str(out.duplicated)]
    row += [f"{wall:.1f}" if wall else "-", f"{60 * completed / wall:.1f}" if wall else "-"]
    return [header, row + _spread(latency, 1)]


def phase_rows(subs: list[Submission], out: Outcome) -> list[list[str]]:
    """Where a job's latency goes, from the coordinator's state_times."""
    ended = [j for _, j in _submitted(subs, out) if j.state in TERMINAL]
    ended = [j for j in ended if "RUNNING" in j.state_times]
    phases = [
        ("submit call (every party vets the job)", [s.submit_s for s in subs if s.job_id]),
        (
            "PENDING -> STARTING (queued for free parties)",
            [j.state_times["STARTING"] - j.state_times["PENDING"] for j in ended],
        ),
        (
            "STARTING -> RUNNING (fresh workers start)",
            [j.state_times["RUNNING"] - j.state_times["STARTING"] for j in ended],
        ),
        (
            "RUNNING -> end (the computation)",
            [_ended_at(j) - j.state_times["RUNNING"] for j in ended],
        ),
    ]
    return [["phase of a job", "p50 s", "p99 s", "max s"]] + [
        [label, *_spread(values, 2)] for label, values in phases
    ]


def start_order(subs: list[Submission], out: Outcome) -> str:
    """Whether the coordinator started the jobs in the order it accepted them."""
    started = [j for _, j in _submitted(subs, out) if "STARTING" in j.state_times]
    by_start = sorted(started, key=lambda j: j.state_times["STARTING"])
    by_accept = sorted(started, key=lambda j: j.state_times["PENDING"])
    moved = sum(1 for a, b in zip(by_start, by_accept, strict=True) if a.job_id != b.job_id)
    if not moved:
        return f"All {len(started)} jobs started in the order the coordinator accepted them."
    return f"{moved} of {len(started)} jobs started out of the order the coordinator accepted them."


def log_summary(cluster: LocalCluster) -> str:
    """WARNING and ERROR lines and tracebacks in each process's log."""
    parts = []
    for name in ["coordinator", "dealer", *cluster.parties]:
        path = cluster.logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        levels = Counter(m.group(1) for m in LOG_LEVEL.finditer(text))
        tracebacks = text.count("Traceback (most recent call last)")
        parts.append(
            f"{name} {levels['WARNING']}/{levels['ERROR'] + levels['CRITICAL']}/{tracebacks}"
        )
    return "Logs (warnings/errors/tracebacks): " + ", ".join(parts) + "."


def footer(
    n: int, elapsed: float, setup: float, order: str, logs: str, workdir: Path | None
) -> str:
    lines = [
        f"{n} jobs submitted at once from {n} threads over one mTLS channel, each then again "
        "with its idempotency key; the coordinator, the dealer, and alice, bob and carol as "
        "separate processes on 127.0.0.1; every job runs in fresh worker processes of alice "
        "and bob.",
        "Latency: from just before the submit call (client clock) to the job's terminal state "
        "in the coordinator's state_times (the same host's clock); p50/p99 nearest-rank. Wall: "
        "the first submit call to the last job's end; jobs/min = completed jobs / wall.",
        "A party runs one job at a time by default, and any two jobs of two or three parties "
        "out of three share one, so the jobs run one after another: latency grows with the "
        f"place in the queue. {order}",
        logs,
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; cluster start "
        f"{setup:.0f} s, whole run {elapsed:.0f} s"
        + (f"; logs kept in {workdir / 'logs'}." if workdir else "."),
    ]
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in lines)


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is None:
        with tempfile.TemporaryDirectory(prefix="mpcml-load-") as tmp:
            yield Path(tmp)
        return
    if path.exists() and any(path.iterdir()):
        raise SystemExit(f"--workdir {path} is not empty: the job list must start empty")
    path.mkdir(parents=True, exist_ok=True)
    yield path


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="jobs to submit at once")
    parser.add_argument(
        "--workdir", type=Path, help="keep certificates, state and logs here (must be empty)"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the jobs"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    # A SIGTERM (a CI timeout, `kill`) stops the cluster like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    subs = [Submission(i, f"load-{i:04d}-{uuid.uuid4().hex[:8]}") for i in range(args.jobs)]
    with _workdir(args.workdir) as work:
        cluster = LocalCluster(work)
        _say(f"load test: {args.jobs} jobs; coordinator and parties in {work}")
        try:
            # The client closes first (cancelling any call still in flight), then the cluster.
            with cluster, cluster.start() as client:
                setup = time.monotonic() - began
                _say(f"cluster up in {setup:.0f} s; submitting {args.jobs} jobs at once")
                submit_all(client, subs)
                accepted = sum(1 for s in subs if s.job_id)
                _say(f"{accepted} of {args.jobs} submissions accepted; waiting for the jobs")
                out = check(client, subs, wait_all(client, subs, args.timeout))
                logs = log_summary(cluster)
                if out.problems:
                    _say(cluster.tails())
        except KeyboardInterrupt:
            _say("interrupted: every process the load test started was stopped")
            return 130
        except Exception as exc:
            _say(f"the load test failed: {type(exc).__name__}: {exc}")
            _say(cluster.tails())
            return 1
    elapsed = time.monotonic() - began
    print(f"mpcml load test: {args.jobs} small jobs submitted at once to one coordinator")
    print()
    print(_table(summary_rows(subs, out)))
    print()
    print(_table(phase_rows(subs, out)))
    print()
    print(footer(args.jobs, elapsed, setup, start_order(subs, out), logs, args.workdir))
    if out.problems:
        print(f"\nFAILED: {len(out.problems)} problems:")
        for problem in out.problems[:20]:
            print(f"  {problem}")
        if len(out.problems) > 20:
            print(f"  ... and {len(out.problems) - 20} more")
        return 1
    print(f"\nOK: all {args.jobs} jobs COMPLETED with their predictions, none lost or duplicated.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
