"""Party processes in one `mpcml.session` on this machine: how the model benchmarks run.

The driver gives each rank its spec; every process opens the session (gRPC with mutual TLS,
mpcml's dealer unless the provider is "tfp") from the fields `run_parties` adds, and runs its
role (bench/party.py) inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.transport import Group
from mpcml.transport.address import free_ports
from tests.support.parties import dealer_process


@contextlib.contextmanager
def open_session(spec: dict[str, Any]) -> Iterator[Any]:
    """The session a party process of `run_parties` belongs to."""
    import torch

    import mpcml
    from mpcml.runtime.provider import DealerEndpoint

    torch.set_num_threads(spec["threads"])
    if spec.get("torch_prg"):  # a benchmark's ablation: CrypTen's own torch generators
        from mpcml.runtime import prg

        prg.install = lambda: None
    with mpcml.session(
        rank=spec["rank"],
        world_size=spec["world_size"],
        peers=spec["peers"],
        peer_names=spec["peer_names"],
        tls=None if spec.get("insecure") else mpcml.TLSFiles(**spec["tls"]),
        insecure=bool(spec.get("insecure")),
        session_id=spec["session_id"],
        device=spec["device"],
        dealer=DealerEndpoint(spec["dealer"]) if spec["dealer"] else None,
        network=spec.get("network") or None,
    ) as session:
        yield session


def peak_rss() -> int:
    """Peak resident memory of the calling process in bytes: VmHWM, fresh at each exec.

    getrusage's ru_maxrss does not: Linux carries it across fork and exec, so a party started
    by a driver that had grown (a tuner run on BERT-base) reported the driver's peak.
    """
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_parties(
    tmp: Path,
    pki: dict[str, dict[str, str]],
    label: str,
    spec: Callable[[int], dict[str, Any]],
    timeout: float,
    provider: str = "dealer",
    device: Callable[[int], str] = lambda rank: "cpu",
    threads: int = 1,
) -> list[Any]:
    """Run one process per party of `pki` with `spec(rank)`; their results, in rank order.

    Raises BenchError (with the failing party's log) on a failure or after `timeout` seconds.
    """
    names = list(pki)

    def start(dealer: str | None) -> list[Any]:
        peers = [f"127.0.0.1:{p}" for p in free_ports(len(names))]
        with Group(tmp, label) as group:
            for rank in range(len(names)):
                group.start(
                    {
                        **spec(rank),
                        "rank": rank,
                        "world_size": len(names),
                        "peers": peers,
                        "peer_names": names,
                        "tls": pki[names[rank]],
                        "session_id": f"bench-{label}",
                        "device": device(rank),
                        "dealer": dealer,
                        "threads": threads,
                    }
                )
            return group.wait(timeout)

    if provider != "dealer":
        return start(None)
    dealer_dir = tmp / f"dealer-{label}"
    dealer_dir.mkdir()
    with dealer_process(dealer_dir, tmp / "pki", log_level="warning") as address:
        return start(address)
