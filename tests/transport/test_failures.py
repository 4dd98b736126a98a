"""Errors, never hangs: peers that never come up, die, freeze, or present the wrong identity."""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path

import pytest

from mpcml.security import certs
from tests.support.parties import (
    Parties,
    PartyResult,
    party_specs,
    run_specs,
    start_looping,
)

pytestmark = pytest.mark.system

SMOKE = "tests.transport.scenarios:smoke"


def _assert_failed(result: PartyResult, *fragments: str) -> None:
    assert not result.ok, f"rank {result.rank} should have failed"
    assert result.error_type.endswith("Error") and not result.is_runtime_error, (
        f"rank {result.rank} raised {result.error_type}, a RuntimeError or not a transport "
        f"error:\n{result.traceback}"
    )
    for fragment in fragments:
        assert fragment in result.error, f"{fragment!r} not in: {result.error}"


def test_peer_that_never_comes_up_fails_after_connect_timeout_naming_it(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, SMOKE, session_kwargs={"connect_timeout": 3.0})
    [result] = run_specs(tmp_path, specs[:1], timeout=90)
    _assert_failed(result, "rank 1", specs[0].peers[1], "did not come up")
    assert result.error_type == "PeerConnectError"


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_peer_dying_mid_computation_fails_every_other_party_naming_it(
    tmp_path: Path, how: str
) -> None:
    specs = party_specs(tmp_path, 3, SMOKE)
    parties = Parties(tmp_path)
    try:
        start_looping(tmp_path, parties, specs)
        victim = parties.procs[2]
        assert victim.pid is not None
        os.kill(victim.pid, getattr(signal, how))
        # A killed peer closes its sockets at once; a frozen one is caught by keepalive
        # (options.KEEPALIVE_*: a few seconds). The harness fails the test if either hangs.
        results = [parties.wait(r, timeout=30) for r in (0, 1)]
    finally:
        parties.kill_all()
    for result in results:
        _assert_failed(result, "rank 2", "'party2'")


def test_peer_with_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, SMOKE, session_kwargs={"connect_timeout": 10.0})
    rogue = tmp_path / "rogue"
    certs.init_ca(rogue, name="rogue-ca")
    issued = certs.issue(rogue, "party1", sans=("127.0.0.1",))
    specs[1].tls = {"ca": str(rogue / "ca.pem"), "cert": str(issued.cert), "key": str(issued.key)}
    results = run_specs(tmp_path, specs, timeout=90)
    _assert_failed(results[0], "rank 1", "not accepted by our CA")
    _assert_failed(results[1], "rank 0", "not accepted by our CA")
    assert {r.error_type for r in results} == {"PeerIdentityError"}


def test_peer_with_wrong_name_for_its_rank_is_refused_naming_both_names(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, SMOKE, session_kwargs={"connect_timeout": 10.0})
    ca_dir = tmp_path / "pki"
    issued = certs.issue(ca_dir, "mallory", sans=("127.0.0.1",))
    specs[1].tls = {"ca": str(ca_dir / "ca.pem"), "cert": str(issued.cert), "key": str(issued.key)}
    results = run_specs(tmp_path, specs, timeout=90)
    # Rank 0 connects to "party1" and is shown mallory's certificate; mallory connects to
    # rank 0, which refuses a caller claiming rank 1 with mallory's name.
    _assert_failed(
        results[0], "rank 1", "expected a certificate for 'party1'", "presented 'mallory'"
    )
    _assert_failed(
        results[1], "refused this party", "certificate for 'party1'", "presented 'mallory'"
    )
    assert {r.error_type for r in results} == {"PeerIdentityError"}


def test_sessions_run_one_after_another_in_one_process(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, SMOKE, repeat=2)
    results = run_specs(tmp_path, specs, timeout=90)
    for r in results:
        assert r.ok, r.traceback
        assert len(r.value) == 2


def test_peer_with_a_certificate_of_another_role_is_refused(tmp_path: Path) -> None:
    specs = party_specs(tmp_path, 2, SMOKE, session_kwargs={"connect_timeout": 10.0})
    ca_dir = tmp_path / "pki"
    issued = certs.issue(ca_dir, "party1", role="client", sans=("127.0.0.1",), out=tmp_path / "c")
    specs[1].tls = {"ca": str(ca_dir / "ca.pem"), "cert": str(issued.cert), "key": str(issued.key)}
    results = run_specs(tmp_path, specs, timeout=90)
    for result in results:
        _assert_failed(result, "has role 'client'", "only a 'party' certificate")


def test_an_expired_certificate_is_refused_by_its_owner_and_by_its_peers(tmp_path: Path) -> None:
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    for attempt in ("own", "peer"):
        tmp = tmp_path / attempt
        specs = party_specs(tmp, 2, SMOKE, session_kwargs={"connect_timeout": 10.0})
        issued = certs.issue(
            tmp / "pki", "party1", sans=("127.0.0.1",), days=1, not_before=long_ago, out=tmp
        )
        assert specs[1].tls is not None
        specs[1].tls = {**specs[1].tls, "cert": str(issued.cert), "key": str(issued.key)}
        specs[1].kwargs["skip_own_certificate_check"] = attempt == "peer"
        results = run_specs(tmp, specs, timeout=90)
        if attempt == "own":
            # party1 refuses its own certificate before it connects, saying why.
            assert results[1].error_type == "ValueError", results[1].traceback
            assert "('party1') expired on" in results[1].error
            assert results[1].seconds < 5, "party1 should fail before connecting"
        else:
            # party1 presents it anyway: party0's handshake refuses it, and says why.
            _assert_failed(results[0], "rank 1", "certificate has expired")
