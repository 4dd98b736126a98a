"""An emulated network between parties: a one-way delay and a bandwidth cap on each stream.

Benchmarks need WAN figures, and the machines they run on have no traffic shaping (no `tc`,
no root): loopback has neither delay nor a useful bandwidth limit. So the data plane imposes
them on its own streams, at the receiver. Each inbound stream is a link of its own (full
duplex, one per ordered pair of parties, as between sites): a message occupies the link for
`bytes / bandwidth` after the link is free and after it arrived, and is handed to the
computation `delay` after that. A party's computation therefore waits exactly as it would
behind a real link of that delay and bandwidth, while the sender runs on (as over TCP with
a large enough window). Not emulated: loss, jitter, TCP's slow start, and the dealer's
connection (tuples are requested ahead of their use, off the critical path).

Configured as text, `delay=20ms,bandwidth=352mbit` (either part optional; `rtt=40ms` is
`delay=20ms`): a party's `network` setting, `mpcml.session(network=...)`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from mpcml.errors import MpcmlError

_UNITS_S = {"ms": 1e-3, "us": 1e-6, "s": 1.0}
_UNITS_BITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_PART = re.compile(r"^(delay|rtt|bandwidth)=([0-9]*\.?[0-9]+)([a-z]+)$")


class ShapingError(MpcmlError, ValueError):
    """A network setting that cannot be read; the message shows the form."""


@dataclass(frozen=True)
class Shaping:
    """A link's one-way delay (seconds) and bandwidth (bytes per second, 0: unlimited)."""

    delay_s: float = 0.0
    bytes_per_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Shaping:
        """`delay=20ms,bandwidth=352mbit`, `rtt=40ms`, ...; empty or "none": no shaping.

        "none" is what `str` gives for no shaping (`delay=0ms` too), so a setting passed on as
        text reads back.
        """
        delay, rate = 0.0, 0.0
        if text.strip().lower() == "none":
            return cls()
        for part in filter(None, (p.strip().lower() for p in text.split(","))):
            match = _PART.match(part)
            units = _UNITS_BITS if match and match[1] == "bandwidth" else _UNITS_S
            if match is None or match[3] not in units:
                raise ShapingError(
                    f"network setting {part!r} is not of the form delay=20ms, rtt=40ms or "
                    f"bandwidth=352mbit (units: {', '.join([*_UNITS_S, *_UNITS_BITS])})"
                )
            value = float(match[2]) * units[match[3]]
            if match[1] == "bandwidth":
                if value <= 0:
                    raise ShapingError(f"network bandwidth must be positive, got {part!r}")
                rate = value / 8
            else:
                delay = value / 2 if match[1] == "rtt" else value
        return cls(delay, rate)

    def __bool__(self) -> bool:
        return self.delay_s > 0 or self.bytes_per_s > 0

    def __str__(self) -> str:
        parts = []
        if self.delay_s:
            parts.append(f"delay={1000 * self.delay_s:g}ms")
        if self.bytes_per_s:
            parts.append(f"bandwidth={8 * self.bytes_per_s / 1e6:g}mbit")
        return ",".join(parts) or "none"


class EmulatedLink:
    """One inbound stream's emulated link: when each message may be handed out."""

    def __init__(self, shaping: Shaping) -> None:
        self.shaping = shaping
        self._free = 0.0

    def release(self, size: int, arrived: float | None = None) -> float:
        """The `time.monotonic()` at which a message of `size` bytes, arrived now, is delivered."""
        now = time.monotonic() if arrived is None else arrived
        start = max(now, self._free)
        if self.shaping.bytes_per_s:
            start += size / self.shaping.bytes_per_s
        self._free = start
        return start + self.shaping.delay_s
