"""The web console of a party and of the coordinator: mutual TLS with named users, and pages
that show what each organisation's data did, checked in a real browser (Debian's chromium,
driven by Playwright; skipped with the reason where either is missing)."""

from __future__ import annotations

import http.client
import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpcml.api.client import Client
from mpcml.api.job import Job
from mpcml.demo import models
from mpcml.demo.cluster import LocalCluster, console_user
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.conftest import submit_refused_by_alice

pytestmark = pytest.mark.system
SHARES_CLUSTER = True
CHROMIUM = os.environ.get("MPCML_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("MPCML_SCREENSHOTS", "")
"""A folder to write the pages' screenshots to (docs/console when they are refreshed)."""


def _get(cluster: LocalCluster, daemon: str, who: str | None, path: str = "/") -> int:
    """The HTTP status a request with `who`'s certificate (None: none) gets."""
    context = ssl.create_default_context(cafile=str(cluster.certs / "ca.pem"))
    if who is not None:
        context.load_cert_chain(cluster.certs / f"{who}.pem", cluster.certs / f"{who}.key")
    host, port = cluster.console_addresses[daemon].rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def test_only_the_organisations_named_users_read_its_console(cluster: LocalCluster) -> None:
    assert _get(cluster, "alice", console_user("alice")) == 200
    assert _get(cluster, "coordinator", console_user("coordinator")) == 200
    assert _get(cluster, "alice", console_user("bob")) == 403  # another organisation's user
    assert _get(cluster, "alice", "analyst") == 403  # a client, not a console user
    assert _get(cluster, "alice", "bob") == 403  # a party's certificate
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _get(cluster, "alice", None)  # no certificate: the handshake fails
    assert _get(cluster, "alice", console_user("alice"), "/jobs/" + "0" * 32) == 404


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (Debian) to run these")
    sync = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


class _Console:
    """A browser tab on one daemon's console, as its user, recording console errors."""

    def __init__(self, browser: Any, cluster: LocalCluster, daemon: str) -> None:
        origin = f"https://{cluster.console_addresses[daemon]}"
        user = console_user(daemon)
        self.context = browser.new_context(
            ignore_https_errors=True,  # the deployment's CA is not the browser's
            client_certificates=[
                {
                    "origin": origin,
                    "certPath": str(cluster.certs / f"{user}.pem"),
                    "keyPath": str(cluster.certs / f"{user}.key"),
                }
            ],
        )
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.origin = origin

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def open(self, path: str, shot: str = "") -> Any:
        response = self.page.goto(self.origin + path)
        assert response is not None and response.status == 200, (path, response)
        if SCREENSHOTS and shot:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SCREENSHOTS) / f"{shot}.png"), full_page=True)
        return self.page

    def close(self) -> None:
        self.context.close()


def _points(page: Any) -> int:
    chart = page.query_selector("figure#loss")
    return int(chart.get_attribute("data-points")) if chart is not None else 0


def test_a_running_jobs_loss_curve_grows_as_rounds_commit(
    browser: Any, cluster: LocalCluster, client: Client
) -> None:
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(15),
            features={"alice": "bc-train"},
            labels={"carol": "bc-train-labels"},
            epochs=2,
            batches_per_round=2,
            reveal={"metrics": ["carol", "coordinator"]},
        )
    )
    tab = _Console(browser, cluster, "alice")
    seen: list[int] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = job.status()
        points = _points(tab.open(f"/jobs/{job.id}"))
        if not seen or points != seen[-1]:
            seen.append(points)
        ended = status.state in (cpb.COMPLETED, cpb.FAILED, cpb.CANCELLED)
        if ended and points == status.committed_round:
            break
        time.sleep(0.3)
    final = job.status()
    assert final.state == cpb.COMPLETED, final.reason
    assert seen[-1] == final.total_rounds == 8
    assert len(seen) >= 3 and seen == sorted(seen), seen  # it grew while the job ran
    assert tab.errors == []
    tab.close()
    consortium = _Console(browser, cluster, "coordinator")
    assert _points(consortium.open(f"/jobs/{job.id}")) == 8
    assert consortium.errors == []
    consortium.close()


def test_a_refused_job_shows_its_rule_in_the_audit_page(
    browser: Any, cluster: LocalCluster, client: Client
) -> None:
    submit_refused_by_alice(client)
    tab = _Console(browser, cluster, "alice")
    page = tab.open("/audit", shot="party-audit")
    text = page.inner_text("body")
    assert "job_refused" in text
    assert "policy.outputs_to does not name 'bob' for predictions" in text
    assert page.inner_text("#verification").startswith("verified:")
    assert tab.errors == []
    tab.close()


def test_every_page_renders_without_console_errors(
    browser: Any, cluster: LocalCluster, client: Client
) -> None:
    job = client.submit(
        Job.train(
            model=models.LogisticRegression(15),
            features={"alice": "bc-train"},
            labels={"carol": "bc-train-labels"},
            epochs=2,
            reveal={"metrics": ["coordinator"]},
        )
    )
    assert job.wait(timeout=240).state == cpb.COMPLETED
    pages = {
        "alice": [
            ("/", "party-jobs"),
            (f"/jobs/{job.id}", "party-job"),
            ("/datasets", ""),
            ("/policy", "party-policy"),
            ("/audit", ""),
        ],
        "coordinator": [("/", "coordinator-jobs"), (f"/jobs/{job.id}", "coordinator-job")],
    }
    for daemon, paths in pages.items():
        tab = _Console(browser, cluster, daemon)
        for path, shot in paths:
            page = tab.open(path, shot=shot)
            assert page.query_selector("h1") is not None
        assert tab.errors == [], (daemon, tab.errors)
        tab.close()
