"""The Node.js client of examples/node: a client in another language, on the published protos.

It submits the committed JSON job spec to a live coordinator and parties (real mutual TLS),
prints the job's events and its result; the job it ran is checked from the Python client and
its predictions against plaintext PyTorch. Skipped where `node` or `npm` is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from mpcml.demo import data, models
from mpcml.demo.cluster import CLIENT, LocalCluster
from mpcml.demo.run import predictions
from mpcml.proto.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "node"
SPEC = NODE_DIR / "digits_infer.json"
NPM_TIMEOUT_S = 300
CLIENT_TIMEOUT_S = 300
OUTPUT_TOLERANCE = 0.05


def _generator() -> ModuleType:
    """examples/node/digits_infer.py, loaded by path (crypten installs a package `examples`)."""
    spec = importlib.util.spec_from_file_location("node_digits_infer", NODE_DIR / "digits_infer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_json_spec_is_what_the_python_job_api_makes() -> None:
    stale = SPEC.read_text() != _generator().spec_json()
    assert not stale, "examples/node/digits_infer.json is stale: run examples/node/digits_infer.py"


@pytest.fixture(scope="module")
def client_js(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """client.js in a copy of examples/node with its locked dependencies installed."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not on PATH: the Node.js example needs Node.js")
    work = tmp_path_factory.mktemp("node")
    for name in ("package.json", "package-lock.json", "client.js"):
        shutil.copy(NODE_DIR / name, work / name)
    npm = subprocess.run(
        ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
    )
    assert npm.returncode == 0, f"npm ci failed (is the npm registry reachable?):\n{npm.stderr}"
    return work / "client.js"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The coordinator, the dealer and alice, bob and carol, as `mpcml demo` starts them."""
    with LocalCluster(tmp_path_factory.mktemp("cluster") / "run") as c:
        c.start()
        yield c


def _run_node(
    client_js: Path, cluster: LocalCluster, spec: Path, identity: str = CLIENT
) -> subprocess.CompletedProcess[str]:
    """The Node client on `spec`, configured through the environment like the Python CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPCML_")}
    env |= {
        "MPCML_COORDINATOR": cluster.coordinator_address,
        "MPCML_CA": str(cluster.certs / "ca.pem"),
        "MPCML_CERT": str(cluster.certs / f"{identity}.pem"),
        "MPCML_KEY": str(cluster.certs / f"{identity}.key"),
    }
    return subprocess.run(
        ["node", str(client_js), "--protos", str(ROOT / "protos"), str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
    )


def test_node_client_runs_a_private_model_job_that_matches_plaintext(
    client_js: Path, cluster: LocalCluster
) -> None:
    run = _run_node(client_js, cluster, SPEC)
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    out = run.stdout
    submitted = re.search(r"^submitted job ([0-9a-f]+) \(digits-node-example\)", out, re.M)
    assert submitted, out
    job_id = submitted.group(1)
    # Every event, in order, then the result.
    seqs = [int(s) for s in re.findall(r"^event (\d+) ", out, re.M)]
    assert seqs == list(range(1, len(seqs) + 1)), out
    for line in (
        r"submitted: 1 round",
        r"state PENDING",
        r"party alice ready",
        r"party bob ready",
        r"state RUNNING",
        r"round 1/1 done",
        r"party alice finished",
        r"party bob finished",
        r"state COMPLETED",
    ):
        assert re.search(rf"^event \d+ {line}$", out, re.M), f"{line!r} not in:\n{out}"
    assert f"\njob {job_id} COMPLETED\n" in out
    assert re.search(
        r"^output OUTPUT_PREDICTIONS to alice: .*predictions.npz \(shape 360x10\)$", out, re.M
    )

    # The same job, seen from the Python client.
    assert cluster.client is not None
    handle = cluster.client.job(job_id)
    assert handle.status().state == cpb.COMPLETED
    result = handle.result()
    assert [o.party for o in result.outputs] == ["alice"]
    secure, ids = predictions(result, "alice")
    split = data.digits()
    assert np.array_equal(ids.astype(np.int64), split.id_test)
    net = models.DigitsMLP()
    net.load_state_dict(
        torch.load(cluster.parties_dir / "bob" / "models" / "digits_mlp.pt", weights_only=True)
    )
    with torch.no_grad():
        plain = net(torch.from_numpy(split.x_test)).numpy()
    assert secure.shape == plain.shape
    assert float(np.abs(secure - plain).max()) <= OUTPUT_TOLERANCE


def test_node_client_names_the_status_when_the_coordinator_refuses_a_job(
    client_js: Path, cluster: LocalCluster, tmp_path: Path
) -> None:
    spec = json.loads(SPEC.read_text())
    spec["features"][0]["dataset"] = "no-such-dataset"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec))
    run = _run_node(client_js, cluster, bad)
    assert run.returncode == 1
    assert re.search(r"^error: SubmitJob failed: INVALID_ARGUMENT: .*no-such-dataset", run.stderr)


def test_node_client_with_a_party_certificate_is_refused(
    client_js: Path, cluster: LocalCluster
) -> None:
    run = _run_node(client_js, cluster, SPEC, identity="alice")
    assert run.returncode == 1
    assert "error: SubmitJob failed: PERMISSION_DENIED: certificate 'alice' has role" in run.stderr
