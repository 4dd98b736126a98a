"""The job worker: one fresh process per job (CrypTen's state is process-global).

The worker pool (`pool.py`) forks it from a server that imported torch and CrypTen once and
never touched CUDA (docs/architecture.md), and talks to it over a pipe of serialized protobuf
messages: the worker sends `WorkerReport`s (ready, round done, finished, failed), the daemon
passes on the coordinator's `GoRound` for each round. The worker never talks to the
coordinator itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from mpcml import logs
from mpcml.config import ConfigError
from mpcml.errors import MpcmlError
from mpcml.party import limits
from mpcml.party.config import PartyConfig
from mpcml.party.durable import job_secret
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.transport.address import port_offset
from mpcml.transport.errors import PeerFailedError

if TYPE_CHECKING:  # the daemon, which imports this module, never loads CrypTen
    from mpcml.runtime.prg import JobRandomness
    from mpcml.runtime.profile import Profile
    from mpcml.transport.communicator import PeerTraffic

log = logging.getLogger("mpcml.worker")

HOLD_FILE = "hold-round-{round}"
"""While `state_dir/hold-round-N` exists, a worker told to run round N waits before it starts.

A debugging aid for an operator, and how the tests make a fault land in a round they choose
whatever the machine's speed: the other parties wait for the held one inside the round.
"""
HOLD_DONE_FILE = "hold-done-{round}"
"""While `state_dir/hold-done-N` exists, a worker that has run round N and written its
checkpoint waits before it reports the round: how a test makes every party compute a round
that is then not committed."""
HOLD_POLL_S = 0.1


def _hold(config: PartyConfig, job_id: str, round: int, gate_file: str = HOLD_FILE) -> None:
    gate = config.state_dir / gate_file.format(round=round)
    if gate.exists():
        log.warning("job %s: holding at round %d while %s exists", job_id, round, gate)
    while gate.exists():
        time.sleep(HOLD_POLL_S)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (torch's allocator raises RuntimeError)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and "alloc" in text and "memory" in text
    )


def _reason(exc: BaseException, hard_limit: int = 0) -> str:
    """What the coordinator is told of a failure.

    An mpcml error's message as it is (written to hold no data); any other error by its type
    only, since its message could quote a value (it is logged here in full).
    """
    if isinstance(exc, MpcmlError):
        return str(exc)
    if hard_limit and _out_of_memory(exc):
        return (
            f"the job worker could not allocate memory under its hard cap of "
            f"{hard_limit / limits.MIB:.0f} MiB (RLIMIT_DATA: its memory cap, set from the "
            "job's estimate and policy.limits, plus reserved address space)"
        )
    return f"{type(exc).__name__} in the job worker (details in the party's log)"


def _dealer(start: cpb.StartJob, config: PartyConfig) -> Any:
    from mpcml.runtime.provider import DealerEndpoint

    if start.spec.insecure_provider == "tfp":
        log.warning("job %s uses CrypTen's TFP provider (insecure_provider)", start.job_id)
        return None
    if not config.dealer:
        raise ConfigError(
            f'party {config.name!r} has no dealer: set `dealer = "HOST:PORT"` in its config'
        )
    return DealerEndpoint(config.dealer, config.dealer_name)


def _randomness(start: cpb.StartJob, config: PartyConfig) -> JobRandomness:
    """The job's randomness: every run of the job draws the same (bit-exact resume)."""
    from mpcml.runtime.prg import JobRandomness

    context = hashlib.sha256(start.spec.SerializeToString(deterministic=True)).digest()
    secret = job_secret(config.job_state(start.job_id), context, config.name)
    return JobRandomness(job_id=start.job_id, secret=secret, context=context)


class _Pipe:
    """The worker's side of the daemon's pipe: reports out, GO messages in.

    A GO for the round the worker last reported means the coordinator did not get the report
    (it restarted, or another one took the job over): the report is sent again.
    """

    def __init__(self, conn: Connection, job_id: str, party: str) -> None:
        self.conn, self.job_id, self.party = conn, job_id, party
        self._done: cpb.WorkerReport | None = None

    def send(self, **kind: object) -> None:
        report = cpb.WorkerReport(job_id=self.job_id, party=self.party, **kind)  # type: ignore[arg-type]
        if report.WhichOneof("kind") == "done":
            self._done = report
        self.conn.send_bytes(report.SerializeToString())

    def wait_go(self, round: int) -> None:
        while True:
            message = cpb.Assignment.FromString(self.conn.recv_bytes())
            if message.WhichOneof("kind") == "go" and message.go.round == round:
                return
            done = self._done
            if message.WhichOneof("kind") == "go" and done and done.done.round == message.go.round:
                log.info("round %d's GO again: its report is sent again", message.go.round)
                self.conn.send_bytes(done.SerializeToString())
                continue
            log.warning("worker ignores an unexpected %s message", message.WhichOneof("kind"))


