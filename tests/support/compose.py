"""docker/compose.yml without Docker: each service a process in its own network namespace.

What is taken from the compose file, unchanged: each service's command, environment, volumes
(named volumes become folders shared by the services that mount them; bind mounts are the
repository's files), healthcheck command and `depends_on` order. Each service gets its own
network namespace with one address on a virtual bridge, itself in a namespace of its own, and a
hosts file that resolves every service name, as compose's network does. What differs from
Docker: processes run as root from this checkout's virtual environment instead of the image's
user and install; healthchecks are polled every second; published ports are not published
(a client runs in a namespace of its own on the same bridge). Every namespace and link made here
is removed again by `close()`; the addresses exist only inside them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker" / "compose.yml"
SUBNET = "10.213.7"
"""The bridge's /24: addresses that exist only inside the namespaces made here."""


class ComposeError(Exception):
    """A service did not start, exit or become healthy as the compose file says it should."""


def load(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as plain data (YAML anchors and merge keys resolved)."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def netns_available() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"mpcmlprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        mount = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                probe,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "mount",
                "-t",
                "tmpfs",
                "tmpfs",
                "/srv",
            ],
            capture_output=True,
            text=True,
        )
        if mount.returncode != 0:
            return f"cannot make a private mount namespace: {mount.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@dataclass
class Service:
    """One service of the compose file, as this deployment runs it."""

    name: str
    spec: dict[str, Any]
    index: int
    process: subprocess.Popen[bytes] | None = None
    mounts: list[str] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return f"mpcml{os.getpid() % 100000}-{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"


