"""Run the parties of an `mpcml.session` as separate OS processes on loopback.

Each party is a process started as the party daemon starts its job workers (forked from a server
that imported torch and CrypTen once: `worker_context`), that opens a real session (gRPC,
mutual TLS with certificates made by `mpcml.security.certs`), runs a scenario function and
writes what it returns to a file the test reads back. Processes are always reaped, even when a
test fails.
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mpcml import logs
from mpcml.party.pool import worker_context
from mpcml.security import certs
from mpcml.transport.address import free_ports


def make_pki(directory: Path, names: Sequence[str]) -> dict[str, dict[str, str]]:
    """A CA and one certificate per name; returns the TLS file paths per name."""
    certs.init_ca(directory)
    out = {}
    for name in names:
        issued = certs.issue(directory, name, sans=("127.0.0.1", "localhost"))
        out[name] = {
            "ca": str(directory / "ca.pem"),
            "cert": str(issued.cert),
            "key": str(issued.key),
        }
    return out


@dataclass
class PartySpec:
    """Everything one party process needs; plain data so that it crosses to the process."""

    rank: int
    world_size: int
    peers: list[str]
    peer_names: list[str]
    tls: dict[str, str] | None
    scenario: str
    out: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def _party_main(spec: PartySpec) -> None:
    import mpcml

    tls = mpcml.TLSFiles(**spec.tls) if spec.tls is not None else None
    out = Path(spec.out)
    # Everything any library logs, at every level, for the tests that read it (rankN.log).
    logging.basicConfig(level=logging.DEBUG, filename=out.with_suffix(".log"), force=True)
    if spec.kwargs.get("log_format") == "json":  # as `--log-format json` writes them
        logging.getLogger().handlers[0].setFormatter(logs.JsonFormatter(f"rank{spec.rank}"))
    if spec.kwargs.get("skip_own_certificate_check"):
        # A peer that does not vet its own certificate (another implementation, or a rogue).
        import mpcml.runtime.crypten_session as crypten_session

        crypten_session.__dict__["check_certificate"] = lambda *args, **kwargs: None
    started = time.monotonic()
    try:
        module_name, _, func_name = spec.scenario.rpartition(":")
        func = getattr(importlib.import_module(module_name), func_name)
        results = []
        for _ in range(spec.kwargs.get("repeat", 1)):
            with mpcml.session(
                rank=spec.rank,
                world_size=spec.world_size,
                peers=spec.peers,
                tls=tls,
                peer_names=spec.peer_names,
                insecure=tls is None,
                **spec.kwargs.get("session", {}),
            ) as s:
                results.append(func(s, **spec.kwargs.get("scenario", {})))
        torch.save(results[0] if len(results) == 1 else results, out.with_suffix(".pt"))
        out.with_suffix(".json").write_text(
            json.dumps({"ok": True, "seconds": time.monotonic() - started})
        )
    except BaseException as exc:  # reported to the test, which asserts on it
        out.with_suffix(".json").write_text(
            json.dumps(
                {
                    "ok": False,
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "seconds": time.monotonic() - started,
                    "is_runtime_error": isinstance(exc, RuntimeError),
                    "traceback": traceback.format_exc(),
                }
            )
        )


@dataclass
class PartyResult:
    """What one party process ended with."""

    rank: int
    exitcode: int | None
    ok: bool
    value: Any = None
    error_type: str = ""
    error: str = ""
    is_runtime_error: bool = False
    traceback: str = ""
    seconds: float = 0.0
    """From the start of the party's first session to its result or error."""