def _stats(job: Any) -> dict[str, int]:
    """The traffic counters every RoundDone and Finished carries."""
    sent, rounds = job.stats()
    return {"bytes_sent": sent, "communication_rounds": rounds}


def _profile(finished: cpb.Finished, costs: Profile, began: float) -> None:
    """Add the job's cost profile, with "(other)": what of its totals no node or phase covers."""
    entries = [
        cpb.NodeCost(
            node=name, op=c.op, rounds=c.rounds, bytes=c.bytes, seconds=c.seconds, calls=c.calls
        )
        for name, c in costs.costs.items()
    ]
    entries.append(
        cpb.NodeCost(
            node="(other)",
            op="other",
            rounds=max(0, finished.communication_rounds - sum(e.rounds for e in entries)),
            bytes=max(0, finished.bytes_sent - sum(e.bytes for e in entries)),
            seconds=max(0.0, time.perf_counter() - began - sum(e.seconds for e in entries)),
            calls=1,
        )
    )
    finished.profile.extend(entries)
    finished.first_batch_seconds, finished.median_batch_seconds = costs.first_and_median_batch()


def _traffic(traffic: PeerTraffic | None) -> list[cpb.PeerTraffic]:
    """Per-peer totals for the party daemon's metrics (it does not relay them further)."""
    if traffic is None:
        return []
    return [
        cpb.PeerTraffic(peer=peer, bytes_sent=sent, bytes_received=received)
        for peer, (sent, received) in sorted(traffic.totals().items())
    ]


def main(conn: Connection, start_bytes: bytes, config: PartyConfig, hard_limit: int = 0) -> None:
    """Entry point of the job worker process, forked from the pool's fork server.

    `hard_limit` caps its heap and private mappings (`limits.cap_memory`), so that a job far
    over its estimate fails here rather than take the machine's memory.
    """
    limits.cap_memory(hard_limit)
    logs.configure(f"{config.name} worker")
    start = cpb.StartJob.FromString(start_bytes)
    logs.bind(party=config.name, job_id=start.job_id)
    pipe = _Pipe(conn, start.job_id, config.name)
    round = 0
    traffic: PeerTraffic | None = None
    try:
        # Imported here: the daemon itself never loads CrypTen.
        import torch

        from mpcml.party.compute import JobComputation
        from mpcml.runtime import profile
        from mpcml.runtime.crypten_session import session

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)

        with session(
            start.rank,
            len(start.peers),
            [p.address for p in start.peers],
            peer_names=[p.name for p in start.peers],
            tls=config.tls,
            insecure=config.tls is None,
            session_id=start.job_id if not start.attempt else f"{start.job_id}.{start.attempt}",
            listen=port_offset(config.listen, start.slot),
            device=config.device,
            cuda_emulation=config.cuda_emulation,
            dealer=_dealer(start, config),
            network=config.network or None,
            randomness=_randomness(start, config),
        ) as s:
            traffic = s.traffic
            began = time.perf_counter()
            job = JobComputation(s, start, config)
            costs = profile.start(job.stats)
            rows = job.load()
            if start.resume_round:
                round = start.resume_round
                job.restore(start.resume_round, start.checkpoint_digest)
            pipe.send(ready=cpb.Ready(rows=rows))
            for round in range(start.resume_round + 1, start.total_rounds + 1):
                pipe.wait_go(round)
                _hold(config, start.job_id, round)
                logs.bind(round=round)
                began = time.monotonic()
                s.start_round(round)
                shares = job.run_round(round)
                digest = job.checkpoint(round)
                _hold(config, start.job_id, round, HOLD_DONE_FILE)
                seconds = time.monotonic() - began
                stats = _stats(job)
                log.debug("job %s round %d done in %.2f s: %s", start.job_id, round, seconds, stats)
                pipe.send(
                    done=cpb.RoundDone(
                        round=round,
                        metric_shares=shares,
                        seconds=seconds,
                        checkpoint_digest=digest,
                        traffic=_traffic(traffic),
                        **stats,
                    )
                )
            s.start_round(start.total_rounds + 1)
            outputs, shares = job.finish()
            sent, rounds = job.stats()
            finished = cpb.Finished(
                outputs=outputs,
                metric_shares=shares,
                traffic=_traffic(traffic),
                bytes_sent=sent,
                communication_rounds=rounds,
                peak_memory_bytes=limits.peak_rss(),
                device=s.placement.name,
            )
            _profile(finished, costs, began)
            pipe.send(finished=finished)
    except (EOFError, BrokenPipeError):
        log.warning("job %s: the party daemon went away; the worker stops", start.job_id)
        sys.exit(1)
    except BaseException as exc:
        log.error("job %s failed in round %d: %s", start.job_id, round, exc, exc_info=True)
        peer = isinstance(exc, PeerFailedError)
        with contextlib.suppress(OSError):
            pipe.send(
                failed=cpb.Failure(
                    reason=_reason(exc, hard_limit),
                    round=round,
                    peer=peer,
                    traffic=_traffic(traffic),
                )
            )
        sys.exit(1)
