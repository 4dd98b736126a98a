"""`[policy.limits]`: defaults sized from the machine, errors that name the key, worker caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpcml.config import ConfigError
from mpcml.party import limits
from mpcml.party.limits import CAP_ALLOWANCE, MIB, Limits

WHERE = Path("/etc/mpcml/party.toml")


def test_the_defaults_share_half_the_machine_among_the_concurrent_jobs() -> None:
    one = Limits.defaults(1, memory=16 * 2**30)
    two = Limits.defaults(2, memory=16 * 2**30)
    assert one.max_job_memory_mib == 8192 and two.max_job_memory_mib == 4096
    assert one.max_parameters == 8 * 2**30 // limits.BYTES_PER_PARAMETER
    assert one.max_tuple_elements == 2**26 and one.max_job_seconds == 86400
    assert one.memory_margin == 1.5


def test_a_table_overrides_the_defaults() -> None:
    found = Limits.from_table({"max_job_memory_mib": 512, "max_job_seconds": 30.5}, 1, WHERE)
    assert found.max_job_memory_mib == 512 and found.max_job_seconds == 30.5
    assert found.to_proto().max_job_memory_bytes == 512 * MIB


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"max_memory": 1}, "policy.limits in /etc/mpcml/party.toml has no setting 'max_memory'"),
        ({"max_job_memory_mib": -1}, "max_job_memory_mib in /etc/mpcml/party.toml must be a whole"),
        ({"max_parameters": 1.5}, "max_parameters in /etc/mpcml/party.toml must be a whole"),
        ({"memory_margin": 0}, "memory_margin in /etc/mpcml/party.toml must be a number > 0"),
        ({"max_job_seconds": "1h"}, "max_job_seconds in /etc/mpcml/party.toml must be a number"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Limits.from_table(table, 1, WHERE)


def test_a_workers_cap_is_its_estimate_times_the_margin_plus_the_allowance() -> None:
    found = Limits(1000, 0, 0, 0.0, memory_margin=0.5)
    assert found.memory_cap(600 * MIB) == 300 * MIB + CAP_ALLOWANCE
    # never above the limit's own cap; the limit's alone without an estimate
    assert found.memory_cap(4000 * MIB) == 500 * MIB + CAP_ALLOWANCE
    assert found.memory_cap(0) == 500 * MIB + CAP_ALLOWANCE
    assert Limits(0, 0, 0, 0.0).memory_cap(0) == 0
    assert limits.hard_cap(0) == 0
    assert limits.hard_cap(100) == 100 + limits.ADDRESS_ALLOWANCE


def test_a_capped_process_fails_to_allocate_past_its_cap() -> None:
    import multiprocessing

    def child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
        limits.cap_memory(limits.data_now() + 64 * MIB)
        try:
            bytearray(512 * MIB)
            queue.put("allocated")
        except MemoryError:
            queue.put("MemoryError")

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    assert queue.get(timeout=30) == "MemoryError"
    process.join(30)
    assert limits.peak_rss() > 0 and limits.resident_bytes(process.pid or 0) == 0
