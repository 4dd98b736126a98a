"""The audit log's hash chain: appends from several processes chain; an edited, removed or
reordered entry, and entries cut from the end, are found and named."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from mpcml.party import audit
from mpcml.party.audit import AuditError, AuditLog, Head


def _log(tmp_path: Path, n: int = 5) -> Path:
    log = AuditLog(tmp_path)
    for i in range(n):
        log.append("revealed", f"job{i}", what="metrics", to="carol", rows=100 + i, round=i)
    return log.path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def test_entries_chain_from_the_first_to_the_head(tmp_path: Path) -> None:
    path = _log(tmp_path)
    head = audit.verify(path)
    assert head.seq == 5
    last = json.loads(_lines(path)[-1])
    assert head.hash == last["hash"] and last["prev"] == json.loads(_lines(path)[-2])["hash"]
    assert audit.verify(path, Head.parse(str(head))) == head


def test_an_edited_entry_is_named(tmp_path: Path) -> None:
    path = _log(tmp_path)
    lines = _lines(path)
    lines[2] = lines[2].replace('"to": "carol"', '"to": "dave"')
    _write(path, lines)
    with pytest.raises(AuditError, match=r"entry 3 \(line 3\): its content does not match"):
        audit.verify(path)


def test_a_removed_or_reordered_entry_is_named(tmp_path: Path) -> None:
    path = _log(tmp_path)
    lines = _lines(path)
    _write(path, lines[:1] + lines[2:])
    with pytest.raises(AuditError, match=r"entry 3 \(line 2\): expected seq 2"):
        audit.verify(path)
    _write(path, [lines[0], lines[2], lines[1], *lines[3:]])
    with pytest.raises(AuditError, match=r"entry 3 \(line 2\): expected seq 2"):
        audit.verify(path)


def test_a_rewritten_chain_or_a_cut_end_fails_against_the_kept_head(tmp_path: Path) -> None:
    path = _log(tmp_path)
    kept = audit.verify(path)
    _write(path, _lines(path)[:-2])  # still a valid chain, shorter
    assert audit.verify(path).seq == 3
    with pytest.raises(AuditError, match="ends at entry 3, before the head 5"):
        audit.verify(path, kept)
    other = _log(tmp_path / "other")  # a whole new chain of the same length
    with pytest.raises(AuditError, match="is not the head"):
        audit.verify(other, kept)


def _append_many(folder: str, who: int) -> None:
    log = AuditLog(Path(folder))
    for i in range(40):
        log.append("revealed", f"job{who}", what="metrics", to="carol", rows=i, round=i)


def test_appends_from_several_processes_chain(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    assert audit.verify(tmp_path / audit.FILE).seq == 160


def test_the_cli_verifies_and_exports(tmp_path: Path) -> None:
    path = _log(tmp_path)
    cli = [sys.executable, "-m", "mpcml.cli.main", "audit"]
    ok = subprocess.run([*cli, "verify", "--log", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0 and "5 entries" in ok.stdout, ok.stderr
    export = subprocess.run(
        [*cli, "show", "--log", str(path), "--format", "json", "--job", "job2"],
        capture_output=True,
        text=True,
    )
    assert [json.loads(line)["rows"] for line in export.stdout.splitlines()] == [102]
    table = subprocess.run([*cli, "show", "--log", str(path)], capture_output=True, text=True)
    assert "head: 5:" in table.stdout and "revealed" in table.stdout
    lines = _lines(path)
    _write(path, lines[:3] + lines[4:])
    bad = subprocess.run([*cli, "verify", "--log", str(path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "entry 5 (line 4): expected seq 4" in bad.stderr
