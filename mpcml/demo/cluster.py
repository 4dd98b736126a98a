"""A whole mpcml deployment on loopback, for `mpcml demo` and the system tests.

A fresh CA, the coordinator and the party daemons run as separate processes, each with its own
log.

The party daemons read the profiles in `parties/<name>/party.toml` unchanged; only addresses,
certificates and state folders are moved into the cluster's work folder, through the
`MPCML_*` overrides every daemon honours.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mpcml import logs
from mpcml.api.client import Client
from mpcml.security import certs
from mpcml.transport.address import free_ports
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles

REPO = Path(__file__).resolve().parents[2]
PARTIES_DIR = REPO / "parties"
PARTIES = ("alice", "bob", "carol")
CLIENT = "analyst"
STOP_TIMEOUT_S = 10.0


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _await_group_gone(pgid: int, deadline: float) -> None:
    """Wait until every process of the group is dead (SIGKILLed already), up to `deadline`.

    A killed process lingers for a moment: without the wait, a caller that looks right after
    `stop()` could still see a job worker. Zombies count as gone: their parent reaps them.
    """
    if not Path("/proc/self/stat").exists():
        return
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def console_user(daemon: str) -> str:
    """The client certificate name that may read a daemon's console in a local cluster."""
    return f"{daemon}-ops"


