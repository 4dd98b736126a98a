"""`mpcml.logs`: the text and JSON formats, the context fields, and the daemons' `--log-format`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mpcml import logs


@pytest.fixture()
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`configure` changes process-wide state: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.delenv(logs.ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    yield
    logging.captureWarnings(False)
    logs.bind(party=None, job_id=None, round=None)
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_json_lines_carry_the_context_and_keep_a_traceback_on_one_line(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("alice", "debug", "json")
    assert os.environ[logs.FORMAT_ENV] == "json"  # what the job workers inherit
    log = logging.getLogger("mpcml.test")
    logs.bind(party="alice")
    log.info("two\nlines %s", "in one", extra={"job_id": "j1", "round": 3})
    with logs.scope(job_id="j2"):
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("failed")
    log.debug("no job")
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 3
    first, second, third = lines
    assert first["message"] == "two\nlines in one"
    assert (first["job_id"], first["round"], first["party"]) == ("j1", 3, "alice")
    assert (first["daemon"], first["level"], first["logger"]) == ("alice", "info", "mpcml.test")
    assert first["time"].endswith("Z")
    assert second["job_id"] == "j2" and "round" not in second
    assert second["exception"].startswith("Traceback") and "ValueError: bad" in second["exception"]
    assert "job_id" not in third and third["level"] == "debug"


def test_a_scope_is_per_thread_and_extra_wins_over_it(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("coordinator", "info", "json")
    log = logging.getLogger("mpcml.test")
    with logs.scope(job_id="outer"):
        other = threading.Thread(target=lambda: log.info("elsewhere"))
        other.start()
        other.join()
        log.info("explicit", extra={"job_id": "mine"})
    first, second = _lines(capsys.readouterr().err)
    assert first["message"] == "elsewhere" and "job_id" not in first
    assert second["job_id"] == "mine"


def test_text_stays_the_default_format(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("dealer")
    logging.getLogger("mpcml.test").warning("plain", extra={"job_id": "j"})
    err = capsys.readouterr().err
    assert " WARNING [dealer] mpcml.test: plain" in err
    with pytest.raises(json.JSONDecodeError):
        json.loads(err)


def test_a_bad_format_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="log format 'xml' is not one of text, json"):
        logs.format_name("xml")
    monkeypatch.setenv(logs.FORMAT_ENV, "JSON")
    assert logs.format_name() == "json"


def _daemon(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mpcml.cli.main", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MPCML_")},
    )


@pytest.mark.system
def test_a_daemon_started_with_log_format_json_writes_only_json(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('listen = "127.0.0.1:0"\nstore = "c.db"\n')
    daemon = _daemon("coordinator", "--config", str(config), "--insecure", "--log-format", "json")
    try:
        assert daemon.stderr is not None
        lines = [json.loads(daemon.stderr.readline()) for _ in range(3)]
    finally:
        daemon.terminate()
        daemon.wait(10)
    assert "WARNING: --insecure: plaintext gRPC" in lines[0]["message"]
    assert lines[1]["level"] == "warning" and "PLAINTEXT" in lines[1]["message"]
    assert lines[2]["daemon"] == "coordinator" and "listening on" in lines[2]["message"]


@pytest.mark.system
def test_a_daemons_startup_error_is_a_json_line_too(tmp_path: Path) -> None:
    daemon = _daemon("dealer", "--config", str(tmp_path / "missing.toml"), "--log-format", "json")
    _, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 2
    [line] = err.splitlines()
    record = json.loads(line)
    assert record["level"] == "error" and "cannot read the config" in record["message"]
