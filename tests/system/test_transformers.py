"""Transformers through the job API with the real daemons: bob's private Hugging Face models on
alice's token sequences, the logits revealed to alice only.

Each secure result is compared with the Hugging Face model in plaintext on the same tokens: the
largest logit error stays within the bounds of tests/graph/test_sequence.py with CrypTen's
approximations and with a tuned plan, and the demo's sentiment classifier agrees with plaintext
on at least 99% of alice's held-out reviews.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.api.tune import tune
from mpcml.demo import sentiment
from mpcml.demo.cluster import PARTIES_DIR, LocalCluster
from mpcml.demo.run import predictions
from mpcml.graph import hf
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.graph import sequence_models as sm
from tests.graph.test_sequence import ERRORS, TUNED_ERRORS

pytestmark = pytest.mark.system

ROWS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("transformers")
    parties = root / "parties"
    shutil.copytree(
        PARTIES_DIR, parties, ignore=shutil.ignore_patterns("state", "results", "certs")
    )
    with (parties / "bob" / "party.toml").open("a") as f:
        for name in sm.CONFIGS:
            torch.save(sm.transformer(name).model.state_dict(), parties / "bob" / f"{name}.pt")
            f.write(f'\n[models.{name}]\npath = "{name}.pt"\n')
            f.write(f'\n[policy.for_model.{name}]\noutputs_to = {{ predictions = ["alice"] }}\n')
    ids, mask = sm.tokens(seed=5, rows=ROWS)
    data = parties / "alice" / "data"
    np.savez(data / "tokens.npz", input_ids=ids, attention_mask=mask, id=np.arange(ROWS))
    np.savez(data / "bad_tokens.npz", input_ids=ids + sm.VOCAB, id=np.arange(ROWS))
    with (parties / "alice" / "party.toml").open("a") as f:
        for name, file in (("tokens", "tokens.npz"), ("bad-tokens", "bad_tokens.npz")):
            mask_line = 'mask = "attention_mask"\n' if name == "tokens" else ""
            f.write(
                f'\n[datasets.{name}]\npath = "data/{file}"\narray = "input_ids"\n'
                f'{mask_line}id_column = "id"\n'
            )
    with LocalCluster(root / "run", parties_dir=parties) as c:
        c.start()
        yield c


@pytest.fixture()
def client(cluster: LocalCluster) -> Client:
    assert cluster.client is not None
    return cluster.client


def _run(client: Client, job: Job) -> np.ndarray:
    handle = client.submit(job)
    status = handle.wait(timeout=300)
    assert status.state == cpb.COMPLETED, status.reason
    logits, ids = predictions(handle.result(), "alice")
    assert np.array_equal(ids, np.arange(len(ids)))
    return logits


@pytest.mark.parametrize("name", ["bert", "gpt2"])
@pytest.mark.parametrize("plan", ["crypten", "tuned"])
def test_bobs_transformer_on_alices_tokens_matches_plaintext(
    client: Client, cluster: LocalCluster, name: str, plan: str
) -> None:
    model = sm.transformer(name)  # bob's weights: the owner tunes on his own rows
    approximations: object = "crypten"
    if plan == "tuned":
        ids, mask = sm.tokens(seed=1, rows=16)  # padded rows: masked scores reach the softmax
        calibration = torch.from_numpy(sm.rows(ids, mask))
        approximations = tune(model, calibration, budget=0.02, batch=ROWS).plan
    logits = _run(
        client,
        Job.infer(
            model=model,
            weights={"bob": name},
            features={"alice": "tokens"},
            reveal={"predictions": ["alice"]},
            approximations=approximations,  # type: ignore[arg-type]
        ),
    )
    ids, mask = sm.tokens(seed=5, rows=ROWS)
    expected = sm.plaintext(model, ids, mask).numpy()
    assert logits.shape == expected.shape
    error = float(np.abs(logits - expected).max())
    bound = (ERRORS if plan == "crypten" else TUNED_ERRORS)[name]
    assert error < bound, f"{name} with {plan} approximations: max logit error {error:.4f}"


def test_the_sentiment_classifier_agrees_with_plaintext_on_the_held_out_reviews(
    client: Client, cluster: LocalCluster
) -> None:
    config = hf.read_config(cluster.parties_dir / "bob" / "models" / "sentiment_bert.json")
    model = hf.from_config(sentiment.CLASS, config)
    logits = _run(
        client,
        Job.infer(
            model=hf.SequenceModel(model, sentiment.SEQUENCE),
            weights={"bob": "sentiment-bert"},
            features={"alice": "reviews"},
            reveal={"predictions": ["alice"]},
        ),
    )
    state = cluster.parties_dir / "bob" / "models" / "sentiment_bert.pt"
    model.load_state_dict(torch.load(state, weights_only=True))
    with np.load(cluster.parties_dir / "alice" / "data" / "reviews.npz") as reviews:
        ids, mask = (
            torch.from_numpy(reviews["input_ids"]),
            torch.from_numpy(reviews["attention_mask"]),
        )
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits.numpy()
    agreement = float((logits.argmax(1) == plain.argmax(1)).mean())
    assert agreement >= 0.99, f"the secure classifier agrees with plaintext on {agreement:.3f}"


def test_token_ids_outside_the_vocabulary_fail_the_job_naming_the_dataset(client: Client) -> None:
    handle = client.submit(
        Job.infer(
            model=sm.transformer("bert"),
            weights={"bob": "bert"},
            features={"alice": "bad-tokens"},
            reveal={"predictions": ["alice"]},
        )
    )
    status = handle.wait(timeout=120)
    assert status.state == cpb.FAILED
    assert "dataset 'bad-tokens'" in status.reason and "integers 0..39" in status.reason
