"""Metrics and structured logs of real daemons: a cluster whose every process logs JSON and
serves Prometheus metrics on loopback runs one job; the test scrapes every endpoint over HTTP
before and after it, and reads every log line."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpcml.demo.cluster import LocalCluster
from mpcml.proto.v1 import coordinator_pb2 as cpb
from tests.system.test_jobs import _digits_job
from tests.system.test_security import _data_cells, _private_key_lines

pytestmark = pytest.mark.system

PARTIES = ("alice", "bob")
DAEMONS = ("coordinator", "dealer", *PARTIES)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of a /metrics page, by name and labels."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a counter that has not been touched yet."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    """The sum of a metric over all its labels."""
    return sum(v for (n, _), v in samples.items() if n == name)


@dataclass
class ObservedJob:
    cluster: LocalCluster
    job_id: str
    total_rounds: int
    before: dict[str, Samples]
    after: dict[str, Samples]

    def grew(self, daemon: str, name: str, **labels: str) -> float:
        return value(self.after[daemon], name, **labels) - value(
            self.before[daemon], name, **labels
        )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObservedJob]:
    root = tmp_path_factory.mktemp("observability")
    with LocalCluster(
        root, parties=PARTIES, metrics=True, log_format="json", log_level="debug"
    ) as cluster:
        client = cluster.start()
        before = {d: scrape(cluster.metrics_url(d)) for d in DAEMONS}
        job = client.submit(_digits_job())
        status = job.wait(timeout=180)
        assert status.state == cpb.COMPLETED, status.reason
        after = {d: scrape(cluster.metrics_url(d)) for d in DAEMONS}
        yield ObservedJob(cluster, job.id, status.total_rounds, before, after)


def test_coordinator_metrics_count_the_job_its_rounds_and_the_parties_heartbeats(
    observed: ObservedJob,
) -> None:
    assert observed.total_rounds >= 1
    assert observed.grew("coordinator", "mpcml_coordinator_jobs", state="COMPLETED") == 1
    after = observed.after["coordinator"]
    assert value(after, "mpcml_coordinator_jobs", state="FAILED") == 0
    rounds = observed.grew("coordinator", "mpcml_coordinator_rounds_committed_total")
    assert rounds == observed.total_rounds
    assert observed.grew("coordinator", "mpcml_coordinator_round_duration_seconds_count") == rounds
    assert observed.grew("coordinator", "mpcml_coordinator_round_duration_seconds_sum") > 0
    assert value(after, "mpcml_coordinator_parties_connected") == len(PARTIES)
    for party in PARTIES:
        assert value(after, "mpcml_coordinator_party_connected", party=party) == 1
        age = ("mpcml_coordinator_party_heartbeat_age_seconds", frozenset({("party", party)}))
        assert age in after and after[age] >= 0


def test_party_metrics_count_the_worker_and_its_traffic_with_each_peer(
    observed: ObservedJob,
) -> None:
    for party, peer in (("alice", "bob"), ("bob", "alice")):
        assert observed.grew(party, "mpcml_party_job_workers_started_total") == 1
        assert observed.grew(party, "mpcml_party_job_workers_finished_total") == 1
        assert observed.grew(party, "mpcml_party_job_workers_failed_total") == 0
        assert observed.grew(party, "mpcml_party_rounds_done_total") == observed.total_rounds
        assert observed.grew(party, "mpcml_party_peer_sent_bytes_total", peer=peer) > 0
        assert observed.grew(party, "mpcml_party_peer_received_bytes_total", peer=peer) > 0
        assert value(observed.after[party], "mpcml_party_heartbeat_age_seconds") >= 0
        assert "mpcml_party_jobs_running" in {n for n, _ in observed.after[party]}
    # What one party sent the other is what the other received.
    sent = observed.grew("alice", "mpcml_party_peer_sent_bytes_total", peer="bob")
    assert observed.grew("bob", "mpcml_party_peer_received_bytes_total", peer="alice") == sent


def test_dealer_metrics_count_the_tuples_it_served(observed: ObservedJob) -> None:
    before, after = observed.before["dealer"], observed.after["dealer"]
    served = total(after, "mpcml_dealer_tuples_served_total") - total(
        before, "mpcml_dealer_tuples_served_total"
    )
    assert served > 0
    assert observed.grew("dealer", "mpcml_dealer_served_bytes_total") > 0
    assert observed.grew("dealer", "mpcml_dealer_sessions_opened_total") == 1
    assert ("mpcml_dealer_sessions_open", frozenset()) in after


def _json_lines(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    assert lines, f"{path.name} is empty"
    parsed = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"{path.name} line {n} is not JSON: {line[:200]!r}")
        assert isinstance(record, dict), f"{path.name} line {n}: {line[:200]!r}"
        assert {"time", "level", "logger", "daemon", "message"} <= set(record), line[:200]
        parsed.append(record)
    return parsed


def test_every_log_line_is_json_and_the_jobs_lines_carry_its_id(observed: ObservedJob) -> None:
    logs = {d: _json_lines(observed.cluster.logs / f"{d}.log") for d in DAEMONS}
    job_id = observed.job_id
    for daemon in ("coordinator", "dealer", *PARTIES):
        mine = [r for r in logs[daemon] if r.get("job_id") == job_id]
        assert mine, f"no line of {daemon}'s log carries the job id"
    for party in PARTIES:
        lines = [r for r in logs[party] if r.get("job_id") == job_id]
        assert all(r["party"] == party for r in lines)
        # The job worker logs into its daemon's log, as JSON too, with its round.
        worker = [r for r in lines if r["daemon"] == f"{party} worker"]
        assert worker, f"no JSON line of {party}'s job worker"
        assert any(r.get("round") == 1 for r in worker)
    committed = [
        r for r in logs["coordinator"] if r.get("job_id") == job_id and "committed" in r["message"]
    ]
    assert [r["round"] for r in committed] == list(range(1, observed.total_rounds + 1))


def test_json_logs_carry_no_private_key_or_data_value(observed: ObservedJob) -> None:
    cluster = observed.cluster
    keys = _private_key_lines(cluster.certs)
    cells = _data_cells(cluster.parties_dir)
    assert len(keys) > 10 and len(cells) > 1000
    for daemon in DAEMONS:
        # Decoded, so that JSON's escaping cannot hide a value from the search.
        text = "\n".join(
            str(v) for r in _json_lines(cluster.logs / f"{daemon}.log") for v in r.values()
        )
        found = [k for k in keys if k in text] + [c for c in cells if c in text]
        assert not found, f"{daemon}'s log carries secrets: {found[:5]}"
