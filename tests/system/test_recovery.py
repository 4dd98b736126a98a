"""Faults in the middle of a training job: the job fails fast naming the party, and a resume
goes on from the last committed round, from every party's own checkpoint, to the result an
uninterrupted run gives.

A dealer restarted mid-job keeps its sessions (its `state_dir`) and the job goes on after a
pause; so does a coordinator killed and started again, on SQLite or PostgreSQL: it takes its
running jobs back (their leases are its own) and the parties attach again.

Every run of a job draws the same randomness round by round (the parties' job secrets, the
dealer's job keys), so a resumed run recomputes a lost round bit for bit: the checkpoints it
writes are the bytes the interrupted run wrote, and the weights it reveals are what the
interrupted run's shares add up to. Another job (the reference run) draws other randomness,
so its weights match up to fixed-point noise: within `RESUME_TOLERANCE`, and both within
`OUTPUT_TOLERANCE` of plaintext PyTorch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from mpcml.api.client import Client, ClientError, JobHandle
from mpcml.api.job import Job
from mpcml.demo import data, models
from mpcml.demo.cluster import PARTIES_DIR, LocalCluster
from mpcml.demo.run import plaintext_train
from mpcml.party.worker import HOLD_DONE_FILE, HOLD_FILE
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.runtime.provider import RESTART_WAIT_S
from tests.support.relay import Relay
from tests.system.conftest import audit_entries, cli

pytestmark = pytest.mark.system

EPOCHS = 1
BATCHES_PER_ROUND = 3
"""455 rows in batches of 64: 8 batches, in rounds of 3, 3 and 2."""
MOMENTUM = 0.5
SEED = 11
OUTPUT_TOLERANCE = 0.05
RESUME_TOLERANCE = 0.01
FAIL_WITHIN_S = 15.0 + 5.0
"""The cluster's heartbeat timeout plus a few seconds."""


def _train() -> Job:
    """Three rounds (one epoch of 8 batches) of logistic regression with momentum."""
    return Job.train(
        model=models.LogisticRegression(),
        features={"alice": "bc-train", "bob": "bc-train-positional"},
        labels={"carol": "bc-train-labels"},
        epochs=EPOCHS,
        batches_per_round=BATCHES_PER_ROUND,
        momentum=MOMENTUM,
        seed=SEED,
        reveal={"weights": ["carol"]},
    )


def _assert_resume_audited(cluster: LocalCluster, job: JobHandle, committed: int) -> None:
    """Every party's audit log records the first run and the resume from `committed`."""
    for party in ("alice", "bob", "carol"):
        started = [
            e["resume_round"]
            for e in audit_entries(cluster, party)
            if e["kind"] == "job_started" and e["job"] == job.id
        ]
        assert started[0] == 0 and started[-1] == committed, (party, started)


def _weights(job: JobHandle) -> dict[str, torch.Tensor]:
    [output] = job.result().outputs
    return dict(torch.load(output.path, weights_only=True))


def _plaintext_weights() -> dict[str, torch.Tensor]:
    split = data.breast_cancer()
    model = plaintext_train(
        models.LogisticRegression(),
        split.x_train,
        split.y_train,
        epochs=EPOCHS,
        lr=0.1,
        momentum=MOMENTUM,
        seed=SEED,
    )
    return dict(model.state_dict())


def _await_round_2(job: JobHandle) -> None:
    deadline = time.monotonic() + 120
    while job.status().current_round < 2:
        assert job.status().state not in (cpb.FAILED, cpb.CANCELLED, cpb.COMPLETED)
        assert time.monotonic() < deadline, "round 2 never started"
        time.sleep(0.1)


@contextlib.contextmanager
def _round_2_held(cluster: LocalCluster) -> Iterator[None]:
    """alice's worker holds before round 2 (`worker.HOLD_FILE`) until the block ends.

    The others wait for her inside round 2, so a fault the block sets off lands in round 2 and
    the job cannot finish first, however fast or loaded the machine is.
    """
    gate = cluster.workdir / "alice" / "state" / HOLD_FILE.format(round=2)
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()
    try:
        yield
    finally:
        gate.unlink()


