"""`mpcml tune` on job files: a torch model and a Hugging Face transformer, run in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpcml.api import plans
from mpcml.cli.main import main
from mpcml.demo import sentiment

REPO = Path(__file__).resolve().parents[2]


def test_a_transformer_job_file_is_tuned_on_token_ids_and_their_mask(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids, mask, labels = sentiment.reviews(64, seed=7)
    calibration = tmp_path / "reviews.npz"
    np.savez(calibration, x=ids, mask=mask, y=labels)
    out = tmp_path / "sentiment.plan.toml"
    code = main(
        [
            "tune",
            str(REPO / "examples/jobs/infer_sentiment.toml"),
            "--calibration",
            str(calibration),
            "--weights",
            str(REPO / "parties/bob/models/sentiment_bert.pt"),
            "--budget",
            "0.02",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"wrote {out}" in printed.out
    plan = plans.plan_of(str(out))
    assert plan.nodes, "the plan chooses nothing for the transformer's functions"


def test_tuning_a_private_transformer_without_its_weights_exits_2_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids, mask, _ = sentiment.reviews(8, seed=7)
    calibration = tmp_path / "reviews.npz"
    np.savez(calibration, x=ids, mask=mask)
    job = str(REPO / "examples/jobs/infer_sentiment.toml")
    assert main(["tune", job, "--calibration", str(calibration)]) == 2
    assert "give them with --weights" in capsys.readouterr().err
    np.savez(calibration, x=ids + 10**6, mask=mask)  # ids outside the vocabulary
    weights = str(REPO / "parties/bob/models/sentiment_bert.pt")
    assert main(["tune", job, "--calibration", str(calibration), "--weights", weights]) == 2
    assert "token ids must be integers" in capsys.readouterr().err


def test_a_transformer_to_train_from_the_seed_is_tuned_at_its_initial_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = REPO / "parties/bob/models/sentiment_bert.json"
    job = tmp_path / "train.toml"
    job.write_text(
        f'task = "train"\n[model]\ntransformers = "BertForSequenceClassification"\n'
        f'config = "{config}"\nsequence = 16\n[weights]\ninit_seed = 3\n'
    )
    ids, _, labels = sentiment.reviews(32, seed=7)
    calibration = tmp_path / "reviews.npz"
    np.savez(calibration, x=ids, y=labels)  # no mask: every token counts
    code = main(["tune", str(job), "--calibration", str(calibration), "--budget", "0.05"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "train.plan.toml").is_file()
