"""The conformance runner itself: a party that dies or hangs is a failure, and the rest still run.

CrypTen's own harness counts a test as passed when a party dies before reporting; ours must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crypten_suite.harness import Suite, run_suite

pytestmark = pytest.mark.system


def test_a_party_that_dies_or_hangs_fails_its_test_and_the_next_tests_still_run(
    tmp_path: Path,
) -> None:
    suite = Suite("tests.crypten_suite.dying", "Dies", world_size=2, provider="TFP")
    outcomes = run_suite(tmp_path, suite, stall_s=4.0)
    assert {name: outcome.status for name, outcome in outcomes.items()} == {
        "test_a_passes": "passed",
        "test_b_party_dies": "failed",
        "test_c_hangs": "failed",
        "test_d_passes_after_a_restart": "passed",
    }
    for name in ("test_b_party_dies", "test_c_hangs"):
        assert "no report from rank(s) [1]" in outcomes[name].detail, outcomes[name].detail
