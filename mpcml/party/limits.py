"""What one job may cost this party: its `[policy.limits]`, and the caps its worker runs under.

```toml
[policy.limits]
max_job_memory_mib = 8192     # the most a job's estimated peak memory may be
max_parameters = 50_000_000   # the most parameters a job's model may have
max_tuple_elements = 67108864 # the largest tensor of any tuple a job asks of the dealer
max_job_seconds = 86400       # the most seconds one run of a job's worker may take
memory_margin = 1.5           # a worker's memory cap: its estimate times this, plus 256 MiB
```

Each party estimates a job's cost when it vets it (`mpcml.jobs.estimate`) and refuses it over
a limit; the coordinator refuses it with RESOURCE_EXHAUSTED. A job that passes still runs under
caps, because an estimate can be wrong:

- memory: the pool's monitor reads the worker's resident memory (VmRSS) every 0.2 s and stops
  it past its cap, the job's estimate here times `memory_margin` plus 256 MiB (at most
  `max_job_memory_mib` the same way), with a reason that names the cap; and the worker runs under
  `RLIMIT_DATA` at that cap plus `ADDRESS_ALLOWANCE`, so an allocation too fast for the monitor
  fails in the worker instead of taking the machine's memory. `RLIMIT_DATA` bounds the heap and
  every private writable mapping, where torch's tensors live; `RLIMIT_AS` would also count the
  shared libraries. A cgroup would bound resident memory exactly, but needs a delegated
  cgroup-v2 subtree, which neither a container's default setup nor this project's CI machines
  (cgroup v1) give a daemon: not built (docs/failures.md).
- time: the monitor stops a worker once it has run `max_job_seconds`.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpcml.config import ConfigError
from mpcml.proto.v1 import coordinator_pb2 as cpb

MIB = 2**20
DEFAULT_SHARE_OF_MEMORY = 0.5
"""By default all of a party's jobs together may be estimated at half its machine's memory: the
rest is for the daemon, the dealer and whatever else runs there."""
DEFAULT_MAX_TUPLE_ELEMENTS = 2**26
"""The dealer's own default `max_tuple_elements`."""
DEFAULT_MAX_JOB_SECONDS = 86400.0
DEFAULT_MEMORY_MARGIN = 1.5
CAP_ALLOWANCE = 256 * MIB
"""Added to every worker's memory cap: a small job's peak moves by tens of MiB with the
allocator and the threads whatever its estimate (bench/estimate.py: 0.8-1.3x)."""
ADDRESS_ALLOWANCE = 1536 * MIB
"""What RLIMIT_DATA allows a worker above its resident-memory cap: VmData counts thread stacks
and allocator arenas reserved but never touched, 1.17-1.20 GiB above VmRSS in the workers of
`bench/estimate.py`'s runs (read from /proc/PID/status while they ran)."""
BYTES_PER_PARAMETER = 64
"""What the default `max_parameters` allows for each parameter of a trained model: its share,
gradient and momentum, the tuples and openings of its products (mpcml/jobs/estimate.py)."""
_KEYS = {
    "max_job_memory_mib",
    "max_parameters",
    "max_tuple_elements",
    "max_job_seconds",
    "memory_margin",
}


def machine_memory() -> int:
    """Physical memory of the machine, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Limits:
    """A party's limits on one job; 0 means none."""

    max_job_memory_mib: int
    max_parameters: int
    max_tuple_elements: int
    max_job_seconds: float
    memory_margin: float = DEFAULT_MEMORY_MARGIN

    @classmethod
    def defaults(cls, concurrent_jobs: int, memory: int | None = None) -> Limits:
        """Sized from the machine: its jobs together at most half its memory."""
        memory = machine_memory() if memory is None else memory
        per_job = int(memory * DEFAULT_SHARE_OF_MEMORY / max(concurrent_jobs, 1))
        return cls(
            max_job_memory_mib=per_job // MIB,
            max_parameters=per_job // BYTES_PER_PARAMETER,
            max_tuple_elements=DEFAULT_MAX_TUPLE_ELEMENTS,
            max_job_seconds=DEFAULT_MAX_JOB_SECONDS,
        )

    @classmethod
    def from_table(cls, table: Any, concurrent_jobs: int, where: Path) -> Limits:
        """`[policy.limits]` of party.toml over the machine's defaults."""
        table = dict(table or {})
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ConfigError(
                f"policy.limits in {where} has no setting {unknown[0]!r} "
                f"(settings: {', '.join(sorted(_KEYS))})"
            )
        base = cls.defaults(concurrent_jobs)
        values: dict[str, Any] = {}
        for key in _KEYS:
            if key not in table:
                continue
            value = table[key]
            whole = key not in ("max_job_seconds", "memory_margin")
            good = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            if whole:
                good = good and isinstance(value, int)
            if key == "memory_margin":
                good = good and value > 0
            if not good:
                kind = "a whole number >= 0" if whole else "a number > 0"
                raise ConfigError(f"policy.limits.{key} in {where} must be {kind}, got {value!r}")
            values[key] = value
        return cls(**{**base.__dict__, **values})

    def to_proto(self) -> cpb.ResourceLimits:
        """What the party registers with the coordinator."""
        return cpb.ResourceLimits(
            max_job_memory_bytes=self.max_job_memory_mib * MIB,
            max_parameters=self.max_parameters,
            max_tuple_elements=self.max_tuple_elements,
            max_job_seconds=self.max_job_seconds,
        )

    def memory_cap(self, estimate_bytes: int) -> int:
        """The job worker's resident-memory cap in bytes; 0: none.

        Its estimate times `memory_margin`, plus `CAP_ALLOWANCE`; the limit's the same way when
        that is lower, or when there is no estimate.
        """
        limit = self.max_job_memory_mib * MIB
        caps = [int(b * self.memory_margin) + CAP_ALLOWANCE for b in (estimate_bytes, limit) if b]
        return min(caps, default=0)


def hard_cap(cap_bytes: int) -> int:
    """The RLIMIT_DATA a worker with resident-memory cap `cap_bytes` gets; 0: none."""
    return cap_bytes + ADDRESS_ALLOWANCE if cap_bytes else 0


def cap_memory(limit_bytes: int) -> None:
    """Cap this process's heap and private mappings (RLIMIT_DATA); allocations beyond fail."""
    if limit_bytes > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))


def resident_bytes(pid: int) -> int:
    """Process `pid`'s resident memory (VmRSS) in bytes; 0 once it is gone."""
    return _status("VmRSS", f"/proc/{pid}/status")


def _status(field: str, path: str = "/proc/self/status") -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss() -> int:
    """Peak resident memory (VmHWM) of the calling process, in bytes.

    Not getrusage's ru_maxrss: Linux carries it across fork, so a worker would report the
    fork server's peak.
    """
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def data_now() -> int:
    """What RLIMIT_DATA counts of the calling process now (VmData), in bytes."""
    return _status("VmData")
