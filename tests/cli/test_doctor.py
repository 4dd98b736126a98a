"""`mpcml doctor`'s checks (certificates, addresses, the coordinator's job store): each problem
is found, named, and comes with a fix."""

from __future__ import annotations

import datetime as dt
import shutil
import socket
from pathlib import Path

from mpcml.cli.doctor import (
    FAIL,
    OK,
    WARN,
    Daemon,
    Finding,
    check_certificate,
    check_store,
    probe,
)
from mpcml.coordinator.sql_store import SqliteJobStore
from mpcml.security import certs
from mpcml.transport.tls import TLSFiles


def _daemon(ca: Path, folder: Path, name: str, role: str = "party") -> Daemon:
    tls = TLSFiles(ca / "ca.pem", folder / f"{name}.pem", folder / f"{name}.key")
    return Daemon(role, name, tls, "")


def _levels(found: list[Finding]) -> dict[str, str]:
    return {f.check: f.level for f in found}


def test_a_good_certificate_passes_and_reports_names_and_expiry(tmp_path: Path) -> None:
    certs.init_ca(tmp_path)
    certs.issue(tmp_path, "alice", role="party", sans=("alice.example.org", "10.0.0.5"))
    found = check_certificate(_daemon(tmp_path, tmp_path, "alice"))
    assert all(f.level == OK for f in found), found
    report = " ".join(f.detail for f in found)
    assert "alice.example.org" in report and "10.0.0.5" in report and "days" in report


def test_wrong_role_name_expiry_issuer_and_key_each_fail_with_a_fix(tmp_path: Path) -> None:
    ca, other = tmp_path / "ca", tmp_path / "other"
    certs.init_ca(ca)
    certs.init_ca(other)

    def level(folder: str, check: str) -> str:
        return _levels(check_certificate(_daemon(ca, tmp_path / folder, "alice")))[check]

    certs.issue(ca, "alice", role="client", out=tmp_path / "role")
    assert level("role", "certificate role") == FAIL
    certs.issue(ca, "bob", role="party", out=tmp_path / "name")
    shutil.copy(tmp_path / "name" / "bob.pem", tmp_path / "name" / "alice.pem")
    shutil.copy(tmp_path / "name" / "bob.key", tmp_path / "name" / "alice.key")
    assert level("name", "certificate name") == FAIL
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    certs.issue(ca, "alice", role="party", out=tmp_path / "old", days=5, not_before=old)
    assert level("old", "expiry") == FAIL
    certs.issue(ca, "alice", role="party", out=tmp_path / "soon", days=10)
    assert level("soon", "expiry") == WARN
    certs.issue(other, "alice", role="party", out=tmp_path / "foreign")
    assert level("foreign", "issuer") == FAIL
    certs.issue(ca, "alice", role="party", out=tmp_path / "key")
    certs.issue(ca, "carol", role="party", out=tmp_path / "key")
    shutil.copy(tmp_path / "key" / "carol.key", tmp_path / "key" / "alice.key")
    found = check_certificate(_daemon(ca, tmp_path / "key", "alice"))
    assert _levels(found)["key"] == FAIL
    assert all(f.fix for f in found if f.level != OK)


def test_an_address_where_nothing_listens_fails_naming_the_port(tmp_path: Path) -> None:
    from mpcml.transport.address import free_ports

    certs.init_ca(tmp_path)
    certs.issue(tmp_path, "alice", role="party")
    [port] = free_ports(1)
    daemon = _daemon(tmp_path, tmp_path, "alice")
    [finding] = probe("coordinator", f"127.0.0.1:{port}", "coordinator", daemon.tls)
    assert finding.level == FAIL and f"nothing listens on port {port}" in finding.detail
    assert "start the coordinator" in finding.fix


def test_the_coordinators_store_is_checked_without_creating_it(tmp_path: Path) -> None:
    missing = tmp_path / "state" / "jobs.db"
    finding = check_store(str(missing))
    assert finding.level == OK and "does not exist yet" in finding.detail
    assert not missing.exists() and not missing.parent.exists()
    SqliteJobStore(tmp_path / "jobs.db").close()
    finding = check_store(str(tmp_path / "jobs.db"))
    assert finding.level == OK and finding.detail.endswith(": 0 jobs")


def test_an_unreachable_postgresql_store_fails_with_a_fix_and_no_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    finding = check_store(f"postgresql://mpcml:s3cret@127.0.0.1:{port}/jobs")
    assert finding.level == FAIL and "PGPASSWORD" in finding.fix
    assert "s3cret" not in finding.detail + finding.fix


def test_a_postgresql_store_that_answers_passes(pg_url: str) -> None:
    finding = check_store(pg_url)
    assert finding.level == OK and finding.detail.endswith(": 0 jobs"), finding


def test_a_missing_certificate_file_is_a_finding_with_a_fix_and_exit_1(tmp_path: Path) -> None:
    import subprocess
    import sys

    from mpcml.demo.cluster import PARTIES_DIR

    profile = tmp_path / "alice"
    shutil.copytree(PARTIES_DIR / "alice", profile, ignore=shutil.ignore_patterns("data"))
    run = subprocess.run(  # the profile's certificates (../certs) do not exist here
        [sys.executable, "-m", "mpcml.cli.main", "doctor", "--config", str(profile / "party.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stderr
    assert "FAIL  certificate: cannot read the TLS files" in run.stdout
    assert "fix: mpcml certs issue --ca CA_DIR --name alice --role party" in run.stdout
    assert "FAIL  connections: not checked" in run.stdout and run.stderr == ""
