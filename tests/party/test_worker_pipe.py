"""The worker's end of the daemon's pipe: a GO heard again brings the report again."""

from __future__ import annotations

import multiprocessing

from mpcml.party.worker import _Pipe
from mpcml.proto.v1 import coordinator_pb2 as cpb


def _go(round: int) -> bytes:
    return cpb.Assignment(go=cpb.GoRound(job_id="j", round=round)).SerializeToString()


def test_a_repeated_go_of_the_reported_round_sends_the_report_again() -> None:
    daemon, worker = multiprocessing.Pipe()
    pipe = _Pipe(worker, "j", "alice")
    pipe.send(done=cpb.RoundDone(round=1, checkpoint_digest="d1"))
    first = cpb.WorkerReport.FromString(daemon.recv_bytes())
    for message in (_go(1), _go(1), cpb.Assignment().SerializeToString(), _go(2)):
        daemon.send_bytes(message)
    pipe.wait_go(2)  # returns on round 2's GO, after answering the repeats of round 1's
    repeats = [cpb.WorkerReport.FromString(daemon.recv_bytes()) for _ in range(2)]
    assert repeats == [first, first] and first.done.checkpoint_digest == "d1"
    assert not daemon.poll(0.1)  # nothing for the empty message