def _kill_during_round_2(
    cluster: LocalCluster, job: JobHandle, party: str, sig: int = signal.SIGKILL
) -> float:
    """Signal `party` (its daemon and worker) once round 1 is committed; returns when.

    SIGKILL ends the processes; SIGSTOP freezes them (SIGCONT them afterwards).
    """
    _await_round_2(job)
    if sig == signal.SIGKILL:
        cluster.stop_process(party, sig)
    else:
        os.killpg(cluster.processes[party].pid, sig)
    return time.monotonic()


def _restart(cluster: LocalCluster, client: Client, party: str) -> None:
    cluster.start_party(party)
    cluster.wait_for_parties(client, 60)


def test_a_party_killed_mid_training_fails_the_job_and_a_resume_finishes_it(
    cluster: LocalCluster, client: Client
) -> None:
    reference = client.submit(_train())
    assert reference.wait(timeout=240).state == cpb.COMPLETED
    with _round_2_held(cluster):
        job = client.submit(_train())
        killed = _kill_during_round_2(cluster, job, "bob")
    status = job.wait(timeout=FAIL_WITHIN_S)
    failed_after = time.monotonic() - killed
    assert status.state == cpb.FAILED and "'bob'" in status.reason, status.reason
    assert status.committed_round == 1, status
    shown = cli(cluster, "job", "status", job.id).stdout  # the text names the committed round
    assert f"round {status.current_round}/3, committed 1" in shown, shown
    for party in ("alice", "carol"):  # the survivors' workers have exited
        deadline = time.monotonic() + 10
        while f"job {job.id}: worker exited" not in (cluster.logs / f"{party}.log").read_text():
            assert time.monotonic() < deadline, f"{party}'s worker is still running"
            time.sleep(0.2)

    _restart(cluster, client, "bob")
    resumed = job.resume()
    assert resumed.state in (cpb.PENDING, cpb.STARTING) and resumed.resumes == 1
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert [r.round for r in job.result().rounds] == [1, 2, 3]
    _assert_resume_audited(cluster, job, status.committed_round)

    secure, uninterrupted = _weights(job), _weights(reference)
    plain = _plaintext_weights()
    for key, value in plain.items():
        diff = float((secure[key] - uninterrupted[key]).abs().max())
        assert diff < RESUME_TOLERANCE, f"{key}: resumed and uninterrupted differ by {diff}"
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key
    print(f"failed {failed_after:.1f} s after the kill; resumed vs uninterrupted max diff {diff}")


def _checkpoint(cluster: LocalCluster, party: str, job: JobHandle, round: int) -> Path:
    return cluster.workdir / party / "state" / "jobs" / job.id / f"checkpoint-{round}.pt"


def resume_after_losing_round_3(
    cluster: LocalCluster, client: Client
) -> tuple[JobHandle, dict[str, bytes]]:
    """`_train()` run until every party has checkpointed round 3, bob killed before it is
    committed, then resumed to completion; returns the job and the lost round's checkpoints.

    The resumed run recomputes round 3 from round 2's checkpoints: its checkpoints of round 3
    must be the lost ones, byte for byte (the caller compares them).
    """
    parties = ("alice", "bob", "carol")
    gate = cluster.workdir / "alice" / "state" / HOLD_DONE_FILE.format(round=3)
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()  # every party runs round 3 and checkpoints it; alice then holds her report
    try:
        job = client.submit(_train())
        paths = {p: _checkpoint(cluster, p, job, 3) for p in parties}
        deadline = time.monotonic() + 180
        while not all(path.is_file() for path in paths.values()):
            assert job.status().state in (cpb.STARTING, cpb.RUNNING), job.status()
            assert time.monotonic() < deadline, "round 3 was never checkpointed"
            time.sleep(0.1)
        interrupted = {p: path.read_bytes() for p, path in paths.items()}
        cluster.stop_process("bob", signal.SIGKILL)
        status = job.wait(timeout=FAIL_WITHIN_S)
    finally:
        gate.unlink()
    assert status.state == cpb.FAILED and status.committed_round == 2, status

    _restart(cluster, client, "bob")
    job.resume()
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert [r.round for r in job.result().rounds] == [1, 2, 3]
    _assert_resume_audited(cluster, job, status.committed_round)
    return job, interrupted


