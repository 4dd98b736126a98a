"""`mpcml.metrics`: the `metrics_address` setting and the endpoint every daemon can serve."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import Counter

from mpcml import metrics
from mpcml.config import ConfigError
from mpcml.dealer.server import DealerConfig


def test_the_endpoint_serves_its_registry_and_releases_its_port() -> None:
    registry = metrics.registry()
    Counter("mpcml_test_things", "Things.", registry=registry).inc(3)
    server = metrics.serve("127.0.0.1:0", registry)
    assert server is not None
    try:
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.stop()
    assert "mpcml_test_things_total 3.0" in text
    assert "process_cpu_seconds_total" in text
    assert "python_gc" not in text  # a registry of its own, not the global one
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)


def test_no_address_no_endpoint() -> None:
    assert metrics.serve("", metrics.registry()) is None


def test_an_address_in_use_is_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            metrics.serve(f"127.0.0.1:{port}", metrics.registry())


def test_metrics_address_comes_from_the_config_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "dealer.toml"
    config.write_text('listen = "127.0.0.1:7200"\ninsecure = true\n')
    assert DealerConfig.load(config).metrics_address == ""
    config.write_text(
        'listen = "127.0.0.1:7200"\ninsecure = true\nmetrics_address = "127.0.0.1:9103"\n'
    )
    assert DealerConfig.load(config).metrics_address == "127.0.0.1:9103"
    monkeypatch.setenv("MPCML_METRICS_ADDRESS", "[::1]:9104")
    assert DealerConfig.load(config).metrics_address == "[::1]:9104"
    monkeypatch.setenv("MPCML_METRICS_ADDRESS", "9104")
    with pytest.raises(ConfigError, match=r"`metrics_address` .* must be HOST:PORT, got .9104."):
        DealerConfig.load(config)