class LocalCluster:
    """The coordinator and the parties of `parties_dir` on 127.0.0.1, in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        parties: Sequence[str] = PARTIES,
        parties_dir: Path = PARTIES_DIR,
        heartbeat_timeout: float = 15.0,
        roster_extra: Sequence[str] = (),
        log_level: str = "info",
        max_concurrent_jobs: int = 1,
        coordinator_settings: Mapping[str, int | str | list[str]] | None = None,
        metrics: bool = False,
        log_format: str = "text",
        network: str = "",
        insecure: bool = False,
        console: bool = False,
    ) -> None:
        self.workdir = workdir
        self.insecure = insecure
        """Every daemon and the client over plaintext gRPC (`--insecure`): for tests that read
        the traffic on the wire."""
        self.network = network
        """Every party's emulated network (`delay=20ms,bandwidth=352mbit`), for benchmarks."""
        self.parties = list(parties)
        self.parties_dir = parties_dir
        self.certs = workdir / "certs"
        self.logs = workdir / "logs"
        daemons = ["coordinator", "dealer", *self.parties]
        n = len(self.parties)
        ports = free_ports(
            2 + 2 * n + (len(daemons) if metrics else 0) + ((n + 1) if console else 0),
            block=max_concurrent_jobs,
        )
        consoles = ports[2 + 2 * n + (len(daemons) if metrics else 0) :]
        self.console_addresses = {
            name: f"127.0.0.1:{port}"
            for name, port in zip(["coordinator", *self.parties], consoles, strict=False)
        }
        """Each daemon's web console, when `console` is set; its user is `console_user(name)`."""
        self.health_addresses = {
            p: f"127.0.0.1:{port}" for p, port in zip(self.parties, ports[2 + n :], strict=False)
        }
        """Each party's `grpc.health.v1` endpoint (`health_address`)."""
        self.metrics_addresses = {
            name: f"127.0.0.1:{port}"
            for name, port in zip(daemons, ports[2 + 2 * n :], strict=False)
            if metrics
        }
        """Each daemon's Prometheus endpoint (`metrics_address`), when `metrics` is set."""
        self.log_format = log_format
        """Every process's `--log-format` (text or json), job workers included."""
        self.coordinator_address = f"127.0.0.1:{ports[0]}"
        self.dealer_address = f"127.0.0.1:{ports[1]}"
        self.coordinator_routes: dict[str, str] = {}
        """The address a party dials for the coordinator where it is not `coordinator_address`
        (a relay a test cuts); read when the party starts."""
        self.max_concurrent_jobs = max_concurrent_jobs
        """Every party's; each gets that many consecutive data-plane ports."""
        self.coordinator_settings = dict(coordinator_settings or {})
        """Extra keys of `coordinator.toml` (its limits, its `store`)."""
        self.data_addresses = {
            p: f"127.0.0.1:{port}"
            for p, port in zip(self.parties, ports[2 : 2 + len(self.parties)], strict=True)
        }
        self.data_routes: dict[str, str] = {}
        """The data-plane address a party announces to its peers where it is not the one it
        listens on (a relay that records the traffic); read when the party starts."""
        self.heartbeat_timeout = heartbeat_timeout
        self.log_level = log_level
        self.roster = [*self.parties, *roster_extra]
        """Parties the coordinator accepts; `roster_extra` ones are known but never started."""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.client: Client | None = None

    # --- set-up -----------------------------------------------------------------------------

    def make_certificates(self) -> None:
        """A fresh CA and a certificate for every role, with loopback SANs."""
        certs.init_ca(self.certs)
        loopback = ("127.0.0.1", "localhost")
        certs.issue(self.certs, "coordinator", role="coordinator", sans=loopback)
        certs.issue(self.certs, "dealer", role="dealer", sans=loopback)
        for party in self.parties:
            certs.issue(self.certs, party, role="party", sans=loopback)
        certs.issue(self.certs, CLIENT, role="client")
        for name in self.console_addresses:
            certs.issue(self.certs, console_user(name), role="client")

    def client_tls(self) -> TLSFiles | None:
        """The submitter's certificate; None on a plaintext cluster."""
        if self.insecure:
            return None
        return TLSFiles(
            self.certs / "ca.pem", self.certs / f"{CLIENT}.pem", self.certs / f"{CLIENT}.key"
        )

    def coordinator_config(self) -> Path:
        """Write the coordinator's config."""
        path = self.workdir / "coordinator.toml"
        roster = ", ".join(f'"{p}"' for p in self.roster)
        path.write_text(
            f'listen = "{self.coordinator_address}"\n'
            + ("" if "store" in self.coordinator_settings else 'store = "coordinator.db"\n')
            + f"heartbeat_timeout_s = {self.heartbeat_timeout}\n"
            f"parties = [{roster}]\n"
            + "".join(
                f"{key} = {json.dumps(value)}\n" for key, value in self.coordinator_settings.items()
            )
            + (
                f'console_address = "{self.console_addresses["coordinator"]}"\n'
                f'console_users = ["{console_user("coordinator")}"]\n'
                if "coordinator" in self.console_addresses
                else ""
            )
            + "[tls]\n"
            'ca = "certs/ca.pem"\ncert = "certs/coordinator.pem"\nkey = "certs/coordinator.key"\n'
        )
        return path

    def party_env(self, party: str) -> dict[str, str]:
        """The overrides that move a profile into this cluster."""
        return {
            "MPCML_COORDINATOR": self.coordinator_routes.get(party, self.coordinator_address),
            "MPCML_DEALER": self.dealer_address,
            "MPCML_DATA_ADDRESS": self.data_routes.get(party, self.data_addresses[party]),
            "MPCML_LISTEN": self.data_addresses[party],
            "MPCML_TLS_CA": str(self.certs / "ca.pem"),
            "MPCML_TLS_CERT": str(self.certs / f"{party}.pem"),
            "MPCML_TLS_KEY": str(self.certs / f"{party}.key"),
            "MPCML_STATE_DIR": str(self.workdir / party / "state"),
            "MPCML_RESULTS_DIR": str(self.workdir / party / "results"),
            "MPCML_MAX_CONCURRENT_JOBS": str(self.max_concurrent_jobs),
            "MPCML_HEALTH_ADDRESS": self.health_addresses[party],
            # every party on one machine: one torch thread each, or their workers contend
            "MPCML_TORCH_THREADS": "1",
            **({"MPCML_NETWORK": self.network} if self.network else {}),
            **(
                {
                    "MPCML_CONSOLE_ADDRESS": self.console_addresses[party],
                    "MPCML_CONSOLE_USERS": console_user(party),
                }
                if party in self.console_addresses
                else {}
            ),
        }

    def metrics_url(self, name: str) -> str:
        """Where a daemon ("coordinator", "dealer" or a party) serves its metrics."""
        return f"http://{self.metrics_addresses[name]}/metrics"

    def results(self, party: str) -> Path:
        """Where `party` writes what is revealed to it."""
        return self.workdir / party / "results"

    # --- processes --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MPCML_")}
        env = {**env, logs.ENV: self.log_level, logs.FORMAT_ENV: self.log_format}
        if name in self.metrics_addresses:
            env["MPCML_METRICS_ADDRESS"] = self.metrics_addresses[name]
        if self.insecure:
            args = [*args, "--insecure"]
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "mpcml.cli.main", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**clean, **env, "PYTHONUNBUFFERED": "1"},
            cwd=self.workdir,
            start_new_session=True,  # its job workers share its process group
        )
        log.close()

    def start_coordinator(self) -> None:
        """Start (or restart) the coordinator process."""
        self._spawn("coordinator", ["coordinator", "--config", str(self.coordinator_config())], {})

    def start_dealer(self) -> None:
        """Start (or restart) the dealer process."""
        path = self.workdir / "dealer.toml"
        path.write_text(
            f'listen = "{self.dealer_address}"\nstate_dir = "dealer-state"\n[tls]\n'
            'ca = "certs/ca.pem"\ncert = "certs/dealer.pem"\nkey = "certs/dealer.key"\n'
        )
        self._spawn("dealer", ["dealer", "--config", str(path)], {})

    def start_party(self, party: str) -> None:
        """Start (or restart) one party daemon from its profile."""
        config = self.parties_dir / party / "party.toml"
        self._spawn(party, ["party", "--config", str(config)], self.party_env(party))

    def start(self, timeout: float = 90.0) -> Client:
        """Certificates, coordinator, parties; returns a client once every party registered."""
        for party in self.parties:
            if not (self.parties_dir / party / "party.toml").is_file():
                raise FileNotFoundError(
                    f"no profile {self.parties_dir / party / 'party.toml'}: the demo runs from a "
                    "checkout of mpcml, which holds the example parties in parties/"
                )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.make_certificates()
        self.start_coordinator()
        self.start_dealer()
        for party in self.parties:
            self.start_party(party)
        client = Client(self.coordinator_address, self.client_tls(), insecure=self.insecure)
        self.wait_for_dealer(timeout)
        self.wait_for_parties(client, timeout)
        self.client = client
        return client

    def wait_for_dealer(self, timeout: float) -> None:
        """Until the dealer answers its health check (it loads torch: seconds after its start)."""
        deadline = time.monotonic() + timeout
        with channel(self.dealer_address, self.client_tls(), "dealer") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            while True:
                process = self.processes.get("dealer")
                if process is not None and process.poll() is not None:
                    raise RuntimeError(
                        f"dealer exited with code {process.returncode}:\n{self.tail('dealer')}"
                    )
                try:
                    reply = health.Check(
                        health_pb2.HealthCheckRequest(), timeout=1, wait_for_ready=True
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the dealer did not answer within {timeout:.0f} s:\n{self.tail('dealer')}"
                    )

    def wait_for_parties(self, client: Client, timeout: float) -> None:
        """Until every party is registered; a process that died is reported with its log."""
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with code {process.returncode}:\n{self.tail(name)}"
                    )
            try:
                connected = {p.name for p in client.parties() if p.connected}
            except Exception:
                connected = set()
            if connected >= set(self.parties):
                return
            if time.monotonic() > deadline:
                missing = sorted(set(self.parties) - connected)
                raise TimeoutError(f"parties not registered after {timeout:.0f} s: {missing}")
            time.sleep(0.3)

    def tail(self, name: str, lines: int = 30) -> str:
        """The end of a process's log."""
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def tails(self, lines: int = 15) -> str:
        """The end of the coordinator's and every party's log, for a report of a failure."""
        return "\n".join(
            f"--- {name} log (end) ---\n{self.tail(name, lines)}"
            for name in ["coordinator", *self.parties]
        )

    def stop_process(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process and every worker it started."""
        self._stop_together([name], sig)

    def _stop_together(self, names: list[str], sig: int = signal.SIGTERM) -> None:
        """Signal every process of `names` at once, then wait for them.

        Each daemon takes most of a second to end its servers: one after another added up to
        seconds.
        """
        signalled = []
        for name in names:
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
                signalled.append(process)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in signalled:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # workers left behind by a dead daemon
        for process in signalled:
            _await_group_gone(process.pid, deadline + STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Stop every process this cluster started, the parties first.

        Ctrl-C is held off meanwhile (on the main thread): a second one must not cut the
        clean-up short and leave processes behind.
        """
        masked = threading.current_thread() is threading.main_thread()
        if masked:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._stop_together(list(self.parties))
            self._stop_together(["dealer", "coordinator"])
        finally:
            if masked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
