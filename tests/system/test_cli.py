"""`mpcml job ...` against the live deployment: submit, watch, status, result, list, cancel,
with exit code 2 and a message for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mpcml.demo import data, models
from mpcml.demo.cluster import REPO, LocalCluster
from mpcml.demo.run import by_id, plaintext_train
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.transport.address import free_ports
from tests.system.conftest import audit_entries
from tests.system.conftest import cli as mpcml

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
"""Only submits jobs and reads their own results: runs on the session's shared cluster."""

TRAIN = """
name = "cli-logreg"
task = "train"
align_on = "id"
idempotency_key = "cli-train"
[model]
python = "mpcml.demo.models:LogisticRegression"
args = {{ in_features = 30 }}
input_shape = [30]
[features]
alice = "bc-train"
bob = "bc-train"
[labels]
carol = "bc-train-labels"
[train]
epochs = 1
learning_rate = 0.5
momentum = 0.5
loss = "bce"
[weights]
init_seed = {seed}
[reveal]
metrics = ["coordinator"]
"""

INFER = """
task = "infer"
align_on = "id"
[weights]
from_job = "{job}"
[features]
alice = "bc-test"
bob = "bc-test"
[reveal]
predictions = ["carol"]
"""


def test_train_and_infer_through_the_cli_match_plaintext(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    (tmp_path / "train.toml").write_text(TRAIN.format(seed=11))
    submitted = mpcml(cluster, "job", "submit", str(tmp_path / "train.toml"), "--watch")
    assert submitted.returncode == 0, submitted.stderr
    assert "round 1/1" in submitted.stdout and "COMPLETED" in submitted.stdout
    job_id = submitted.stdout.split()[0]

    status = json.loads(mpcml(cluster, "job", "status", job_id, "--format", "json").stdout)
    assert status["state"] == "COMPLETED" and status["total_rounds"] == 1
    # The digest the coordinator shows is the one an operator computes from the file offline.
    digest = mpcml(cluster, "job", "digest", str(tmp_path / "train.toml")).stdout.strip()
    assert status["graph_digest"] == digest and digest.startswith("sha256:")
    assert f"model: {digest}" in mpcml(cluster, "job", "status", job_id).stdout
    got = mpcml(cluster, "job", "result", job_id, "--format", "json")
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    assert "loss" in result["rounds"][0]["metrics"]
    profiled = mpcml(cluster, "job", "profile", job_id)
    assert profiled.returncode == 0, profiled.stderr
    assert "(backward)" in profiled.stdout and "first batch" in profiled.stdout
    rows = json.loads(mpcml(cluster, "job", "profile", job_id, "--format", "json").stdout)
    assert sum(int(r.get("rounds", 0)) for r in rows) == int(result["communication_rounds"])
    listed = json.loads(mpcml(cluster, "job", "list", "--format", "json").stdout)
    assert job_id in [j["job_id"] for j in listed]

    (tmp_path / "infer.toml").write_text(INFER.format(job=job_id))
    inferred = mpcml(cluster, "job", "submit", str(tmp_path / "infer.toml"), "--watch")
    assert inferred.returncode == 0, inferred.stderr
    infer_id = inferred.stdout.split()[0]
    result = json.loads(mpcml(cluster, "job", "result", infer_id, "--format", "json").stdout)
    [output] = result["outputs"]
    assert output["party"] == "carol"
    with np.load(output["path"]) as npz:
        secure, ids = npz["predictions"].reshape(-1), npz["ids"]

    split = data.breast_cancer()
    x, y = by_id(split.id_train, split.x_train, split.y_train)
    model = plaintext_train(models.LogisticRegression(), x, y, epochs=1, seed=11)
    x_test, y_test, id_test = by_id(split.id_test, split.x_test, split.y_test, split.id_test)
    assert np.array_equal(ids.astype(np.int64), id_test)
    with torch.no_grad():
        plain = model(torch.from_numpy(x_test)).numpy().reshape(-1)
    assert np.abs(secure - plain).max() <= 0.05

    def accuracy(p: np.ndarray) -> float:
        return float(((p > 0.5) == (y_test > 0.5)).mean())

    assert abs(accuracy(secure) - accuracy(plain)) <= 0.01

    # The same file again (same idempotency key) is the same job.
    again = mpcml(cluster, "job", "submit", str(tmp_path / "train.toml"))
    assert again.returncode == 0 and again.stdout.split()[0] == job_id


def test_the_example_job_files_run(cluster: LocalCluster) -> None:
    for example in ("infer_digits.toml", "infer_sentiment.toml"):
        done = mpcml(cluster, "job", "submit", str(REPO / "examples/jobs" / example), "--watch")
        assert done.returncode == 0, done.stderr
    from mpcml.api.jobfile import load

    job, _ = load(REPO / "examples/jobs/train_logreg.toml")
    ops = [n.op for n in job.spec.graph.nodes if n.op != "Parameter"]
    assert job.spec.hyper.epochs == 5
    assert ops == ["aten.permute.default", "aten.addmm.default", "aten.sigmoid.default"]


def test_cancel_through_the_cli(cluster: LocalCluster, tmp_path: Path) -> None:
    (tmp_path / "long.toml").write_text(
        TRAIN.format(seed=1).replace("epochs = 1", "epochs = 40").replace("cli-train", "long")
    )
    submitted = mpcml(cluster, "job", "submit", str(tmp_path / "long.toml"))
    job_id = submitted.stdout.split()[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a round committed: the job has a loss to show
        status = json.loads(mpcml(cluster, "job", "status", job_id, "--format", "json").stdout)
        if status.get("committed_round", 0) >= 1:
            break
        time.sleep(0.3)
    cancelled = mpcml(cluster, "job", "cancel", job_id, "--format", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "CANCELLED"
    # the text names the committed round, and the loss shown is that round's
    shown = mpcml(cluster, "job", "status", job_id).stdout
    assert cluster.client is not None  # the public result of a cancelled job, as recorded
    result = cluster.client.stub.GetResult(cpb.GetResultRequest(job_id=job_id), timeout=30)
    committed = result.status.committed_round
    loss = next(r.metrics["loss"] for r in result.rounds if r.round == committed)
    assert committed >= 1 and f"loss={loss:.4f} (round {committed})" in shown, shown
    current = result.status.current_round
    assert current == committed or f"committed {committed}" in shown, shown
    watched = mpcml(cluster, "job", "watch", job_id)
    assert watched.returncode == 1 and "CANCELLED" in watched.stdout
    again = mpcml(cluster, "job", "cancel", job_id)
    assert again.returncode == 2 and "already ended" in again.stderr
    # the cancelled job's checkpoints and secrets stay until its submitter purges them
    folders = [cluster.workdir / p / "state" / "jobs" / job_id for p in ("alice", "bob", "carol")]
    assert all(f.is_dir() for f in folders)
    purged = mpcml(cluster, "job", "purge", job_id)
    assert purged.returncode == 0, purged.stderr
    assert "purge sent to alice, bob, carol" in purged.stdout, purged.stdout
    deadline = time.monotonic() + 20
    while any(f.exists() for f in folders) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(f.exists() for f in folders), [f for f in folders if f.exists()]
    for party in ("alice", "bob", "carol"):
        assert any(
            e["kind"] == "job_purged" and e["job"] == job_id for e in audit_entries(cluster, party)
        ), party


def test_bad_input_exits_2_with_a_message(cluster: LocalCluster, tmp_path: Path) -> None:
    cases = {
        "broken.toml": ("task = 'train\n", "not valid TOML"),
        "schema.toml": ("task = 'fly'\n[features]\nalice = 'x'\n", "task: 'fly' is not one of"),
        "extra.toml": (TRAIN.format(seed=1) + "colour = 'red'\n", "'colour' was unexpected"),
        "dataset.toml": (
            TRAIN.format(seed=1).replace('bob = "bc-train"', 'bob = "nope"'),
            "party 'bob' has no dataset 'nope'",
        ),
        "model.toml": (
            TRAIN.format(seed=1).replace("LogisticRegression", "NoSuchNet"),
            "has no 'NoSuchNet'",
        ),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        out = mpcml(cluster, "job", "submit", str(tmp_path / name))
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert message in out.stderr, (name, out.stderr)
        assert "Traceback" not in out.stderr
    for command in ("status", "resume"):
        missing = mpcml(cluster, "job", command, "f" * 32)
        assert missing.returncode == 2 and "no job" in missing.stderr, (command, missing.stderr)
    nofile = mpcml(cluster, "job", "submit", str(tmp_path / "absent.toml"))
    assert nofile.returncode == 2 and "cannot read the job file" in nofile.stderr


def test_a_bad_log_level_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "dealer.toml"
    config.write_text('listen = "127.0.0.1:0"\ninsecure = true\n')
    command = [sys.executable, "-m", "mpcml.cli.main", "dealer", "--config", str(config)]
    flag = subprocess.run(
        [*command, "--log-level", "loud"], capture_output=True, text=True, timeout=60
    )
    assert flag.returncode == 2 and "invalid choice: 'loud'" in flag.stderr, flag.stderr
    env = {**os.environ, "MPCML_LOG_LEVEL": "loud"}
    variable = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert variable.returncode == 2, variable.stderr
    assert "log level 'loud' is not one of debug, info, warning, error" in variable.stderr
    assert "Traceback" not in variable.stderr


def _doctor(cluster: LocalCluster, party: str, **env: str) -> subprocess.CompletedProcess[str]:
    config = cluster.parties_dir / party / "party.toml"
    return subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", "doctor", "--config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **cluster.party_env(party), **env},
        timeout=120,
    )


def test_doctor_finds_a_healthy_party_and_names_what_is_wrong_with_a_broken_one(
    cluster: LocalCluster,
) -> None:
    done = _doctor(cluster, "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"OK    coordinator: {cluster.coordinator_address} answers as 'coordinator'" in out
    assert f"OK    dealer: {cluster.dealer_address} answers as 'dealer'" in out
    for peer in ("bob", "carol"):
        assert f"{cluster.health_addresses[peer]} answers as '{peer}': SERVING" in out, out
    assert "OK    clock vs coordinator: coordinator's clock is" in out
    assert "SANs alice, localhost, 127.0.0.1" in out

    # The coordinator's address pointing at the dealer: the wrong certificate is named.
    wrong = _doctor(cluster, "alice", MPCML_COORDINATOR=cluster.dealer_address)
    assert wrong.returncode == 1
    assert "presents a certificate for ['dealer', 'localhost'], not 'coordinator'" in wrong.stdout
    assert "fix: point the address at coordinator" in wrong.stdout


def test_a_party_says_at_start_what_it_serves_where_and_when_it_reached_everyone(
    cluster: LocalCluster,
) -> None:
    log = (cluster.logs / "alice.log").read_text()
    address = cluster.data_addresses["alice"]
    assert f"party alice starting with the certificate {cluster.certs / 'alice.pem'}" in log
    assert f"job workers listen on {address} (peers reach them at {address}" in log
    assert "bc-train (455 rows x 15 columns)" in log and "; models: " in log
    assert f"attached to the coordinator at {cluster.coordinator_address} as party alice" in log
    assert f"reached the dealer at {cluster.dealer_address} (SERVING)" in log


def test_a_wrong_port_or_a_key_of_another_certificate_fails_at_once_naming_it(
    cluster: LocalCluster,
) -> None:
    [port] = free_ports(1)
    began = time.monotonic()
    wrong_port = mpcml(cluster, "job", "list", "--coordinator", f"127.0.0.1:{port}")
    assert wrong_port.returncode == 1, wrong_port.stderr
    assert f"nothing listens at 127.0.0.1:{port}" in wrong_port.stderr
    wrong_key = mpcml(cluster, "job", "list", "--key", str(cluster.certs / "bob.key"))
    assert wrong_key.returncode == 2, wrong_key.stderr
    assert "bob.key' does not belong to the certificate" in wrong_key.stderr
    assert "Traceback" not in wrong_port.stderr + wrong_key.stderr
    assert time.monotonic() - began < 20  # each in a second or two; the old wait was 30 s
