"""`mpcml job ...`: submit, status, watch, cancel, resume, result, list."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, TextIO

import grpc
from google.protobuf import json_format

from mpcml.api.client import Client, ClientError, JobError
from mpcml.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from mpcml.jobs.events import EventKind
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.transport.address import parse
from mpcml.transport.tls import TLSFiles

BAD_INPUT = {
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
}
"""Refusals of the request itself: exit code 2, as for a malformed job file."""


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    """How a client reaches the coordinator; each has an `MPCML_*` environment default."""
    env = os.environ.get
    p.add_argument(
        "--coordinator",
        default=env("MPCML_COORDINATOR", "127.0.0.1:7000"),
        help="HOST:PORT of the coordinator (env MPCML_COORDINATOR)",
    )
    p.add_argument("--ca", default=env("MPCML_CA"), help="CA certificate (env MPCML_CA)")
    p.add_argument("--cert", default=env("MPCML_CERT"), help="client certificate (env MPCML_CERT)")
    p.add_argument("--key", default=env("MPCML_KEY"), help="client key (env MPCML_KEY)")
    p.add_argument(
        "--server-name",
        default=env("MPCML_SERVER_NAME", "coordinator"),
        help="the name the coordinator's certificate carries",
    )
    p.add_argument("--insecure", action="store_true", help="plaintext, for debugging only")


def add_parsers(sub: Any) -> None:
    """The `job` command and its sub-commands."""
    job = sub.add_parser("job", help="submit and follow jobs")
    jobs = job.add_subparsers(dest="job_command", required=True)

    def command(name: str, help: str, read: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = jobs.add_parser(name, help=help)
        add_client_arguments(p)
        if read:
            p.add_argument("--format", choices=["text", "json"], default="text")
        return p

    p = command("submit", "submit a job file (TOML; see README 'The job file')")
    p.add_argument("file")
    p.add_argument("--idempotency-key", help="overrides the file's idempotency_key")
    p.add_argument("--watch", action="store_true", help="then watch it until it ends")
    for name, help in [
        ("status", "a job's state"),
        ("watch", "follow a job's rounds live"),
        ("cancel", "cancel a job"),
        ("purge", "remove an ended job's checkpoints, shares and results at its parties"),
        ("result", "a job's public results"),
        ("profile", "where a finished job's time went: rounds, bytes, seconds per graph node"),
    ]:
        command(name, help).add_argument("job_id")
    p = command("resume", "run a FAILED job again from its last committed round")
    p.add_argument("job_id")
    p.add_argument("--watch", action="store_true", help="then watch it until it ends")
    p = command(
        "estimate",
        "what a job file would cost each party (peak memory, bytes and rounds per batch) "
        "against each party's limits; exit 1 when a limit refuses it",
    )
    p.add_argument("file")
    p = jobs.add_parser(
        "digest", help="the digest of a job file's model, which a party's policy.graphs approves"
    )
    p.add_argument("file")
    p = command(
        "parties",
        "the parties registered with the coordinator, and the commitment of each private model "
        "(what a party's policy.graphs pins weights by)",
    )
    p.add_argument(
        "--wait", nargs="+", metavar="NAME", help="first wait until these are registered"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    p = command("list", "your jobs (an admin's: every job)")
    p.add_argument(
        "--state",
        choices=[s for s in cpb.JobState.keys() if s != "JOB_STATE_UNSPECIFIED"],  # noqa: SIM118
    )


def _client(args: argparse.Namespace) -> Client:
    if args.insecure:
        print("WARNING: talking to the coordinator over PLAINTEXT (--insecure)", file=sys.stderr)
        return Client(args.coordinator, insecure=True, server_name=args.server_name)
    missing = [f"--{k}" for k in ("ca", "cert", "key") if not getattr(args, k)]
    if missing:
        raise ValueError(f"give {', '.join(missing)} (or MPCML_CA, MPCML_CERT, MPCML_KEY)")
    client = Client(
        args.coordinator, TLSFiles(args.ca, args.cert, args.key), server_name=args.server_name
    )
    _listening(args.coordinator)
    return client


def _listening(address: str) -> None:
    """Fail at once where nothing listens: gRPC would wait out the whole deadline (30 s)."""
    try:
        where = parse(address, "--coordinator")
        socket.create_connection((where.host, where.port), timeout=3).close()
    except ConnectionRefusedError:
        raise ClientError(
            grpc.StatusCode.UNAVAILABLE,
            f"nothing listens at {address}: is the coordinator running, and is this its address "
            "(--coordinator, MPCML_COORDINATOR)?",
        ) from None
    except OSError:  # unresolvable, unroutable or slow: gRPC's own wait and message follow
        return


def _json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _status_text(s: cpb.JobStatus) -> str:
    """`_status_line`, the model's digest (for `policy.graphs`) and its approximation plan."""
    text = _status_line(s) + (f"\n  model: {s.graph_digest}" if s.graph_digest else "")
    plan = s.approximations
    text += f"\n  approximations: {plan.source or 'crypten'}"
    for kind in ("nodes", "ops"):
        for name, entry in sorted(getattr(plan, kind).items()):
            knobs = ", ".join(f"{k}={v:g}" for k, v in sorted(entry.knobs.items()))
            calibrated = f" on [{entry.low:.4g}, {entry.high:.4g}]" if entry.calibrated else ""
            text += f"\n    {name}: {entry.implementation or 'crypten'}({knobs}){calibrated}"
    if s.estimate.peak_memory_bytes:
        text += "\n  estimate: " + "\n    ".join(_estimate_lines(s.estimate))
    return text


