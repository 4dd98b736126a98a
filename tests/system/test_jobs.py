"""Jobs end to end: coordinator and party daemons as separate processes, real gRPC, real mTLS.

Every secure result is compared with plaintext PyTorch on the same rows, initial weights,
hyper-parameters and batches: accuracy within 1 percentage point, outputs within 0.05.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.demo import data, models
from mpcml.demo.cluster import LocalCluster
from mpcml.demo.run import breast_cancer_task, by_id, digits_task, plaintext_train, predictions
from mpcml.party.durable import SECRET_FILE
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb
from tests.system.conftest import H_SPLIT, MAX_CONCURRENT_JOBS, audit_entries

pytestmark = pytest.mark.system

ACCURACY_POINTS = 0.01
OUTPUT_TOLERANCE = 0.05


def _digits_job(recipient: str = "alice") -> Job:
    """Bob's private model on alice's images: the quick job the tests use to fill the queue.

    Captured here, for rows of 64 pixels, so that submitting it is quick.
    """
    return Job.infer(
        model=models.DigitsMLP(),
        weights={"bob": "digits-mlp"},
        features={"alice": "digits-test"},
        reveal={"predictions": [recipient]},
        input_shape=(64,),
    )


def _files(root: object) -> list[str]:
    from pathlib import Path

    base = Path(str(root))
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())


def test_vertical_training_then_inference_of_the_shared_model_matches_plaintext(
    cluster: LocalCluster, client: Client
) -> None:
    row = breast_cancer_task(client, "logreg", models.LogisticRegression(), epochs=2)
    assert abs(row.secure_accuracy - row.plaintext_accuracy) <= ACCURACY_POINTS
    assert row.max_abs_diff <= OUTPUT_TOLERANCE
    assert row.secure_accuracy > 0.9
    assert row.rounds == 3 and row.bytes > 0
    # on partly overlapping customer lists: the status says how many rows the PSI found
    split = data.breast_cancer()
    train_ids, _, _ = data.shared_customers(split.x_train, split.y_train, split.id_train)
    test_ids, _, _ = data.shared_customers(split.x_test, split.y_test, split.id_test)
    assert row.rows == f"{len(train_ids)}/{len(test_ids)}" and len(train_ids) < 455
    # The trained model stayed shared: nobody received weights; carol got the losses and the
    # predictions, alice and bob nothing.
    jobs = client.jobs()
    train = next(j for j in jobs if j.name == "logreg-train")
    assert train.state == cpb.COMPLETED and train.total_rounds == 2
    assert set(train.metrics) == {"loss"}
    carol = _files(cluster.results("carol"))
    assert sorted(f.split("/")[1] for f in carol) == ["metrics.jsonl", "predictions.npz"]
    assert not cluster.results("alice").exists() and not cluster.results("bob").exists()
    # the training job's result lists the metrics file carol wrote
    outputs = client.job(train.job_id).result().outputs
    assert [(o.party, jpb.Output.Name(o.output), Path(o.path).name) for o in outputs] == [
        ("carol", "OUTPUT_METRICS", "metrics.jsonl")
    ]
    losses = [r.metrics["loss"] for r in client.job(train.job_id).result().rounds]
    assert len(losses) == 2 and losses[1] < losses[0]
    # Evaluating the shared model: public loss and accuracy, matching the inference above.
    evaluation = client.submit(
        Job.evaluate(
            from_job=train.job_id,
            features={"alice": "bc-test", "bob": "bc-test"},
            labels={"carol": "bc-test-labels"},
            align_on="id",
            reveal={"metrics": ["coordinator"]},
        )
    )
    status = evaluation.wait(timeout=120)
    assert status.state == cpb.COMPLETED, status.reason
    assert abs(status.metrics["accuracy"] - row.secure_accuracy) <= ACCURACY_POINTS


def test_private_model_inference_reveals_predictions_to_alice_only(
    cluster: LocalCluster, client: Client
) -> None:
    row = digits_task(client, cluster)
    assert abs(row.secure_accuracy - row.plaintext_accuracy) <= ACCURACY_POINTS
    assert row.max_abs_diff <= OUTPUT_TOLERANCE
    job = next(j for j in client.jobs() if j.name == "digits-private-model")
    assert list(job.parties) == ["alice", "bob"]
    alice = [f for f in _files(cluster.results("alice")) if f.startswith(job.job_id)]
    assert alice == [f"{job.job_id}/predictions.npz"]
    assert not cluster.results("bob").exists()


def test_horizontal_shuffled_training_with_momentum_reveals_weights_to_the_named_party(
    cluster: LocalCluster, client: Client
) -> None:
    split = data.breast_cancer()
    features = {p: {"dataset": "h-train", "columns": split.columns} for p in ("alice", "bob")}
    labels = {p: {"dataset": "h-train", "columns": ["label"]} for p in ("alice", "bob")}
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(),
            features=features,
            labels=labels,
            split="horizontal",
            epochs=1,
            lr=0.3,
            momentum=0.9,
            batch_size=32,
            seed=3,
            shuffle=True,
            shuffle_seed=5,
            reveal={"weights": ["bob"]},
        )
    )
    status = job.wait(timeout=240)
    assert status.state == cpb.COMPLETED, status.reason
    assert status.metrics == {}  # no metrics were revealed to the coordinator
    result = job.result()
    [output] = result.outputs
    assert output.party == "bob" and output.output == 1  # OUTPUT_WEIGHTS
    secure = torch.load(output.path, weights_only=True)
    x, y = by_id(split.id_train, split.x_train, split.y_train)
    assert len(x) > H_SPLIT
    plain = plaintext_train(
        models.LogisticRegression(),
        x,
        y,
        epochs=1,
        lr=0.3,
        batch_size=32,
        momentum=0.9,
        seed=3,
        shuffle_seed=5,
    ).state_dict()
    for key, value in plain.items():
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key


def test_cancel_stops_the_workers_and_frees_the_parties(
    cluster: LocalCluster, client: Client
) -> None:
    job = client.submit(
        Job.train(
            model=models.BreastCancerMLP(),
            features={"alice": "bc-train", "bob": "bc-train"},
            labels={"carol": "bc-train-labels"},
            align_on="id",
            epochs=50,
            batches_per_round=1,
        )
    )
    for event in job.watch():
        if event.kind == "round_done":
            break
    status = job.cancel("test over")
    assert status.state == cpb.CANCELLED and status.reason == "test over"
    deadline = time.monotonic() + 30
    short = job.id[:8]
    while time.monotonic() < deadline:
        logs = [(cluster.logs / f"{p}.log").read_text() for p in ("alice", "bob", "carol")]
        if all(f"job {job.id}: worker exited" in log for log in logs):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the workers of job {short} are still running")
    # each party's audit log says the job was stopped here, and why
    for party in ("alice", "bob", "carol"):
        stops = [e for e in audit_entries(cluster, party) if e["kind"] == "job_stopped"]
        assert any(e["job"] == job.id and e["reason"] == "test over" for e in stops), party
    # Only committed checkpoints stay, with the job's secret (randomness.key): no temporary
    # file, no checkpoint of a later round.
    committed = job.status().committed_round
    for party in ("alice", "bob", "carol"):
        folder = cluster.workdir / party / "state" / "jobs" / job.id
        left = sorted(p.name for p in folder.iterdir() if p.name != SECRET_FILE)
        assert left and all(
            name.startswith("checkpoint-") and int(name[11:-3]) <= committed for name in left
        ), (party, committed, left)
    # The parties are free: the next job runs.
    follow = client.submit(_digits_job())
    assert follow.wait(timeout=120).state == cpb.COMPLETED


def test_a_party_runs_at_most_max_concurrent_jobs_and_queues_the_rest(
    cluster: LocalCluster, client: Client
) -> None:
    count = MAX_CONCURRENT_JOBS + 1
    made = [_digits_job() for _ in range(count)]
    with ThreadPoolExecutor(count) as pool:
        jobs = list(pool.map(client.submit, made))
    statuses = [job.wait(timeout=240) for job in jobs]
    assert all(s.state == cpb.COMPLETED for s in statuses), [s.reason for s in statuses]
    spans = [(s.state_times["STARTING"], s.state_times["COMPLETED"]) for s in statuses]
    at_once = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert at_once == MAX_CONCURRENT_JOBS, spans  # two ran together, the third waited
    split = data.digits()
    net = models.DigitsMLP()
    net.load_state_dict(torch.load(data_path("bob/models/digits_mlp.pt"), weights_only=True))
    with torch.no_grad():
        plain = net(torch.from_numpy(split.x_test)).numpy()
    for job in jobs:
        secure, ids = predictions(job.result(), "alice")
        assert np.array_equal(ids.astype(np.int64), split.id_test)
        assert np.abs(secure - plain).max() <= OUTPUT_TOLERANCE


def test_data_that_changed_since_registration_fails_the_job_naming_party_and_dataset(
    cluster: LocalCluster, client: Client
) -> None:
    path = cluster.parties_dir / "bob" / "data" / "copy.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:401]) + "\n")  # header and 400 of 455 rows
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(),
            features={"alice": "bc-train", "bob": "bc-train-copy"},
            labels={"carol": "bc-train-labels"},
        )  # rows by position; with align_on, PSI would train on the 400 shared rows
    )
    status = job.wait(timeout=120)
    assert status.state == cpb.FAILED
    assert "'bob'" in status.reason and "'bc-train-copy'" in status.reason, status.reason
    assert "400 rows" in status.reason


def test_idempotency_key_gives_one_job_and_refuses_another_spec(client: Client) -> None:
    job = _digits_job()
    first = client.submit(job, idempotency_key="same-key")
    again = client.submit(job, idempotency_key="same-key")
    assert first.id == again.id
    other = _digits_job("bob")
    from mpcml.api.client import ClientError

    with pytest.raises(ClientError, match=r"ALREADY_EXISTS.*same-key"):
        client.submit(other, idempotency_key="same-key")
    assert first.wait(timeout=120).state == cpb.COMPLETED
    assert sum(1 for j in client.jobs() if j.idempotency_key == "same-key") == 1


def test_a_restarted_coordinator_still_lists_finished_jobs(
    cluster: LocalCluster, client: Client
) -> None:
    before = {j.job_id: j.state for j in client.jobs()}
    assert cpb.COMPLETED in before.values()
    cluster.stop_process("coordinator")
    cluster.start_coordinator()
    cluster.wait_for_parties(client, timeout=60)
    after = {j.job_id: j.state for j in client.jobs()}
    assert after == before
    # and the re-registered parties run new jobs
    job = client.submit(_digits_job())
    assert job.wait(timeout=120).state == cpb.COMPLETED
    assert np.isfinite(job.result().seconds)


def test_evaluate_reveals_loss_and_accuracy_as_public_metrics(client: Client) -> None:
    """Cross-entropy and argmax accuracy of bob's private model on alice's labelled images."""
    job = client.submit(
        Job.evaluate(
            model=models.DigitsMLP(),
            weights={"bob": "digits-mlp"},
            features={"alice": "digits-test"},
            labels={"alice": "digits-test-labels"},
            loss="cross_entropy",
            reveal={"metrics": ["coordinator"]},
        )
    )
    status = job.wait(timeout=180)
    assert status.state == cpb.COMPLETED, status.reason
    split = data.digits()
    net = models.DigitsMLP()
    net.load_state_dict(torch.load(data_path("bob/models/digits_mlp.pt"), weights_only=True))
    with torch.no_grad():
        logits = net(torch.from_numpy(split.x_test))
        y = torch.from_numpy(split.y_test.astype(np.int64))
        loss = torch.nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(1) == y).float().mean().item()
    assert abs(status.metrics["accuracy"] - accuracy) <= ACCURACY_POINTS
    assert abs(status.metrics["loss"] - loss) <= OUTPUT_TOLERANCE


def data_path(relative: str) -> str:
    from mpcml.demo.cluster import PARTIES_DIR

    return str(PARTIES_DIR / relative)


def test_vertical_rows_aligned_by_position_train_like_plaintext(client: Client) -> None:
    """Without `align_on`, row i of every party is the same sample (bob's positional copy)."""
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(),
            features={"alice": "bc-train", "bob": "bc-train-positional"},
            labels={"carol": "bc-train-labels"},
            epochs=1,
            seed=9,
            reveal={"weights": ["carol"]},
        )
    )
    status = job.wait(timeout=120)
    assert status.state == cpb.COMPLETED, status.reason
    [output] = job.result().outputs
    secure = torch.load(output.path, weights_only=True)
    split = data.breast_cancer()  # rows in the order alice and carol hold them
    plain = plaintext_train(
        models.LogisticRegression(),
        split.x_train,
        split.y_train,
        epochs=1,
        lr=0.1,
        momentum=0,
        seed=9,
    ).state_dict()
    for key, value in plain.items():
        assert torch.allclose(secure[key], value, atol=OUTPUT_TOLERANCE), key


