"""The dealer's open sessions on disk, so that a dealer restarted mid-job serves them again.

A session is its parties and one 256-bit key per party; a tuple's randomness depends only on
those keys and the tuple's number (`runtime/tuples.py`), so the keys are all a restarted dealer
needs. Each open session is one file in the dealer's `state_dir`, written whole (a temporary
file, fsync, rename) before the first key leaves the dealer, readable by the dealer's user only,
and deleted when every party has closed the session or it has gone unused for
`SESSION_IDLE_S`: a closed session's keys are on disk no longer than in memory.

The folder also keeps the dealer's secret (`SECRET_FILE`), from which the keys of a job's
sessions derive (`tuples.job_key`): every run of a job, before and after a restart, gets the
same keys, which a bit-exact resume needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".session"
SECRET_FILE = "dealer.secret"
SECRET_BYTES = 32


class SessionFiles:
    """One file per open session under `folder` (created 0700)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)

    def _path(self, session_id: str) -> Path:
        # Session ids come from the network: the file name is their digest, never the id.
        return self.folder / (hashlib.sha256(session_id.encode()).hexdigest()[:32] + SUFFIX)

    def save(self, session_id: str, parties: list[str], keys: list[bytes]) -> None:
        """Write the session durably (before any of its keys is handed out)."""
        data = {"session_id": session_id, "parties": parties, "keys": [k.hex() for k in keys]}
        self._write(self._path(session_id), json.dumps(data).encode())

    def secret(self) -> bytes:
        """The dealer's secret: made once, durably, and read back at every start."""
        path = self.folder / SECRET_FILE
        with contextlib.suppress(FileNotFoundError):
            secret = path.read_bytes()
            if len(secret) == SECRET_BYTES:
                return secret
            log.warning("%s is not %d bytes: a new secret replaces it", path, SECRET_BYTES)
        secret = os.urandom(SECRET_BYTES)
        self._write(path, secret)
        return secret

    def _write(self, path: Path, data: bytes) -> None:
        """Write `data` whole (temporary file, fsync, rename, fsync of the folder), mode 0600."""
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def remove(self, session_id: str) -> None:
        """Forget the session's keys."""
        with contextlib.suppress(FileNotFoundError):
            self._path(session_id).unlink()

    def load(self, idle_s: float) -> dict[str, tuple[list[str], list[bytes]]]:
        """Every session saved and used within `idle_s` (older files are deleted)."""
        sessions: dict[str, tuple[list[str], list[bytes]]] = {}
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            if time.time() - path.stat().st_mtime > idle_s:
                path.unlink(missing_ok=True)
                continue
            try:
                data = json.loads(path.read_text())
                keys = [bytes.fromhex(k) for k in data["keys"]]
                sessions[str(data["session_id"])] = ([str(p) for p in data["parties"]], keys)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("dealer session file %s is unreadable (%s): left out", path, exc)
        return sessions

    def touch(self, session_id: str) -> None:
        """Mark the session used now (its file's time), so a restart keeps it."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(session_id))
