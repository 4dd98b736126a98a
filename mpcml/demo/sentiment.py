"""The demo's transformer task: bob's private sentiment-style classifier on alice's reviews.

The reviews are synthetic token sequences (no download): a [CLS] token, then 7 to 15 tokens
drawn from neutral words with a few positive and negative ones, padded to `SEQUENCE`; a review
is positive when it holds more positive words than negative. Bob's model is a small BERT
(`CONFIG`) trained on other reviews in plaintext by `train`; its weights are a state_dict in
`parties/bob/models/`, its config a JSON file beside it, and `python -m mpcml.demo.data` writes
both. Alice's held-out reviews, their attention masks and her own labels are in
`parties/alice/data/reviews.npz`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

VOCAB = 48
SEQUENCE = 16
PAD, CLS = 0, 1
POSITIVE = range(2, 10)
NEGATIVE = range(10, 18)
NEUTRAL = range(18, VOCAB)
CLASS = "BertForSequenceClassification"
CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": SEQUENCE,
    "type_vocab_size": 1,
    "num_labels": 2,
    # Embeddings large enough that the first LayerNorm's variance stays inside CrypTen's
    # inverse square root's domain ([0.1, 200], docs/approximations.md).
    "initializer_range": 0.3,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
TRAIN_ROWS = 2000
TEST_ROWS = 128


def reviews(
    rows: int, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(token ids, attention mask, labels) of `rows` reviews drawn with `seed`."""
    rng = np.random.default_rng(seed)
    ids = np.full((rows, SEQUENCE), PAD, dtype=np.int64)
    mask = np.zeros((rows, SEQUENCE), dtype=np.int64)
    labels = np.zeros(rows, dtype=np.int64)
    for r in range(rows):
        length = int(rng.integers(8, SEQUENCE + 1))
        words = list(rng.choice(NEUTRAL, size=length - 1))
        positive, negative = rng.choice([(1, 0), (0, 1), (2, 1), (1, 2), (3, 1), (1, 3)])
        places = rng.choice(length - 1, size=positive + negative, replace=False)
        for i, place in enumerate(places):
            words[place] = int(rng.choice(POSITIVE if i < positive else NEGATIVE))
        ids[r, :length] = [CLS, *words]
        mask[r, :length] = 1
        labels[r] = int(positive > negative)
    return ids, mask, labels


def train(seed: int = 0, steps: int = 300) -> Any:
    """Bob's classifier, trained in plaintext on reviews alice never sees."""
    from mpcml.graph.hf import from_config

    model = from_config(CLASS, CONFIG, seed=seed)
    ids, mask, labels = reviews(TRAIN_ROWS, seed=seed + 1)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, TRAIN_ROWS, (64,), generator=generator)
        out = model(
            input_ids=torch.from_numpy(ids[batch]),
            attention_mask=torch.from_numpy(mask[batch]),
            labels=torch.from_numpy(labels[batch]),
        )
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
    return model.eval()


def write(parties_dir: Path) -> float:
    """Bob's model and config, alice's held-out reviews; returns the model's test accuracy."""
    model = train()
    ids, mask, labels = reviews(TEST_ROWS, seed=99)
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    accuracy = float((logits.logits.argmax(1).numpy() == labels).mean())
    models = parties_dir / "bob" / "models"
    models.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), models / "sentiment_bert.pt")
    (models / "sentiment_bert.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    np.savez_compressed(
        parties_dir / "alice" / "data" / "reviews.npz",
        input_ids=ids,
        attention_mask=mask,
        label=labels,
        id=np.arange(TEST_ROWS),
    )
    return accuracy