class TwoClassMLP(torch.nn.Sequential):
    """The breast-cancer MLP with two logits, for cross-entropy."""

    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(30, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.mark.parametrize(
    ("model", "loss"),
    [(models.LogisticRegression, "bce"), (TwoClassMLP, "cross_entropy")],
    ids=["logreg-bce", "mlp-cross-entropy"],
)
def test_fused_training_matches_plaintext_at_least_as_closely_as_cryptens_loss(
    client: Client, model: type[torch.nn.Module], loss: str
) -> None:
    """The exact gradient (the default) against CrypTen's loss and autograd, on the same job:
    both against plaintext PyTorch, and the rounds' public losses against each other."""
    split = data.breast_cancer()
    x, y = by_id(split.id_train, split.x_train, split.y_train)

    def job(crypten_loss: bool) -> Job:
        return Job.train(
            model=model(),
            features={"alice": "bc-train", "bob": "bc-train"},
            labels={"carol": "bc-train-labels"},
            align_on="id",
            epochs=1,
            lr=0.3,
            momentum=0.5,
            seed=4,
            loss=loss,
            crypten_loss=crypten_loss,
            reveal={"weights": ["carol"], "metrics": ["coordinator"]},
        )

    handles = {fused: client.submit(job(crypten_loss=not fused)) for fused in (True, False)}
    plain_losses: list[float] = []
    plain = plaintext_train(
        model(), x, y, epochs=1, lr=0.3, momentum=0.5, seed=4, loss=loss, losses=plain_losses
    )
    diff, losses = {}, {}
    for fused, handle in handles.items():
        status = handle.wait(timeout=240)
        assert status.state == cpb.COMPLETED, status.reason
        [output] = handle.result().outputs
        secure = torch.load(output.path, weights_only=True)
        diff[fused] = max(float((secure[k] - v).abs().max()) for k, v in plain.state_dict().items())
        losses[fused] = [r.metrics["loss"] for r in handle.result().rounds]
        _check_profile(handle.result(), "(loss gradient)" if fused else "(loss)")
    off = {f: max(abs(a - b) for a, b in zip(losses[f], plain_losses, strict=True)) for f in diff}
    print(
        f"{loss}: max |weight - plaintext| fused {diff[True]:.4f}, CrypTen's loss "
        f"{diff[False]:.4f}; max |round loss - plaintext| fused {off[True]:.4f}, CrypTen's "
        f"loss {off[False]:.4f} (plaintext {plain_losses})"
    )
    assert diff[True] <= OUTPUT_TOLERANCE
    assert diff[True] <= diff[False] + 0.005, diff
    assert off[True] <= OUTPUT_TOLERANCE
    assert off[True] <= off[False] + 0.005, (losses, plain_losses)


def _check_profile(result: cpb.JobResult, phase: str) -> None:
    """The cost profile accounts for the job's rounds node by node and phase by phase: what
    none of them covers (sharing inputs, revealing weights) is a few rounds."""
    profile = {c.node: c for c in result.profile}
    assert sum(c.rounds for c in result.profile) == result.communication_rounds, profile
    assert sum(c.bytes for c in result.profile) == result.bytes_sent, profile
    assert profile["(other)"].rounds <= 0.05 * result.communication_rounds, profile
    assert {phase, "(backward)", "(optimizer)", "(other)"} <= set(profile), set(profile)
    batches = profile["(backward)"].calls
    assert batches > 1 and profile[phase].calls == batches and profile[phase].rounds > 0
    nodes = [c for c in result.profile if not c.node.startswith("(")]
    assert nodes and all(c.calls == batches for c in nodes), nodes
    assert result.first_batch_seconds > 0 and result.median_batch_seconds > 0