def _estimate_lines(e: cpb.ResourceEstimate) -> list[str]:
    from mpcml.jobs.estimate import describe

    return describe(e)


def _status_line(s: cpb.JobStatus) -> str:
    """One job: its state, the round in progress and the last committed one.

    The public metrics are the committed round's, labelled with it: a failed or cancelled job
    stopped in a later round than the one its loss belongs to.
    """
    metrics = " ".join(f"{k}={v:.4f}" for k, v in sorted(s.metrics.items()))
    if metrics and s.task == jpb.TASK_TRAIN and s.committed_round:
        metrics += f" (round {s.committed_round})"
    if s.state == cpb.COMPLETED or s.committed_round == s.current_round:
        rounds = f"round {s.current_round}/{s.total_rounds}"
    else:
        rounds = f"round {s.current_round}/{s.total_rounds}, committed {s.committed_round}"
    line = (
        f"{s.job_id}  {cpb.JobState.Name(s.state):<9}  {rounds}  {s.name or '-'}  "
        f"[{', '.join(s.parties)}]"
    )
    if s.rows:
        line += f"  rows={s.rows}"
    if metrics:
        line += f"  {metrics}"
    if s.reason:
        line += f"\n  reason: {s.reason}"
    for warning in s.warnings:
        line += f"\n  {warning}"
    return line


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // max(total, 1)
    return "#" * filled + "." * (width - filled)


