"""The dealer's Prometheus metrics (`metrics_address` in dealer.toml).

What the dealer hands out, counted as it serves it; open sessions are read at scrape time.
Nothing here depends on a key or a tuple's values.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class DealerMetrics:
    """Tuples and bytes served, sessions opened, and sessions open now (`open_sessions()`)."""

    def __init__(self, registry: CollectorRegistry, open_sessions: Callable[[], int]) -> None:
        self.tuples = Counter(
            "mpcml_dealer_tuples_served",
            "Correlated-randomness tuples served, by kind (additive, square, binary, ...).",
            labelnames=["kind"],
            registry=registry,
        )
        self.bytes = Counter(
            "mpcml_dealer_served_bytes",
            "Serialized bytes of the tuple replies served.",
            registry=registry,
        )
        self.opened = Counter(
            "mpcml_dealer_sessions_opened", "Job sessions opened.", registry=registry
        )
        sessions = Gauge(
            "mpcml_dealer_sessions_open",
            "Job sessions not yet closed by all their parties (or forgotten when idle).",
            registry=registry,
        )
        sessions.set_function(lambda: float(open_sessions()))