class Deployment:
    """The services of a compose file, started in `depends_on` order, in namespaces."""

    def __init__(self, workdir: Path, compose: Mapping[str, Any] | None = None) -> None:
        self.workdir = workdir
        self.compose = dict(compose or load())
        self.logs = workdir / "logs"
        self.volumes = workdir / "volumes"
        names = [*self.compose["services"], "client"]
        self.services = {
            name: Service(name, dict(self.compose["services"].get(name, {})), i)
            for i, name in enumerate(names)
        }
        self.client = self.services["client"]
        """A namespace on the bridge for the user's commands (what the host is in compose)."""
        self.switch = f"mpcml{os.getpid() % 100000}-sw"
        self.hosts = workdir / "hosts"
        self._made: list[str] = []

    # --- network ----------------------------------------------------------------------------

    def _veth(self, service: Service) -> tuple[str, str]:
        tag = f"{os.getpid() % 100000}{service.index}"
        return f"mb{tag}", f"mc{tag}"  # under 15 characters

    def create_network(self) -> None:
        """The bridge, one namespace per service and the client, and the hosts file."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        _run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for service in self.services.values():
            ns = service.namespace
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            outer, inner = self._veth(service)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", outer, "netns", self.switch)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", outer, "master", "br0", "up")
            _run("ip", "-n", ns, "link", "set", inner, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{service.address}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        lines = ["127.0.0.1 localhost"]
        lines += [f"{s.address} {s.name}" for s in self.services.values()]
        self.hosts.write_text("\n".join(lines) + "\n")

    def set_link(self, name: str, up: bool) -> None:
        """Cut (or restore) a service's only link, at the bridge."""
        outer, _ = self._veth(self.services[name])
        _run("ip", "-n", self.switch, "link", "set", outer, "up" if up else "down")

    # --- processes --------------------------------------------------------------------------

    def _binds(self, service: Service) -> list[str]:
        binds = []
        for volume in service.spec.get("volumes", []):
            source, target, *mode = str(volume).split(":")
            if source.startswith((".", "/")):
                host = (COMPOSE_FILE.parent / source).resolve()
                if not host.exists():
                    raise ComposeError(f"{service.name}: bind mount {source} does not exist")
            else:
                host = self.volumes / source
                host.mkdir(parents=True, exist_ok=True)
            binds.append(":".join([str(host), target, *mode]))
        return binds

    def _argv(self, service: Service, command: Sequence[str]) -> list[str]:
        binds = [f"--bind={b}" for b in self._binds(service)]
        return [
            "ip", "netns", "exec", service.namespace,
            "unshare", "--mount", "--propagation", "private",
            sys.executable, "-m", "tests.support.container", *binds,
            f"--hosts={self.hosts}", "--", *command,
        ]  # fmt: skip

    def _env(self, service: Service) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MPCML_")}
        path = f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}"
        env = {str(k): str(v) for k, v in (service.spec.get("environment") or {}).items()}
        return {**clean, **env, "PATH": path, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}

    def start(self, name: str) -> None:
        """Start (or restart) one service."""
        service = self.services[name]
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            service.process = subprocess.Popen(
                self._argv(service, [str(a) for a in service.spec["command"]]),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(service),
                cwd=REPO,
                start_new_session=True,
            )

    def exec(
        self,
        name: str,
        command: Sequence[str],
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in a service's namespace and volumes (`docker compose exec`)."""
        service = self.services[name]
        return subprocess.run(
            self._argv(service, command),
            capture_output=True,
            text=True,
            env={**self._env(service), **(env or {})},
            cwd=REPO,
            timeout=timeout,
        )

    def healthy(self, name: str) -> bool:
        """The service's own healthcheck, run as compose runs it."""
        test = [str(t) for t in self.services[name].spec["healthcheck"]["test"]]
        if test[0] not in ("CMD", "CMD-SHELL"):
            raise ComposeError(f"{name}: healthcheck {test} is neither CMD nor CMD-SHELL")
        command = test[1:] if test[0] == "CMD" else ["sh", "-c", " ".join(test[1:])]
        return self.exec(name, command, timeout=30).returncode == 0

    def up(self, timeout: float = 120) -> None:
        """Every service, each once its `depends_on` conditions hold."""
        self.create_network()
        started: set[str] = set()
        pending = [n for n in self.services if n != "client"]
        deadline = time.monotonic() + timeout
        while pending:
            progress = False
            for name in list(pending):
                if all(self._condition(dep, cond) for dep, cond in self._depends(name)):
                    self.start(name)
                    started.add(name)
                    pending.remove(name)
                    progress = True
            if time.monotonic() > deadline:
                raise ComposeError(f"not started after {timeout:.0f} s: {pending}\n{self.tails()}")
            if not progress:
                time.sleep(1)
        for name in started:
            while not self._condition(name, "service_healthy"):
                if time.monotonic() > deadline:
                    raise ComposeError(f"{name} not healthy after {timeout:.0f} s\n{self.tails()}")
                time.sleep(1)

    def _depends(self, name: str) -> list[tuple[str, str]]:
        deps = self.services[name].spec.get("depends_on") or {}
        if isinstance(deps, list):
            return [(d, "service_started") for d in deps]
        return [(d, str(c.get("condition", "service_started"))) for d, c in deps.items()]

    def _condition(self, name: str, condition: str) -> bool:
        process = self.services[name].process
        if process is None:
            return False
        code = process.poll()
        if condition == "service_completed_successfully":
            if code not in (None, 0):
                raise ComposeError(f"{name} exited with {code}\n{self.tail(name)}")
            return code == 0
        if code is not None and self.services[name].spec.get("restart") != "no":
            raise ComposeError(f"{name} exited with {code}\n{self.tail(name)}")
        return condition == "service_started" or self.healthy(name)

    def tail(self, name: str, lines: int = 25) -> str:
        """The end of one service's log."""
        path = self.logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return f"--- {name}\n" + "\n".join(text.splitlines()[-lines:])

    def tails(self) -> str:
        """The end of every service's log."""
        return "\n".join(self.tail(n) for n in self.services if n != "client")

    def close(self) -> None:
        """Stop every process, then remove every namespace and link made here."""
        for service in self.services.values():
            process = service.process
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for ns in reversed(self._made):
            # Killing the namespace's processes first: a job worker left behind keeps it alive.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
