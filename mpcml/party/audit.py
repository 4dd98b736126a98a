"""The party's audit log: every decision about its data, hash-chained, append-only.

One JSON object per line in `<state_dir>/audit.jsonl`. Each entry carries `seq` (from 1),
`prev` (the previous entry's `hash`; 64 zeros for the first) and `hash`, the SHA-256 of the
entry's canonical JSON without `hash`. An edited entry no longer matches its hash, a removed or
reordered one breaks `seq` and `prev`: `verify` names the first entry that does not follow. Lines
cut from the end leave a shorter chain that verifies; the head (`seq` and `hash` of the last
entry, which `mpcml audit show` prints) is what an auditor keeps to detect that
(`mpcml audit verify --head SEQ:HASH`).

The daemon and its job workers (other processes) append to one file: an exclusive `flock` spans
reading the last entry and writing the next, and each entry is flushed to disk before the lock
is let go. Entries hold names, counts, digests and rules, never a value of the data, an id or a
key.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpcml.errors import MpcmlError

FILE = "audit.jsonl"
GENESIS = "0" * 64
KINDS = (
    "job_admitted",  # a vet or a start the policy allowed: submitter, graph, this party's data
    "job_refused",  # the same refused, with the rule
    "job_started",  # a worker started (attempt, resume_round > 0: a resume)
    "model_committed",  # this party's private model entered a job under its commitment
    "psi",  # a private set intersection: this party's rows, the shared rows, the others' sizes
    "revealed",  # a value left the secret domain: kind, recipient, rows it covers, round
    "job_stopped",  # the coordinator stopped the job here (cancel, failure): the reason
    "job_purged",  # the job's checkpoints, kept shares and results were removed here
)


class AuditError(MpcmlError):
    """The audit log cannot be read, or does not verify; the message names the entry."""


def _digest(entry: Mapping[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _last(f: Any) -> dict[str, Any] | None:
    """The last entry of an open log, read backwards from its end."""
    f.seek(0, os.SEEK_END)
    end = f.tell()
    if end == 0:
        return None
    block = b""
    at = end
    while at > 0:
        step = min(4096, at)
        at -= step
        f.seek(at)
        block = f.read(step) + block
        lines = block.rstrip(b"\n").split(b"\n")
        if len(lines) > 1 or at == 0:
            return dict(json.loads(lines[-1]))
    return None


class AuditLog:
    """Appends entries to one party's log."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE

    def append(self, kind: str, job: str = "", **fields: Any) -> dict[str, Any]:
        """Chain one entry onto the log and return it."""
        if kind not in KINDS:
            raise ValueError(f"unknown audit entry kind {kind!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                last = _last(f)
                entry: dict[str, Any] = {
                    "seq": (int(last["seq"]) + 1) if last else 1,
                    "at": round(time.time(), 6),
                    "kind": kind,
                    "job": job,
                    **fields,
                    "prev": str(last["hash"]) if last else GENESIS,
                }
                entry["hash"] = _digest(entry)
                f.seek(0, os.SEEK_END)
                f.write(json.dumps(entry, sort_keys=True).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return entry


def entries(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each line's number (from 1) and entry; a line that is not an entry is an AuditError."""
    try:
        text = path.read_bytes().decode()
    except OSError as exc:
        raise AuditError(f"cannot read the audit log {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AuditError(f"the audit log {path} is not UTF-8 text") from None
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise AuditError(f"line {number} of {path} is not a JSON entry") from None
        if not isinstance(entry, dict):
            raise AuditError(f"line {number} of {path} is not a JSON object")
        yield number, entry


@dataclass(frozen=True)
class Head:
    """The last entry of a verified log."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """From `SEQ:HASH`, as `mpcml audit show` prints it."""
        seq, _, digest = text.partition(":")
        if not seq.isdigit() or len(digest) != 64:
            raise AuditError(f"a head is SEQ:HASH (64 hex digits), not {text!r}")
        return cls(int(seq), digest.lower())


def verify(path: Path, head: Head | None = None) -> Head:
    """Check the whole chain; the first entry that does not follow is named."""
    prev, seq, found = GENESIS, 0, False
    for number, entry in entries(path):
        where = f"entry {entry.get('seq', '?')} (line {number})"
        if entry.get("seq") != seq + 1:
            raise AuditError(
                f"{where}: expected seq {seq + 1}: an entry before it was removed or the entries "
                "were reordered"
            )
        if entry.get("prev") != prev:
            raise AuditError(f"{where}: its prev is not the hash of entry {seq}")
        if entry.get("hash") != _digest(entry):
            raise AuditError(f"{where}: its content does not match its hash: it was edited")
        prev, seq = str(entry["hash"]), seq + 1
        if head is not None and seq == head.seq:
            found = entry["hash"] == head.hash
            if not found:
                raise AuditError(f"{where}: its hash is not the head {head} the auditor kept")
    if head is not None and not found:
        raise AuditError(
            f"the log ends at entry {seq}, before the head {head.seq} the auditor kept: entries "
            "were cut from its end"
        )
    return Head(seq, prev)