def same_checkpoints(cluster: LocalCluster, job: JobHandle, lost: dict[str, bytes]) -> None:
    """Each party's checkpoint of round 3 is, byte for byte, the one the lost run wrote."""
    for party, written in lost.items():
        digest = hashlib.sha256(_checkpoint(cluster, party, job, 3).read_bytes()).hexdigest()
        assert digest == hashlib.sha256(written).hexdigest(), party


def test_a_resumed_run_recomputes_the_lost_round_bit_for_bit(
    cluster: LocalCluster, client: Client
) -> None:
    import crypten

    job, interrupted = resume_after_losing_round_3(cluster, client)
    same_checkpoints(cluster, job, interrupted)  # round 3 again, from round 2's checkpoints
    shares = [torch.load(io.BytesIO(b), weights_only=True)["shares"] for b in interrupted.values()]
    encoder = crypten.encoder.FixedPointEncoder()
    secure = _weights(job)
    for key, value in secure.items():
        total = shares[0][key] + shares[1][key] + shares[2][key]
        assert torch.equal(value, encoder.decode(total)), key
        assert torch.allclose(value, _plaintext_weights()[key], atol=OUTPUT_TOLERANCE), key


def test_a_corrupted_checkpoint_is_refused_naming_the_party_and_round(
    cluster: LocalCluster, client: Client
) -> None:
    with _round_2_held(cluster):
        job = client.submit(_train())
        _kill_during_round_2(cluster, job, "carol")
    assert job.wait(timeout=FAIL_WITHIN_S).state == cpb.FAILED
    checkpoint = cluster.workdir / "alice" / "state" / "jobs" / job.id / "checkpoint-1.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:-100])  # truncated
    _restart(cluster, client, "carol")
    job.resume()
    status = job.wait(timeout=120)
    assert status.state == cpb.FAILED
    assert "party 'alice': its checkpoint of round 1" in status.reason, status.reason
    assert "does not match the digest committed for that round" in status.reason


def test_only_a_failed_job_can_be_resumed(client: Client) -> None:
    job = client.submit(_train())
    job.cancel()
    with pytest.raises(ClientError) as info:
        job.resume()
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "is CANCELLED; only a FAILED job can be resumed" in info.value.message


def test_a_dealer_killed_and_restarted_mid_training_costs_a_pause_not_the_job(
    cluster: LocalCluster, client: Client
) -> None:
    with _round_2_held(cluster):
        job = client.submit(_train())
        _kill_during_round_2(cluster, job, "dealer")
    # Round 2 now asks the dead dealer for its tuples: the parties wait for it to come back.
    time.sleep(3)
    assert job.status().state == cpb.RUNNING
    cluster.start_dealer()
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert final.resumes == 0 and [r.round for r in job.result().rounds] == [1, 2, 3]
    assert "stopped answering" in (cluster.logs / "alice.log").read_text()
    assert "kept from before the restart" in (cluster.logs / "dealer.log").read_text()
    secure, plain = _weights(job), _plaintext_weights()
    for key, value in plain.items():
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key


def test_a_dealer_killed_mid_training_fails_the_job_naming_it_and_a_resume_finishes_it(
    cluster: LocalCluster, client: Client
) -> None:
    with _round_2_held(cluster):
        job = client.submit(_train())
        _kill_during_round_2(cluster, job, "dealer")
    status = job.wait(timeout=FAIL_WITHIN_S + RESTART_WAIT_S)
    assert status.state == cpb.FAILED and "the dealer at" in status.reason, status.reason
    assert f"did not answer again within {RESTART_WAIT_S:.0f} s" in status.reason, status.reason
    cluster.start_dealer()
    job.resume()
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert final.resumes == 1 and [r.round for r in job.result().rounds] == [1, 2, 3]


def _coordinator_killed_and_started_again(cluster: LocalCluster, client: Client) -> None:
    """Kill the coordinator in round 2, start it again: the same job goes on to the end."""
    with _round_2_held(cluster):
        job = client.submit(_train())
        _kill_during_round_2(cluster, job, "coordinator")
        cluster.start_coordinator()
        cluster.wait_for_parties(client, 60)  # they attach again by themselves
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert final.resumes == 0
    assert [r.round for r in job.result().rounds] == [1, 2, 3]
    assert "taken over in round 2" in (cluster.logs / "coordinator.log").read_text()
    secure, plaintext = _weights(job), _plaintext_weights()
    for key, expected in plaintext.items():
        diff = float((secure[key] - expected).abs().max())
        assert diff < OUTPUT_TOLERANCE, f"{key}: max diff {diff} from plaintext"