class Parties:
    """Start party processes; `wait()` collects their results; `kill_all()` always reaps."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ctx = worker_context()
        self.procs: dict[int, Any] = {}
        self.specs: dict[int, PartySpec] = {}

    def start(self, spec: PartySpec) -> None:
        proc = self.ctx.Process(target=_party_main, args=(spec,), daemon=True)
        proc.start()
        self.procs[spec.rank] = proc
        self.specs[spec.rank] = spec

    def wait(self, rank: int, timeout: float) -> PartyResult:
        proc = self.procs[rank]
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
            raise AssertionError(f"party {rank} still running after {timeout} s: it hung")
        out = Path(self.specs[rank].out)
        status_file = out.with_suffix(".json")
        if not status_file.exists():
            return PartyResult(rank, proc.exitcode, False, error="no result written")
        status = json.loads(status_file.read_text())
        seconds = status["seconds"]
        if not status["ok"]:
            return PartyResult(
                rank,
                proc.exitcode,
                False,
                error_type=status["type"],
                error=status["message"],
                is_runtime_error=status["is_runtime_error"],
                traceback=status["traceback"],
                seconds=seconds,
            )
        value = torch.load(out.with_suffix(".pt"), weights_only=True)
        return PartyResult(rank, proc.exitcode, True, value=value, seconds=seconds)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(5)


def party_specs(
    tmp: Path,
    world_size: int,
    scenario: str,
    *,
    tls: bool = True,
    scenario_kwargs: dict[str, Any] | None = None,
    session_kwargs: dict[str, Any] | None = None,
    **extra: Any,
) -> list[PartySpec]:
    """Specs of `world_size` parties on free loopback ports, with a fresh CA unless not `tls`."""
    names = [f"party{i}" for i in range(world_size)]
    pki = make_pki(tmp / "pki", names) if tls else None
    peers = [f"127.0.0.1:{p}" for p in free_ports(world_size)]
    kwargs = {"scenario": scenario_kwargs or {}, "session": session_kwargs or {}, **extra}
    return [
        PartySpec(
            rank=rank,
            world_size=world_size,
            peers=peers,
            peer_names=names,
            tls=pki[names[rank]] if pki else None,
            scenario=scenario,
            out=str(tmp / f"rank{rank}"),
            kwargs=kwargs,
        )
        for rank in range(world_size)
    ]


def run_specs(tmp: Path, specs: list[PartySpec], timeout: float = 240.0) -> list[PartyResult]:
    """Start every party, wait for all of them, always reap them."""
    parties = Parties(tmp)
    try:
        for spec in specs:
            parties.start(spec)
        return [parties.wait(spec.rank, timeout) for spec in specs]
    finally:
        parties.kill_all()


def run_session(
    tmp: Path,
    world_size: int,
    scenario: str,
    *,
    timeout: float = 240.0,
    tls: bool = True,
    scenario_kwargs: dict[str, Any] | None = None,
    session_kwargs: dict[str, Any] | None = None,
) -> list[PartyResult]:
    """Run `scenario` on `world_size` parties over mutual TLS; returns every party's result."""
    specs = party_specs(
        tmp,
        world_size,
        scenario,
        tls=tls,
        scenario_kwargs=scenario_kwargs,
        session_kwargs=session_kwargs,
    )
    return run_specs(tmp, specs, timeout)


def start_looping(tmp: Path, parties: Parties, specs: list[PartySpec]) -> None:
    """Start the parties on `loop_until_killed` and return once they are computing."""
    ready = tmp / "ready"
    for spec in specs:
        spec.scenario = "tests.transport.scenarios:loop_until_killed"
        spec.kwargs = {"scenario": {"ready": str(ready)}}
        parties.start(spec)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if time.monotonic() > deadline:
            raise AssertionError("parties never got going")
        for rank, proc in parties.procs.items():
            if not proc.is_alive():
                raise AssertionError(f"rank {rank} exited early")
        time.sleep(0.1)


@contextmanager
def dealer_process(
    tmp: Path, pki: Path, log_level: str = "debug", log_format: str = "text"
) -> Iterator[str]:
    """`mpcml dealer` as its own process with a 'dealer' certificate from `pki`; yields its
    address and stops it afterwards. It logs to `tmp/dealer.log`."""
    issued = certs.issue(pki, "dealer", role="dealer", sans=("127.0.0.1",), out=tmp / "dealer")
    address = f"127.0.0.1:{free_ports(1)[0]}"
    config = tmp / "dealer.toml"
    config.write_text(
        f'listen = "{address}"\n[tls]\nca = "{pki / "ca.pem"}"\n'
        f'cert = "{issued.cert}"\nkey = "{issued.key}"\n'
    )
    log = (tmp / "dealer.log").open("wb")
    command = [sys.executable, "-m", "mpcml.cli.main", "dealer", "--config", str(config)]
    process = subprocess.Popen(
        [*command, "--log-level", log_level, "--log-format", log_format],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield address
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def run_specs_on_dealer(
    tmp: Path, specs: list[PartySpec], timeout: float = 240.0
) -> list[PartyResult]:
    """`run_specs` with a dealer process (certificate from `tmp/pki`) as every session's; it
    logs in the specs' `log_format`."""
    from mpcml.runtime.provider import DealerEndpoint

    log_format = str(specs[0].kwargs.get("log_format", "text"))
    with dealer_process(tmp, tmp / "pki", log_format=log_format) as address:
        for spec in specs:
            spec.kwargs["session"]["dealer"] = DealerEndpoint(address)
        return run_specs(tmp, specs, timeout)
