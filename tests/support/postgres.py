"""A throwaway PostgreSQL server for the store tests, from Debian's `postgresql` package.

`initdb` and `postgres` come from PATH or /usr/lib/postgresql/*/bin. PostgreSQL refuses to
run as root, so under root the cluster belongs to the `postgres` user the package creates.
It listens on loopback only, on a free port, trusting local connections: test data only.
`skip_reason()` says why no server can start here; the tests skip with it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _binaries() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    return None


def _user() -> dict[str, Any]:
    """Subprocess arguments that run the server as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def skip_reason() -> str | None:
    """Why no test server can start here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'mpcml[postgres]')"
    if _binaries() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A running server; `database()` makes a fresh, empty database and returns its URL."""

    def __init__(self, port: int) -> None:
        self.port = port

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def database(self) -> str:
        import psycopg

        name = f"t{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """Start a server in a temporary folder; stop it and remove the folder after."""
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(reason)
    binaries = _binaries()
    assert binaries is not None
    user = _user()
    root = Path(tempfile.mkdtemp(prefix="mpcml-pg-"))
    data = root / "data"
    if user:
        os.chown(root, user["user"], user["group"])
    subprocess.run(
        [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
        **user,
    )
    port = _free_port()
    log = (root / "server.log").open("w")
    process = subprocess.Popen(
        [
            str(binaries / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-h",
            "127.0.0.1",
            "-k",
            str(root),
            "-c",
            "fsync=off",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        **user,
    )
    try:
        running = Server(port)
        _wait_ready(running, process, root / "server.log")
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(running: Server, process: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited at start-up: {log.read_text()[-2000:]}")
        try:
            with psycopg.connect(running.url(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
