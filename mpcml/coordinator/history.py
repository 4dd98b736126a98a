"""A job's history: what its stored events say, and the public views clients read.

Everything is computed from the store (the job record and its event log), so that it survives
a coordinator restart and the servicers only translate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from mpcml.coordinator.store import Event, Job, JobState
from mpcml.graph.digest import graph_digest
from mpcml.jobs.events import EventKind
from mpcml.jobs.spec import parties_in_order
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb

TFP_WARNING = (
    "INSECURE: insecure_provider = 'tfp': correlated randomness comes from CrypTen's TFP "
    "provider, which lets party 0 recover the other parties' inputs"
)
PLAINTEXT_WARNING = "INSECURE: the coordinator runs without TLS or authentication (--insecure)"


@dataclass
class History:
    """What a job's events say about its progress."""

    total_rounds: int
    committed: int = 0
    digests: dict[str, str] = field(default_factory=dict)
    """Each party's checkpoint digest of the committed round."""
    resumes: int = 0
    estimate: cpb.ResourceEstimate = field(default_factory=cpb.ResourceEstimate)
    """What the parties estimated the job costs them, at submission."""


def job_history(events: list[Event]) -> History:
    """Rounds, the last committed one with its checkpoint digests, and resumes."""
    history = History(total_rounds=int(events[0].data["total_rounds"]) if events else 0)
    if events and events[0].data.get("estimate"):
        json_format.ParseDict(events[0].data["estimate"], history.estimate)
    for event in events:
        if event.kind == EventKind.ROUND_DONE:
            history.committed = event.round
            history.digests = dict(event.data.get("digests", {}))
        elif event.kind == EventKind.RESUMED:
            history.resumes += 1
    return history


def reconstruct(shares: list[cpb.MetricShare]) -> dict[str, float]:
    """Sum additive fixed-point shares modulo 2^64 and decode them."""
    sums: dict[str, int] = {}
    scales: dict[str, int] = {}
    for s in shares:
        sums[s.name] = (sums.get(s.name, 0) + s.share) % 2**64
        scales[s.name] = s.scale
    out = {}
    for name, total in sums.items():
        signed = total - 2**64 if total >= 2**63 else total
        out[name] = signed / max(scales[name], 1)
    return out


def job_status(job: Job, events: list[Event], insecure: bool = False) -> cpb.JobStatus:
    """A job's public status from its store record and its event log."""
    spec = jpb.JobSpec.FromString(job.spec)
    status = cpb.JobStatus(
        job_id=job.job_id,
        name=spec.name,
        state=job.state.value,
        reason=job.reason,
        current_round=job.current_round,
        submitter=job.submitter,
        task=spec.task,
        parties=parties_in_order(spec),
        idempotency_key=job.idempotency_key,
        warnings=[
            *([TFP_WARNING] if spec.insecure_provider == "tfp" else []),
            *([PLAINTEXT_WARNING] if insecure else []),
        ],
        graph_digest=graph_digest(spec.graph),
        approximations=spec.approximations,
    )
    status.state_times.update(job.state_times)
    history = job_history(events)
    status.total_rounds = history.total_rounds
    status.committed_round, status.resumes = history.committed, history.resumes
    status.estimate.CopyFrom(history.estimate)
    rows: dict[str, int] = {}
    for event in events:
        if event.kind in (EventKind.ROUND_DONE, EventKind.FINAL_METRICS):
            status.metrics.clear()
            status.metrics.update(event.data.get("metrics", {}))
        elif event.kind == EventKind.PARTY_READY:
            rows[str(event.data.get("party"))] = int(event.data.get("rows", 0))
    status.rows = max(rows.values(), default=0)  # every party reports the job's input rows
    return status


def job_event(event: Event) -> cpb.JobEvent:
    """A store event as the public `JobEvent`."""
    out = cpb.JobEvent(
        seq=event.seq,
        at=event.at,
        kind=event.kind,
        round=event.round,
        message=str(event.data.get("reason") or event.data.get("party") or ""),
        total_rounds=int(event.data.get("total_rounds", 0)),
        state=event.data.get("state", "JOB_STATE_UNSPECIFIED"),
    )
    out.metrics.update(event.data.get("metrics", {}))
    return out


def _add_profile(result: cpb.JobResult, data: dict[str, Any]) -> None:
    """Fold one party's cost profile in: rounds, seconds and calls the most, bytes summed."""
    costs = {c.node: c for c in result.profile}
    for entry in data.get("profile", []):
        cost = costs.get(entry["node"])
        if cost is None:
            cost = costs[entry["node"]] = result.profile.add(node=entry["node"], op=entry["op"])
        cost.rounds = max(cost.rounds, int(entry["rounds"]))
        cost.bytes += int(entry["bytes"])
        cost.seconds = max(cost.seconds, float(entry["seconds"]))
        cost.calls = max(cost.calls, int(entry["calls"]))
    result.first_batch_seconds = max(
        result.first_batch_seconds, float(data.get("first_batch_seconds", 0.0))
    )
    result.median_batch_seconds = max(
        result.median_batch_seconds, float(data.get("median_batch_seconds", 0.0))
    )


def job_result(job: Job, events: list[Event], insecure: bool = False) -> cpb.JobResult:
    """The public part of a job's results: status, metrics per round, outputs, traffic."""
    result = cpb.JobResult(status=job_status(job, events, insecure))
    started: dict[int, float] = {}
    for e in events:
        if e.kind == EventKind.ROUND_STARTED:
            started[e.round] = e.at
        elif e.kind == EventKind.ROUND_DONE:
            seconds = e.at - started[e.round] if e.round in started else 0.0
            result.rounds.append(
                cpb.RoundMetrics(round=e.round, metrics=e.data["metrics"], seconds=seconds)
            )
        elif e.kind == EventKind.RESUMED:  # what counts is the run that finished
            del result.outputs[:]
            del result.profile[:]
            result.bytes_sent = result.communication_rounds = 0
            result.first_batch_seconds = result.median_batch_seconds = 0.0
            result.peak_memory_bytes.clear()
            result.devices.clear()
        elif e.kind == EventKind.PARTY_FINISHED:
            result.bytes_sent += int(e.data["bytes_sent"])
            result.communication_rounds = max(
                result.communication_rounds, int(e.data["communication_rounds"])
            )
            _add_profile(result, e.data)
            result.peak_memory_bytes[e.data["party"]] = int(e.data.get("peak_memory_bytes", 0))
            if e.data.get("device"):
                result.devices[e.data["party"]] = str(e.data["device"])
            for o in e.data["outputs"]:
                result.outputs.append(
                    cpb.PartyOutput(
                        party=e.data["party"], output=o["output"], path=o["path"], shape=o["shape"]
                    )
                )
    times = job.state_times
    if JobState.RUNNING.value in times:
        result.seconds = max(times.values()) - times[JobState.STARTING.value]
    return result
