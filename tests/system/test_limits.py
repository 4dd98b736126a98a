"""What a job may cost a party: refused at submit over a limit, stopped alone over its caps.

A cluster of its own, with limits in alice's and bob's `[policy.limits]`: bob admits jobs whose
estimated peak memory there is at most 900 MiB and stops workers after 15 s; alice caps her
workers at half their estimate plus 256 MiB, which a job that adds a gigabyte exceeds and a
logistic regression does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch import nn

from bench.estimate import Wide
from mpcml.api.client import Client, ClientError
from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import breast_cancer_task
from mpcml.party.worker import HOLD_FILE
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import cli, system_parties

ACCURACY_POINTS = 0.01
OUTPUT_TOLERANCE = 0.05
BOB_MEMORY_MIB = 900
BOB_SECONDS = 15


def _train(model: nn.Module, name: str) -> Job:
    return Job.train(
        model=model,
        features={"alice": "customers-train", "bob": "customers-train"},
        labels={"carol": "customers-train-labels"},
        align_on="id",
        epochs=1,
        loss="bce",
        reveal={"metrics": ["carol"]},
        name=name,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("limits")
    parties = system_parties(root)
    limits = {
        "alice": "memory_margin = 0.5\n",
        "bob": f"max_job_memory_mib = {BOB_MEMORY_MIB}\nmax_job_seconds = {BOB_SECONDS}\n",
    }
    for party, text in limits.items():
        with (parties / party / "party.toml").open("a") as f:
            f.write(f"\n[policy.limits]\n{text}")
    with LocalCluster(root / "run", parties_dir=parties, max_concurrent_jobs=2) as c:
        c.start()
        yield c


def test_a_job_over_a_partys_limit_is_refused_at_submit_naming_the_party_and_the_limit(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    with pytest.raises(ClientError) as refused:
        client.submit(_train(Wide(60_000), "too-wide"))
    assert refused.value.code.name == "RESOURCE_EXHAUSTED"
    message = str(refused.value)
    assert f"party 'bob''s limit max_job_memory_mib = {BOB_MEMORY_MIB}" in message, message
    assert "its estimated peak memory there is" in message
    assert not [j for j in client.jobs() if j.name == "too-wide"]
    # `mpcml job estimate` says the same before anything is submitted, and exits 1
    (tmp_path / "wide.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Wide(nn.Sequential):\n"
        "    def __init__(self, width):\n"
        "        super().__init__(nn.Linear(30, width), nn.Linear(width, 1), nn.Sigmoid())\n"
    )
    job_file = tmp_path / "wide.toml"
    job_file.write_text(
        'task = "train"\nalign_on = "id"\n[train]\nepochs = 1\nloss = "bce"\n'
        '[model]\npython = "wide.py:Wide"\nargs = { width = 60000 }\ninput_shape = [30]\n'
        '[features]\nalice = "customers-train"\nbob = "customers-train"\n'
        '[labels]\ncarol = "customers-train-labels"\n'
        '[reveal]\nmetrics = ["carol"]\n'
    )
    out = cli(cluster, "job", "estimate", str(job_file))
    assert out.returncode == 1, out.stderr
    assert "peak memory per party: alice" in out.stdout
    assert f"over party 'bob''s limit max_job_memory_mib = {BOB_MEMORY_MIB}" in out.stdout


def test_a_worker_over_its_memory_cap_fails_alone_while_another_job_completes(
    cluster: LocalCluster, client: Client
) -> None:
    wide = client.submit(_train(Wide(20_000), "wide"))
    # a second job on the same parties at the same time, compared with plaintext
    row = breast_cancer_task(client, "logreg", models.LogisticRegression(), epochs=1)
    assert abs(row.secure_accuracy - row.plaintext_accuracy) <= ACCURACY_POINTS
    assert row.max_abs_diff <= OUTPUT_TOLERANCE
    # its estimate, what its parties' workers measured, within the factor docs/failures.md states
    train = next(j for j in client.jobs() if j.name == "logreg-train")
    peaks = client.job(train.job_id).result().peak_memory_bytes
    assert set(peaks) == set(train.estimate.peak_memory_bytes) == {"alice", "bob", "carol"}
    for party, peak in peaks.items():
        assert 0.6 < train.estimate.peak_memory_bytes[party] / peak < 1.6, (party, peak)
    status = wide.wait(timeout=240)
    assert status.state == cpb.FAILED, status
    assert status.reason.startswith("party 'alice' failed: its job worker held"), status.reason
    assert "over its memory cap" in status.reason and "memory_margin = 0.5" in status.reason
    estimate = status.estimate.peak_memory_bytes["alice"]
    assert f"the job's estimate here, {estimate / 2**20:.0f} MiB" in status.reason
    _still_serving(cluster)


def test_a_worker_past_max_job_seconds_is_stopped_with_a_reason_naming_the_limit(
    cluster: LocalCluster, client: Client
) -> None:
    hold = cluster.workdir / "bob" / "state" / HOLD_FILE.format(round=1)
    hold.write_text("")
    try:
        began = time.monotonic()
        job = client.submit(_train(models.LogisticRegression(), "held"))
        status = job.wait(timeout=BOB_SECONDS + 120)
    finally:
        hold.unlink()
    assert status.state == cpb.FAILED, status
    assert status.reason == (
        f"party 'bob' failed: its job worker ran past max_job_seconds = {BOB_SECONDS} "
        "(policy.limits); the worker was stopped"
    )
    assert time.monotonic() - began >= BOB_SECONDS
    _still_serving(cluster)


def _still_serving(cluster: LocalCluster) -> None:
    """Every party daemon and the dealer answer their health checks."""
    for party in cluster.parties:
        out = cli(cluster, "health", cluster.health_addresses[party], "--server-name", party)
        assert out.returncode == 0 and "SERVING" in out.stdout, out
    out = cli(cluster, "health", cluster.dealer_address, "--server-name", "dealer")
    assert out.returncode == 0 and "SERVING" in out.stdout, out
