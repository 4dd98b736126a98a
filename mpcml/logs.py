"""One logging set-up for every mpcml process: the daemons and their job workers.

The level comes from `MPCML_LOG_LEVEL` (`--log-level` sets it) and the format from
`MPCML_LOG_FORMAT` (`--log-format`), so a party's job workers log like the daemon that started
them. `text` is for people; `json` is one JSON object per line for log collectors, with the job
id, round and party of the event where known (`bind`, `scope`, or `extra=` on the call).
Both formats render the same message: nothing mpcml logs at any level carries a key, a share or
an input value (tests/security/test_log_secrets.py checks it, in both formats).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType, TracebackType

LEVELS = ("debug", "info", "warning", "error")
ENV = "MPCML_LOG_LEVEL"
FORMATS = ("text", "json")
FORMAT_ENV = "MPCML_LOG_FORMAT"
FIELDS = ("job_id", "round", "party")
"""The context a JSON line carries when it is known."""

_bound: dict[str, object] = {}
_scoped: ContextVar[Mapping[str, object]] = ContextVar(
    "mpcml_log_fields", default=MappingProxyType({})
)


def level_name(value: str | None = None) -> str:
    """The level to use: `value`, else `MPCML_LOG_LEVEL`, else info; a bad one is a ValueError."""
    name = (value or os.environ.get(ENV) or "info").strip().lower()
    if name not in LEVELS:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LEVELS)}")
    return name


def format_name(value: str | None = None) -> str:
    """The format to use: `value`, else `MPCML_LOG_FORMAT`, else text; a bad one is a ValueError."""
    name = (value or os.environ.get(FORMAT_ENV) or "text").strip().lower()
    if name not in FORMATS:
        raise ValueError(f"log format {name!r} is not one of {', '.join(FORMATS)}")
    return name


def bind(**fields: object) -> None:
    """Context for every later line of this process (a job worker's job); None removes a key."""
    for key, value in fields.items():
        if value is None:
            _bound.pop(key, None)
        else:
            _bound[key] = value


@contextmanager
def scope(**fields: object) -> Iterator[None]:
    """Context for the lines this thread logs inside the block (one job's in a daemon)."""
    token = _scoped.set({**_scoped.get(), **fields})
    try:
        yield
    finally:
        _scoped.reset(token)


class _Context(logging.Filter):
    """Adds the bound and scoped fields a call did not pass itself with `extra=`."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in {**_bound, **_scoped.get()}.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors.

    It holds time, level, logger, daemon, message, the known context fields, and a traceback
    inside the same line. The message is the one the text format shows, escaped.
    """

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        at = dt.datetime.fromtimestamp(record.created, dt.UTC)
        line: dict[str, object] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "daemon": self.label,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None and value != "":
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def json_line(label: str, level: str, message: str, logger: str = "mpcml") -> str:
    """A JSON log line for what a process says before (or without) `configure`."""
    level_number = logging.getLevelName(level.upper())
    record = logging.LogRecord(logger, level_number, "", 0, message, None, None)
    return JsonFormatter(label).format(record)


def _log_uncaught(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, thread: str = ""
) -> None:
    where = f" in thread {thread}" if thread else ""
    logging.getLogger("mpcml").critical(
        "uncaught %s%s", kind.__name__, where, exc_info=(kind, exc, tb)
    )


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        name = args.thread.name if args.thread is not None else ""
        _log_uncaught(args.exc_type, args.exc_value, args.exc_traceback, name)


def configure(label: str, value: str | None = None, log_format: str | None = None) -> None:
    """Log to stderr at the chosen level and format, each line tagged with `label`.

    Both are exported to child processes (a party's job workers).
    """
    name = level_name(value)
    form = format_name(log_format)
    os.environ[ENV] = name
    os.environ[FORMAT_ENV] = form
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Context())
    if form == "json":
        handler.setFormatter(JsonFormatter(label))
        # Warnings and uncaught exceptions become JSON lines too, not raw text on stderr.
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _thread_hook
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{label}] %(name)s: %(message)s")
        )
    logging.basicConfig(level=name.upper(), handlers=[handler], force=True)