def test_a_coordinator_killed_mid_training_is_started_again_and_the_job_goes_on(
    cluster: LocalCluster, client: Client
) -> None:
    _coordinator_killed_and_started_again(cluster, client)


def test_a_coordinator_on_postgresql_killed_mid_training_takes_its_job_back(
    pg_url: str, tmp_path: Path
) -> None:
    parties = tmp_path / "parties"
    shutil.copytree(
        PARTIES_DIR, parties, ignore=shutil.ignore_patterns("state", "results", "certs")
    )
    with LocalCluster(
        tmp_path / "run", parties_dir=parties, coordinator_settings={"store": pg_url}
    ) as cluster:
        client = cluster.start()
        _coordinator_killed_and_started_again(cluster, client)
        assert (
            "jobs in postgresql://postgres@127.0.0.1:"
            in (cluster.logs / "coordinator.log").read_text()
        )


def test_a_frozen_party_fails_the_job_naming_it_and_a_resume_finishes_it(
    cluster: LocalCluster, client: Client
) -> None:
    with _round_2_held(cluster):
        job = client.submit(_train())
        frozen = _kill_during_round_2(cluster, job, "bob", signal.SIGSTOP)
    try:
        status = job.wait(timeout=FAIL_WITHIN_S)
        print(f"FROZEN: failed {time.monotonic() - frozen:.1f} s after SIGSTOP: {status.reason}")
    finally:
        os.killpg(cluster.processes["bob"].pid, signal.SIGCONT)
    assert status.state == cpb.FAILED and "'bob'" in status.reason, status.reason
    cluster.wait_for_parties(client, 60)
    job.resume()
    final = job.wait(timeout=240)
    assert final.state == cpb.COMPLETED, final.reason
    assert [r.round for r in job.result().rounds] == [1, 2, 3]
    _assert_resume_audited(cluster, job, status.committed_round)


def _stop_party(cluster: LocalCluster, client: Client, party: str) -> None:
    """Stop `party` and wait until the coordinator has seen it go.

    Else `_restart` could find the old attachment still listed, and a job submitted next would
    send its policy check into the stream that is going away.
    """
    cluster.stop_process(party)
    deadline = time.monotonic() + 30
    while any(p.name == party and p.connected for p in client.parties()):
        assert time.monotonic() < deadline, f"the coordinator still lists {party} as attached"
        time.sleep(0.1)


@contextlib.contextmanager
def _through_relay(cluster: LocalCluster, client: Client, party: str) -> Iterator[Relay]:
    """Restart `party` reaching the coordinator through a `Relay`; back to direct afterwards."""
    relay = Relay(cluster.coordinator_address)
    cluster.coordinator_routes[party] = relay.address
    try:
        _stop_party(cluster, client, party)
        _restart(cluster, client, party)
        yield relay
    finally:
        del cluster.coordinator_routes[party]
        _stop_party(cluster, client, party)
        relay.close()
        _restart(cluster, client, party)


def test_a_party_whose_coordinator_link_breaks_mid_round_attaches_again_and_the_job_goes_on(
    cluster: LocalCluster, client: Client
) -> None:
    coordinator_log = cluster.logs / "coordinator.log"
    with _through_relay(cluster, client, "bob") as relay:
        with _round_2_held(cluster):
            job = client.submit(_train())
            _await_round_2(job)
            before = len(coordinator_log.read_text())
            relay.cut()  # bob's Attach stream and heartbeats break; its worker keeps computing
        final = job.wait(timeout=240)
        after_cut = coordinator_log.read_text()[before:]
    assert final.state == cpb.COMPLETED, final.reason
    assert final.resumes == 0 and [r.round for r in job.result().rounds] == [1, 2, 3]
    assert f"job {job.id}: party bob attached again; the job goes on" in after_cut, after_cut
    secure, plain = _weights(job), _plaintext_weights()
    for key, value in plain.items():
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key
