"""The emulated network (mpcml/transport/shaping.py): its arithmetic, and a real session on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpcml.transport.shaping import EmulatedLink, Shaping, ShapingError
from tests.support.parties import run_session


def test_settings_are_read_with_units_and_refused_with_the_form() -> None:
    assert Shaping.parse("delay=20ms,bandwidth=352mbit") == Shaping(0.02, 44e6)
    assert Shaping.parse("rtt=40ms") == Shaping(0.02, 0.0)
    assert Shaping.parse(" Bandwidth=1Gbit ") == Shaping(0.0, 1.25e8)
    assert not Shaping.parse("")
    assert str(Shaping.parse("rtt=40ms,bandwidth=352mbit")) == "delay=20ms,bandwidth=352mbit"
    # Text passed on reads back, "no shaping" too (a party hands its workers the setting so).
    for text in ("delay=0ms", "", "rtt=40ms"):
        assert Shaping.parse(str(Shaping.parse(text))) == Shaping.parse(text)
    for bad in ("delay=20", "latency=5ms", "bandwidth=10ms", "delay=-1ms"):
        with pytest.raises(ShapingError, match="of the form delay=20ms"):
            Shaping.parse(bad)
    with pytest.raises(ShapingError, match="must be positive"):
        Shaping.parse("bandwidth=0mbit")


def test_a_link_delivers_after_its_transfer_time_and_delay_one_message_at_a_time() -> None:
    link = EmulatedLink(Shaping(delay_s=0.01, bytes_per_s=1000.0))
    assert link.release(100, arrived=5.0) == pytest.approx(5.0 + 0.1 + 0.01)
    # Arrived while the first was still on the link: it waits for the link to be free.
    assert link.release(500, arrived=5.05) == pytest.approx(5.1 + 0.5 + 0.01)
    # Arrived after the link went idle: only its own transfer time and the delay.
    assert link.release(0, arrived=9.0) == pytest.approx(9.0 + 0.01)
    unlimited = EmulatedLink(Shaping(delay_s=0.02))
    assert unlimited.release(10**9, arrived=1.0) == pytest.approx(1.02)


@pytest.mark.system
def test_a_session_on_an_emulated_network_waits_for_it_and_computes_the_same(
    tmp_path: Path,
) -> None:
    """Each all-reduce waits for its peer's share across the link: at least the one-way delay,
    and at 8 Mbit/s at least the shares' transfer time. A lower bound only: a slow machine
    adds time, never removes it. The first exchange may take less by the parties' skew
    leaving the barrier (itself across the link), so it is not counted."""
    exchanges, elements = 5, 25_000  # 200 kB a message: 0.2 s each at 8 Mbit/s
    plain = run_session(
        tmp_path / "plain",
        2,
        "tests.transport.scenarios:timed_exchanges",
        scenario_kwargs={"exchanges": exchanges, "elements": elements},
    )
    shaped = run_session(
        tmp_path / "shaped",
        2,
        "tests.transport.scenarios:timed_exchanges",
        scenario_kwargs={"exchanges": exchanges, "elements": elements},
        session_kwargs={"network": "delay=100ms,bandwidth=8mbit"},
    )
    for results in (plain, shaped):
        assert all(r.ok for r in results), [r.traceback for r in results]
    want = torch.full((elements,), sum(2 * i + 1 for i in range(exchanges)), dtype=torch.long)
    for r in plain + shaped:
        assert torch.equal(r.value["total"], want)
    floor = (exchanges - 1) * (0.1 + elements * 8 / 1e6)
    for r in shaped:
        assert r.value["seconds"] >= floor, (r.value["seconds"], floor)
