"""CrypTen's own test suite over the gRPC data plane (`make test-crypten`; a subset in CI).

Each CrypTen test is one pytest test here, run by `harness.run_suite` in party processes over
mutual TLS. A test listed in `expected.EXPECTED` must fail with its stated cause (then it is
reported as xfailed); if it passes, or fails otherwise, this fails so that the list is kept true.
Any other failure is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crypten_suite.expected import expected
from tests.crypten_suite.harness import Outcome, Suite, class_tests, run_suite
from tests.crypten_suite.suites import SUITES, tier

pytestmark = [pytest.mark.system, pytest.mark.crypten]


def _params() -> list[object]:
    params: list[object] = []
    for suite in SUITES:
        for name in class_tests(suite):
            where = tier(suite, name)
            if where is None:
                continue
            marks = [] if where == "ci" else [pytest.mark.crypten_full]
            params.append(pytest.param(suite, name, id=f"{suite.id}::{name}", marks=marks))
    return params


_OUTCOMES: dict[str, dict[str, Outcome]] = {}


def _outcomes(request: pytest.FixtureRequest, suite: Suite) -> dict[str, Outcome]:
    """Run the suite's selected tests once, the first time one of them is asked for."""
    if suite.id not in _OUTCOMES:
        selected = [
            item.callspec.params["name"]
            for item in request.session.items
            if hasattr(item, "callspec") and item.callspec.params.get("suite") == suite
        ]
        tmp: Path = request.getfixturevalue("tmp_path_factory").mktemp(suite.id)
        _OUTCOMES[suite.id] = run_suite(tmp, suite, selected)
    return _OUTCOMES[suite.id]


# The first test of a suite runs the whole suite's selection; the harness itself fails a test on
# which a party dies or stalls, so this bound is only a backstop.
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("suite", "name"), _params())
def test_crypten(request: pytest.FixtureRequest, suite: Suite, name: str) -> None:
    outcome = _outcomes(request, suite)[name]
    difference = expected(suite, name)
    if outcome.status == "skipped":
        pytest.skip(f"CrypTen skips it: {outcome.detail}")
    if difference is None:
        assert outcome.status == "passed", outcome.detail
        return
    assert outcome.status == "failed", (
        f"{name} was listed as an expected difference ({difference.reason}) but now passes "
        "over the gRPC data plane: take it off the list in tests/crypten_suite/expected.py"
    )
    assert difference.match in outcome.detail, (
        f"{name} fails, but not for its listed reason ({difference.reason}; the failure "
        f"should mention {difference.match!r}):\n{outcome.detail}"
    )
    pytest.xfail(difference.reason)
