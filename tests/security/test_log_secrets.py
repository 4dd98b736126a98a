"""No key, share or input in any log, at any level, in either log format.

Party processes log everything (the root logger at DEBUG, so CrypTen's and gRPC's loggers too)
and the dealer runs with `--log-level debug`; the test then looks for every representation of
each secret a party held that a log line could carry. JSON lines are decoded first, so that
JSON's escaping cannot hide a value from the search.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from tests.support.parties import party_specs, run_specs_on_dealer

pytestmark = pytest.mark.system


def key_needles(key: torch.Tensor) -> set[str]:
    """Hex, base64, Python bytes repr and int64 words of a 32-byte key."""
    raw = key.numpy().tobytes()
    words = torch.frombuffer(bytearray(raw), dtype=torch.int64).tolist()
    return {
        raw.hex(),
        base64.b64encode(raw).decode()[:40],
        base64.urlsafe_b64encode(raw).decode()[:40],
        repr(raw)[2:42],
        *(str(w) for w in words if abs(w) > 10**9),
    }


def share_needles(share: torch.Tensor) -> set[str]:
    """The decimal of each ring element (as torch prints them); short ones could be chance."""
    return {str(v) for v in share.flatten().tolist() if abs(v) > 10**9}


def input_needles(values: torch.Tensor) -> set[str]:
    """Each input value as torch and Python print it."""
    out: set[str] = set()
    for v in values.flatten().tolist():
        if abs(v) > 10:  # values of several digits, so no match is a coincidence
            out |= {f"{v:.4f}", repr(v), f"{v:.6g}"}
    return out


def leaks(text: str, needles: Iterable[str]) -> list[str]:
    return sorted(n for n in needles if n in text)


def decoded(text: str) -> str:
    """Every value of every JSON line, unescaped; each line must be one JSON object."""
    values = []
    for n, line in enumerate(text.splitlines(), 1):
        record = json.loads(line)
        assert isinstance(record, dict), f"line {n} is not a JSON object: {line[:200]}"
        values += [str(v) for v in record.values()]
    return "\n".join(values)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_key_share_or_input_in_any_log(tmp_path: Path, log_format: str) -> None:
    specs = party_specs(
        tmp_path, 2, "tests.security.scenarios:secrets_of_a_session", log_format=log_format
    )
    results = run_specs_on_dealer(tmp_path, specs, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.error}\n{r.traceback}"
    a, b = (r.value["input"] for r in results)
    expected = torch.stack([a * b, a @ b, (a - b).relu()])
    assert torch.allclose(results[0].value["revealed"], expected, rtol=0.01, atol=1.0)

    logs = {p.name: p.read_text() for p in [*tmp_path.glob("rank*.log"), tmp_path / "dealer.log"]}
    if log_format == "json":
        assert all('"level": "debug"' in text for text in logs.values()), "not logging at DEBUG"
        logs = {name: decoded(text) for name, text in logs.items()}
    else:
        assert all(" DEBUG " in t or "DEBUG:" in t for t in logs.values()), "not logging at DEBUG"
    assert "tuple 0: ADDITIVE mul of [8, 8] and [8, 8]" in logs["dealer.log"], "no dealer debug"
    needles: set[str] = set()
    for r in results:
        for key in r.value["keys"]:
            needles |= key_needles(key)
        for share in r.value["shares"]:
            needles |= share_needles(share)
        needles |= input_needles(r.value["input"])
    assert len(needles) > 500
    # The search finds a secret wherever a log line would carry it.
    key, share, value = results[1].value["keys"][0], results[1].value["shares"][0], b[0, 0]
    for planted in (str(key.numpy().tobytes()), str(share), str(b), f"x={float(value)!r}"):
        assert leaks(planted, needles), planted
        assert leaks(decoded(json.dumps({"message": planted})), needles), planted  # escaped
    for name, text in logs.items():
        assert not leaks(text, needles), f"{name} logs secrets: {leaks(text, needles)[:5]}"
