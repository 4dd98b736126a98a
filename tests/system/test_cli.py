"""`mpcml job ...` against the live deployment: submit, watch, status, result, list, cancel,
with exit code 2 and a message for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mpcml.demo import data, models
from mpcml.demo.cluster import REPO, LocalCluster
from mpcml.demo.run import by_id, plaintext_train

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


def mpcml(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    tls = cluster.client_tls()
    assert tls is not None
    env = {
        **os.environ,
        "MPCML_COORDINATOR": cluster.coordinator_address,
        "MPCML_CA": str(tls.ca),
        "MPCML_CERT": str(tls.cert),
        "MPCML_KEY": str(tls.key),
    }
    return subprocess.run(
        [sys.executable, "-m", "mpcml.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


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
    result = json.loads(mpcml(cluster, "job", "result", job_id, "--format", "json").stdout)
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
    cancelled = mpcml(cluster, "job", "cancel", job_id, "--format", "json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "CANCELLED"
    watched = mpcml(cluster, "job", "watch", job_id)
    assert watched.returncode == 1 and "CANCELLED" in watched.stdout
    again = mpcml(cluster, "job", "cancel", job_id)
    assert again.returncode == 2 and "already ended" in again.stderr


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
