"""Shared fixtures."""

from __future__ import annotations

import mpcml  # noqa: F401  (first: its import hook lets crypten load on current torch)
