"""Which of a party's own datasets and models an output of a job is computed from.

A party's policy (`policy.py`) decides who may receive an output by what it is computed from,
so the party must know that for every output, also for a model that stayed secret-shared and is
used later (`from_job`): when a train job ends, each party writes which of its datasets and
models trained its shares, on how many rows of each, and where the weights started (the seed,
or private weights and their commitment) in `provenance.json` beside them, and reads it back
when a later job names that model. Only the party's own names are kept; nothing here leaves the
party.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mpcml.party.config import PartyConfig
from mpcml.party.durable import atomic_write
from mpcml.party.policy import SEED, Lineage, Pinned, Record, Source, Start

FILE = "provenance.json"


def record(
    directory: Path, model_sources: Iterable[Source], rows: Mapping[str, int], start: Start
) -> None:
    """Write what trained the model whose shares are in `directory`, and from what start."""
    data: dict[str, Any] = {
        "sources": sorted([kind, name] for kind, name in model_sources),
        "rows": dict(sorted(rows.items())),
        "start": vars(start) if isinstance(start, Pinned) else start,
    }
    atomic_write(directory / FILE, lambda f: f.write(json.dumps(data).encode()))


def read(directory: Path, everything: Iterable[Source]) -> Record:
    """The record `record` wrote; without a readable one, every source and no known start.

    A model of unknown origin is taken to come from every dataset and model of the catalogue,
    on an unknown number of rows, from an unknown start: its outputs then reach only recipients
    that every one of them allows, and no allow-list entry but "*" admits it.
    """
    try:
        data = json.loads((directory / FILE).read_text())
        found = frozenset((str(kind), str(name)) for kind, name in data["sources"])
        rows = {str(k): int(v) for k, v in data.get("rows", {}).items()}
        raw = data.get("start")
        start: Start = (
            Pinned(**{k: str(v) for k, v in raw.items()})
            if isinstance(raw, dict)
            else (SEED if raw == SEED else None)
        )
        return Record(found, rows, start)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Record(frozenset(everything))


def catalogue(config: PartyConfig) -> frozenset[Source]:
    """Every dataset and model of the party's catalogue."""
    return frozenset(
        [("dataset", name) for name in config.datasets]
        + [("model", name) for name in config.models]
    )


def lineage(config: PartyConfig) -> Lineage:
    """The party's own record of each trained model's sources."""
    # Cached: one policy check asks for the same record several times (sources, weights, rows).
    return functools.cache(lambda job_id: read(config.job_state(job_id), catalogue(config)))
