"""Files a party must never leave half-written: outputs, round checkpoints, job secrets.

A job's secret (`job_secret`) is what every run of the job draws its randomness from.
A checkpoint holds this party's shares of a training job's state at the end of a round (the
model's parameters and the optimiser's momentum). It never leaves the party; only its SHA-256
goes to the coordinator with the round's DONE, and a resume checks the file against that
digest, so a truncated or altered checkpoint is refused rather than silently trained on.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from mpcml.party.catalogue import DataError

_CHECKPOINT = re.compile(r"checkpoint-(\d+)\.pt")
SECRET_FILE = "randomness.key"
"""This party's secret for a job (`job_secret`), beside the job's checkpoints."""
SECRET_BYTES = 32


def atomic_write(path: Path, write: Any) -> None:
    """Write through a temporary file, fsync and rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def checkpoint_path(directory: Path, round: int) -> Path:
    """Where the checkpoint of `round` lives."""
    return directory / f"checkpoint-{round}.pt"


def write_checkpoint(directory: Path, round: int, state: dict[str, Any]) -> str:
    """Write the round's checkpoint atomically; returns its SHA-256 (hex).

    Checkpoints before `round - 1` are deleted: once this party is told to run round r, every
    party has committed round r - 1, so nothing older can be resumed from.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    atomic_write(checkpoint_path(directory, round), lambda f: f.write(data))
    for old in directory.glob("checkpoint-*.pt"):
        match = _CHECKPOINT.fullmatch(old.name)
        if match and int(match.group(1)) < round - 1:
            old.unlink(missing_ok=True)
    return hashlib.sha256(data).hexdigest()


def read_checkpoint(directory: Path, round: int, digest: str, party: str) -> dict[str, Any]:
    """The checkpoint of `round`, if its SHA-256 is `digest`.

    Otherwise a DataError naming the party and the round: the reason the job reports.
    """
    path = checkpoint_path(directory, round)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(
            f"party {party!r} holds no checkpoint of round {round} ({path}); the job cannot resume"
        ) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise DataError(
            f"party {party!r}: its checkpoint of round {round} ({path}) does not match the "
            "digest committed for that round: it is truncated or was altered; the job cannot "
            "resume from it"
        )
    state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return state


def discard_uncommitted(directory: Path, committed_round: int) -> None:
    """Delete what a stopped or killed run left beyond the committed round.

    Temporary files of interrupted writes, and checkpoints of rounds after `committed_round`
    (written by this party, but not by every party): only committed checkpoints stay.
    """
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        match = _CHECKPOINT.fullmatch(path.name)
        stale = int(match.group(1)) > committed_round if match else path.name.startswith(".")
        if stale and path.is_file():
            path.unlink(missing_ok=True)


def job_secret(directory: Path, context: bytes, party: str) -> bytes:
    """The party's secret for the job in `directory`: made at its first run, read at a resume.

    Every run of the job derives its randomness from it (runtime/prg.py), so a resumed run
    draws what the first drew. `context` (the job spec's digest) is kept with it: a secret is
    never used for another job, even one that came under the same id. It stays as long as the
    job's folder: a worker cannot tell that its job is committed (it may finish before another
    party reports the last round), so it never deletes it.
    """
    path = directory / SECRET_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        secret = os.urandom(SECRET_BYTES)
        atomic_write(path, lambda f: f.write(secret + context))  # mkstemp: mode 0600
        return secret
    if data[SECRET_BYTES:] != context:
        raise DataError(
            f"party {party!r}: {path} belongs to another job spec under the same job id; "
            "this party will not reuse its randomness for it"
        )
    return data[:SECRET_BYTES]
