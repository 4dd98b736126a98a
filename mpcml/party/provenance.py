"""Which of a party's own datasets and models an output of a job is computed from.

A party's policy (`policy.py`) decides who may receive an output by what it is computed from,
so the party must know that for every output, also for a model that stayed secret-shared and is
used later (`from_job`): when a train job ends, each party writes which of its datasets and
models trained its shares (`provenance.json` beside them), and reads it back when a later job
names that model. Only the party's own names are kept; nothing here leaves the party.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from mpcml.party.config import PartyConfig
from mpcml.party.durable import atomic_write
from mpcml.party.policy import Lineage, Source

FILE = "provenance.json"


def record(directory: Path, model_sources: Iterable[Source]) -> None:
    """Write which of this party's sources trained the model whose shares are in `directory`."""
    data = {"sources": sorted([kind, name] for kind, name in model_sources)}
    atomic_write(directory / FILE, lambda f: f.write(json.dumps(data).encode()))


def read(directory: Path, everything: Iterable[Source]) -> frozenset[Source]:
    """The sources `record` wrote; `everything` when there is no readable record.

    A model of unknown origin is taken to come from every dataset and model of the catalogue:
    its outputs then reach only recipients that every one of them allows.
    """
    try:
        data = json.loads((directory / FILE).read_text())
        return frozenset((str(kind), str(name)) for kind, name in data["sources"])
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset(everything)


def catalogue(config: PartyConfig) -> frozenset[Source]:
    """Every dataset and model of the party's catalogue."""
    return frozenset(
        [("dataset", name) for name in config.datasets]
        + [("model", name) for name in config.models]
    )


def lineage(config: PartyConfig) -> Lineage:
    """The party's own record of each trained model's sources."""
    return lambda job_id: read(config.job_state(job_id), catalogue(config))
