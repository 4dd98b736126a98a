"""One logging set-up for every mpcml process: the daemons and the job workers they spawn.

The level comes from `MPCML_LOG_LEVEL` (`--log-level` sets it), so a party's job workers log at
the level of the daemon that spawned them. Nothing mpcml logs at any level carries a key, a
share or an input value (tests/security/test_log_secrets.py checks it).
"""

from __future__ import annotations

import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error")
ENV = "MPCML_LOG_LEVEL"


def level_name(value: str | None = None) -> str:
    """The level to use: `value`, else `MPCML_LOG_LEVEL`, else info; a bad one is a ValueError."""
    name = (value or os.environ.get(ENV) or "info").strip().lower()
    if name not in LEVELS:
        raise ValueError(f"log level {name!r} is not one of {', '.join(LEVELS)}")
    return name


def configure(label: str, value: str | None = None) -> None:
    """Log to stderr at the chosen level, each line tagged with `label`; exported to children."""
    name = level_name(value)
    os.environ[ENV] = name
    logging.basicConfig(
        level=name.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [{label}] %(name)s: %(message)s",
        force=True,
    )
