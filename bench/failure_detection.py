"""How long the surviving parties take to fail when a peer dies or freezes mid-computation.

Three parties multiply in a loop inside `mpcml.session` over mutual TLS; rank 2 is then killed
(SIGKILL: its sockets close at once) or frozen (SIGSTOP: only keepalive can tell). The table
gives the seconds from the signal until each survivor's process has exited with its error.
Run by `make bench`.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpcml.transport import options  # noqa: E402
from tests.support.parties import Parties, party_specs, start_looping  # noqa: E402

TRIALS = 3


def detect(how: str) -> list[float]:
    """Seconds from `how` sent to rank 2 until ranks 0 and 1 have exited, one trial."""
    with tempfile.TemporaryDirectory(prefix="mpcml-failover-") as name:
        tmp = Path(name)
        specs = party_specs(tmp, 3, "tests.transport.scenarios:loop_until_killed")
        parties = Parties(tmp)
        try:
            start_looping(tmp, parties, specs)
            victim = parties.procs[2].pid
            assert victim is not None
            sent = time.monotonic()
            os.kill(victim, getattr(signal, how))
            seconds = []
            for rank in (0, 1):
                result = parties.wait(rank, timeout=60)
                if result.ok or "rank 2" not in result.error:
                    raise SystemExit(f"rank {rank} did not fail naming rank 2: {result}")
                seconds.append(time.monotonic() - sent)
            return seconds
        finally:
            parties.kill_all()


def main() -> int:
    rows = [("peer", "detected by", "median s", "max s")]
    for how, by in (("SIGKILL", "connection reset"), ("SIGSTOP", "keepalive")):
        times = [t for _ in range(TRIALS) for t in detect(how)]
        rows.append(
            (f"{how} rank 2 of 3", by, f"{statistics.median(times):.2f}", f"{max(times):.2f}")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print("failure detection: seconds from the signal until both survivors have exited\n")
    for n, row in enumerate(rows):
        print(
            "  ".join(
                [
                    row[0].ljust(widths[0]),
                    *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
                ]
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(
        f"\n{TRIALS} trials each, gRPC+mTLS on 127.0.0.1; keepalive: ping every "
        f"{options.KEEPALIVE_TIME_MS} ms, drop after {options.KEEPALIVE_TIMEOUT_MS} ms "
        "without an answer."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
