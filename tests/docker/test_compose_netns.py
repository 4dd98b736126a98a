"""docker/compose.yml's services, commands, configs and certificates, run without Docker.

Each service is a process in its own network namespace on a virtual bridge
(tests.support.compose), started in `depends_on` order and checked with its own healthcheck.
The demo's training job (docker/examples/train.toml) runs across them through the CLI from a
client namespace, as the documented flow does from the host; one party's link is cut in the
middle of it: the job fails naming the party, and once the link is back a resume finishes it,
with weights that match plaintext PyTorch on the job file's own settings.
(tests/system/test_recovery.py compares resumed with uninterrupted runs.)
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mpcml.demo import data, models
from mpcml.demo.run import by_id, plaintext_train
from mpcml.party.worker import HOLD_FILE
from tests.support.compose import REPO, Deployment, netns_available

WHY_NOT = netns_available()
pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces: {WHY_NOT}"),
]

JOB_FILE = REPO / "docker" / "examples" / "train.toml"
CLIENT_CERTS = "/srv/mpcml/client"
CLIENT_ENV = {
    "MPCML_COORDINATOR": "coordinator:7000",
    "MPCML_CA": f"{CLIENT_CERTS}/ca.pem",
    "MPCML_CERT": f"{CLIENT_CERTS}/analyst.pem",
    "MPCML_KEY": f"{CLIENT_CERTS}/analyst.key",
}
OUTPUT_TOLERANCE = 0.05
FAIL_WITHIN_S = 15 + 10
"""The coordinator's heartbeat timeout (docker/coordinator.toml) plus a few seconds."""


@pytest.fixture()
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with Deployment(tmp_path) as d:
        # The host's view: the certificate folder the certs service wrote for the client.
        d.client.spec = {"volumes": [f"client-certs:{CLIENT_CERTS}:ro"]}
        d.up(timeout=240)
        yield d


def _mpcml(d: Deployment, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return d.exec("client", ["mpcml", *args], timeout=timeout, env=CLIENT_ENV)


def _submit(d: Deployment, key: str) -> str:
    done = _mpcml(d, "job", "submit", str(JOB_FILE), "--idempotency-key", key, "--format", "json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["job_id"])


def _status(d: Deployment, job_id: str) -> dict[str, object]:
    done = _mpcml(d, "job", "status", job_id, "--format", "json")
    assert done.returncode == 0, done.stderr
    status: dict[str, object] = json.loads(done.stdout)
    return status


def _weights(d: Deployment, job_id: str) -> dict[str, torch.Tensor]:
    path = d.volumes / "carol-state" / "results" / job_id / "weights.pt"
    return dict(torch.load(path, weights_only=True))


def _plaintext() -> dict[str, torch.Tensor]:
    """docker/examples/train.toml in plaintext PyTorch: rows in id order, the same settings."""
    job = tomllib.loads(JOB_FILE.read_text())
    train = job["train"]
    split = data.breast_cancer()
    x, y = by_id(split.id_train, split.x_train, split.y_train)
    model = plaintext_train(
        models.LogisticRegression(),
        x,
        y,
        epochs=train["epochs"],
        lr=train["learning_rate"],
        batch_size=train["batch_size"],
        momentum=train["momentum"],
        seed=job["weights"]["init_seed"],
    )
    return dict(model.state_dict())


def test_compose_services_train_the_demo_job_and_resume_after_a_cut_link(
    deployment: Deployment,
) -> None:
    d = deployment
    parties = _mpcml(d, "job", "parties", "--wait", "alice", "bob", "carol", "--timeout", "60")
    assert parties.returncode == 0, parties.stderr
    plain = _plaintext()

    # bob's link is cut once round 1 is committed, while alice's worker holds before round 2
    # (worker.HOLD_FILE): the job cannot finish before the cut, however fast the machine is.
    gate = d.volumes / "alice-state" / "shares" / HOLD_FILE.format(round=2)
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()
    job_id = _submit(d, "compose-train")
    deadline = time.monotonic() + 180
    while int(str(_status(d, job_id).get("committed_round", 0))) < 1:
        assert time.monotonic() < deadline, f"round 1 never committed\n{d.tails()}"
        time.sleep(0.5)
    d.set_link("bob", up=False)
    gate.unlink()
    cut = time.monotonic()
    try:
        while _status(d, job_id)["state"] not in ("FAILED", "COMPLETED"):
            assert time.monotonic() - cut < FAIL_WITHIN_S, f"no failure\n{d.tails()}"
            time.sleep(0.5)
        failed = _status(d, job_id)
    finally:
        d.set_link("bob", up=True)
    assert failed["state"] == "FAILED", failed
    assert "'bob'" in str(failed["reason"]), failed["reason"]

    parties = _mpcml(d, "job", "parties", "--wait", "alice", "bob", "carol", "--timeout", "90")
    assert parties.returncode == 0, parties.stderr + d.tail("bob")
    resumed = _mpcml(d, "job", "resume", job_id, "--watch")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr + d.tails()
    assert "COMPLETED" in resumed.stdout
    final = _status(d, job_id)
    assert final["state"] == "COMPLETED" and final.get("resumes") == 1, final
    secure = _weights(d, job_id)
    for key, value in plain.items():
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key