def watch(client: Client, job_id: str, out: TextIO, as_json: bool = False) -> int:
    """Print a job's events until it ends; the exit code says whether it completed."""
    tty = out.isatty() and not as_json
    final = cpb.JOB_STATE_UNSPECIFIED
    for e in client.job(job_id).watch():
        if as_json:
            print(json.dumps(_json(e)), file=out, flush=True)
        elif e.kind == EventKind.ROUND_DONE:
            loss = f"  loss {e.metrics['loss']:.4f}" if "loss" in e.metrics else ""
            text = f"round {e.round}/{e.total_rounds} [{_bar(e.round, e.total_rounds)}]{loss}"
            print(("\r" + text) if tty else text, end="" if tty else "\n", file=out, flush=True)
        elif e.kind == EventKind.STATE:
            if tty:
                print(file=out)
            reason = f": {e.message}" if e.message else ""
            print(f"{cpb.JobState.Name(e.state)}{reason}", file=out, flush=True)
        if e.kind == EventKind.STATE:
            final = e.state
    return EXIT_OK if final == cpb.COMPLETED else EXIT_FAILED


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run one `job` sub-command."""
    as_json = getattr(args, "format", "text") == "json"
    emit: Callable[[Any, str], None] = (
        (lambda m, _t: print(json.dumps(_json(m), indent=2), file=out))
        if as_json
        else (lambda _m, t: print(t, file=out))
    )
    command = args.job_command
    if command == "digest":  # offline: the model is traced here, nothing is sent
        from mpcml.api.jobfile import load
        from mpcml.graph.digest import graph_digest

        job, _ = load(args.file)
        if job.model is not None:
            print(
                "error: the model is captured for the shape of its input rows: give it as "
                "input_shape = [...] in the job file's [model] table",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        print(graph_digest(job.spec.graph), file=out)
        return EXIT_OK
    with _client(args) as client:
        if command == "submit":
            from mpcml.api.jobfile import load

            job, key = load(args.file)
            handle = client.submit(job, args.idempotency_key or key or None)
            status = handle.status()
            emit(status, _status_text(status))
            return watch(client, handle.id, out) if args.watch else EXIT_OK
        if command == "estimate":
            from mpcml.api.jobfile import load

            job, _ = load(args.file)
            found, over = client.estimate(job)
            refused = [line for lines in over.values() for line in lines]
            if as_json:
                print(json.dumps({"estimate": _json(found), "over": refused}, indent=2), file=out)
            else:
                print("\n".join(_estimate_lines(found)), file=out)
                for line in refused:
                    print(f"over {line}", file=out)
                if not refused:
                    print(f"within the limits of {', '.join(over)}", file=out)
            return EXIT_FAILED if refused else EXIT_OK
        if command == "list":
            jobs = client.jobs(args.state or cpb.JOB_STATE_UNSPECIFIED)
            if as_json:
                print(json.dumps([_json(j) for j in jobs], indent=2), file=out)
            else:
                for j in jobs:
                    print(_status_line(j), file=out)
            return EXIT_OK
        if command == "parties":
            parties = (
                client.wait_for_parties(args.wait, args.timeout) if args.wait else client.parties()
            )
            if as_json:
                print(json.dumps([_json(p) for p in parties], indent=2), file=out)
            for p in [] if as_json else parties:
                state = "connected" if p.connected else "disconnected"
                datasets = ", ".join(d.name for d in p.datasets)
                print(f"{p.name:<10} {state:<12} {p.data_address:<22} {datasets}", file=out)
                for m in p.model_info:  # what an operator pastes into policy.graphs
                    print(f"  model {m.name}: {m.commitment}", file=out)
            return EXIT_OK
        handle = client.job(args.job_id)
        if command == "status":
            status = handle.status()
            emit(status, _status_text(status))
        elif command == "watch":
            return watch(client, args.job_id, out, as_json)
        elif command == "cancel":
            status = handle.cancel()
            emit(status, _status_line(status))
        elif command == "purge":
            purged = handle.purge()
            absent = f"; not attached, purge again later: {', '.join(purged.absent)}"
            emit(
                purged,
                f"{handle.id}: purge sent to {', '.join(purged.parties) or 'no party'}"
                + (absent if purged.absent else ""),
            )
            return EXIT_FAILED if purged.absent else EXIT_OK
        elif command == "resume":
            status = handle.resume()
            emit(status, _status_line(status))
            return watch(client, handle.id, out) if args.watch else EXIT_OK
        elif command == "result":
            result = handle.result()
            emit(result, _result_text(result))
        elif command == "profile":
            result = handle.result()
            if as_json:
                print(json.dumps(_json(result).get("profile", []), indent=2), file=out)
            else:
                print(profile_text(result), file=out)
        return EXIT_OK


def profile_text(r: cpb.JobResult) -> str:
    """The cost profile as a table, each entry's share of the profiled seconds beside it."""
    if not r.profile:
        return f"job {r.status.job_id}: no profile (the parties have not finished)"
    total = sum(c.seconds for c in r.profile) or 1.0
    lines = [
        f"{'node':<28} {'op':<24} {'calls':>6} {'rounds':>7} {'MiB':>8} {'seconds':>8} {'share':>6}"
    ]
    for c in r.profile:
        lines.append(
            f"{c.node[:28]:<28} {c.op[:24]:<24} {c.calls:>6} {c.rounds:>7} "
            f"{c.bytes / 2**20:>8.2f} {c.seconds:>8.2f} {100 * c.seconds / total:>5.1f}%"
        )
    lines.append(
        f"rounds: the most of any party; MiB: all parties; first batch {r.first_batch_seconds:.3f}"
        f" s, median batch {r.median_batch_seconds:.3f} s"
    )
    return "\n".join(lines)


def _result_text(r: cpb.JobResult) -> str:
    lines = [
        _status_line(r.status),
        f"  {r.bytes_sent} bytes sent, {r.communication_rounds} communication rounds, "
        f"{r.seconds:.1f} s",
    ]
    if any(d != "cpu" for d in r.devices.values()):  # a party computed on a GPU
        lines.append("  devices: " + ", ".join(f"{p} {d}" for p, d in sorted(r.devices.items())))
    for rm in r.rounds:
        if rm.metrics:
            lines.append(
                f"  round {rm.round}: " + " ".join(f"{k}={v:.4f}" for k, v in rm.metrics.items())
            )
    for o in r.outputs:
        from mpcml.proto.v1 import job_pb2 as jpb

        lines.append(f"  {jpb.Output.Name(o.output)[7:].lower()} -> {o.party}: {o.path}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`mpcml job ...` with errors turned into messages and exit codes."""
    try:
        return run(args)
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT if exc.code.name in BAD_INPUT else EXIT_FAILED
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:  # a bad job file, a model off the whitelist, missing TLS files
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


__all__ = ["add_client_arguments", "add_parsers", "main", "watch"]
