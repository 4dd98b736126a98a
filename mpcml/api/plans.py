"""Approximation plans as the client writes them: a TOML file, a table, or a name.

A plan file (what `mpcml tune` writes, and what a job file or `Job.*(approximations=...)` can
name) looks like:

```toml
source = "auto"
[nodes._1]
implementation = "poly"
knobs = { degree = 9, bound = 7.5, clip = 0 }
low = -5.9        # the calibrated input range (written by the tuner)
high = 6.0
[ops.Softmax]
implementation = "bounded"
knobs = { shift = 12.0 }
```
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpcml.approx.registry import PlanError
from mpcml.config import read_toml
from mpcml.proto.v1 import job_pb2 as jpb

Approximations = str | Path | Mapping[str, Any] | jpb.ApproximationPlan | None
"""What `Job.*(approximations=...)` takes: "crypten", a plan file, a table as in a plan file,
or a plan; "auto" is resolved by `Job` itself (it needs a calibration set)."""


def _entry(value: Any, where: str) -> jpb.Approximation:
    if not isinstance(value, Mapping):
        raise PlanError(f"{where} must be a table with `implementation` and `knobs`")
    unknown = set(value) - {"implementation", "knobs", "low", "high"}
    if unknown:
        raise PlanError(f"{where} has no setting {sorted(unknown)[0]!r}")
    knobs = value.get("knobs", {})
    if not isinstance(knobs, Mapping):
        raise PlanError(f"{where}.knobs must be a table of numbers")
    entry = jpb.Approximation(implementation=str(value.get("implementation", "crypten")))
    for key, number in knobs.items():
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise PlanError(f"{where}.knobs.{key} must be a number, got {number!r}")
        entry.knobs[str(key)] = float(number)
    if "low" in value or "high" in value:
        entry.calibrated, entry.low, entry.high = True, value["low"], value["high"]
    return entry


def from_table(table: Mapping[str, Any], source: str = "explicit") -> jpb.ApproximationPlan:
    """A plan from a table: `source`, `nodes.NAME` and `ops.OP` entries."""
    unknown = set(table) - {"source", "nodes", "ops"}
    if unknown:
        raise PlanError(
            f"an approximation plan has `source`, `nodes` and `ops`, not {sorted(unknown)[0]!r}"
        )
    plan = jpb.ApproximationPlan(source=str(table.get("source", source)))
    for kind in ("nodes", "ops"):
        entries = table.get(kind, {})
        if not isinstance(entries, Mapping):
            raise PlanError(f"`{kind}` of an approximation plan must be a table")
        for name, value in entries.items():
            getattr(plan, kind)[str(name)].CopyFrom(_entry(value, f"{kind}.{name}"))
    return plan


def read(path: str | Path) -> jpb.ApproximationPlan:
    """A plan file."""
    return from_table(read_toml(Path(path), "the approximation plan", PlanError))


def to_toml(plan: jpb.ApproximationPlan, header: str = "") -> str:
    """A plan as a plan file's text."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines.append(f'source = "{plan.source or "explicit"}"')
    for kind in ("nodes", "ops"):
        for name, entry in sorted(getattr(plan, kind).items()):
            lines.append(f"\n[{kind}.{name}]")
            lines.append(f'implementation = "{entry.implementation or "crypten"}"')
            if entry.knobs:
                knobs = ", ".join(f"{k} = {v:g}" for k, v in sorted(entry.knobs.items()))
                lines.append(f"knobs = {{ {knobs} }}")
            if entry.calibrated:
                lines += [f"low = {entry.low!r}", f"high = {entry.high!r}"]
    return "\n".join(lines) + "\n"


def write(plan: jpb.ApproximationPlan, path: str | Path, command: str = "") -> None:
    """Write a plan file, saying when and by what command it was made."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    Path(path).write_text(to_toml(plan, f"Written by {command or 'mpcml'} on {when}."))


def plan_of(value: Approximations, base: Path | None = None) -> jpb.ApproximationPlan:
    """The plan `value` names (a relative file name is relative to `base`)."""
    if value is None or value == "crypten":
        return jpb.ApproximationPlan()
    if isinstance(value, jpb.ApproximationPlan):
        return value
    if isinstance(value, Mapping):
        return from_table(value)
    if value == "auto":
        raise PlanError('"auto" needs a calibration set: give calibration= (see mpcml.tune)')
    path = Path(value)
    if base is not None and not path.is_absolute():
        path = base / path
    return read(path)
