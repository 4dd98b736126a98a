"""A party's own policy: who may run jobs on its data, and what they may do with it.

It covers the submitters, the datasets, and whether a job may reveal the party's raw inputs.
The party applies it itself when the coordinator asks, before accepting a job, so the policy
never leaves the party.

```toml
[policy]
submitters = ["analyst"]        # client certificate names allowed to run jobs here ("*": any)
datasets = ["bc-train"]         # datasets jobs may use (default "*": the whole catalogue)
reveal_inputs_to = []           # parties that may receive outputs that are this party's inputs
```
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpcml.graph.ops import SPECS
from mpcml.jobs.spec import recipients
from mpcml.proto.v1 import job_pb2 as jpb

ANY = "*"


@dataclass(frozen=True)
class Policy:
    """What a party allows."""

    submitters: tuple[str, ...] = ()
    datasets: tuple[str, ...] = (ANY,)
    reveal_inputs_to: tuple[str, ...] = ()

    @classmethod
    def from_table(cls, table: Any) -> Policy:
        """From the `[policy]` table of party.toml (absent: nobody may submit)."""
        table = dict(table or {})

        def names(key: str, default: Sequence[str]) -> tuple[str, ...]:
            value = table.get(key, default)
            return tuple([value] if isinstance(value, str) else value)

        return cls(
            names("submitters", ()), names("datasets", (ANY,)), names("reveal_inputs_to", ())
        )


def _computes_nothing(graph: Any) -> bool:
    """True when no node has weights: the output is a fixed function of the inputs alone."""
    return not any(SPECS[n.op].parameters for n in graph.nodes if n.op in SPECS)


@dataclass(frozen=True)
class Verdict:
    """Whether the job may run, and the rule that says no."""

    allowed: bool
    reason: str = ""


def check(policy: Policy, me: str, spec: jpb.JobSpec, submitter: str) -> Verdict:
    """Apply `policy` of party `me` to a job submitted by `submitter`."""
    if ANY not in policy.submitters and submitter not in policy.submitters:
        return Verdict(False, f"policy.submitters does not list {submitter!r}")
    mine = [b for b in [*spec.features, *spec.labels] if b.party == me]
    for binding in mine:
        if ANY not in policy.datasets and binding.dataset not in policy.datasets:
            return Verdict(False, f"policy.datasets does not allow {binding.dataset!r}")
    if any(b.party == me for b in spec.features) and _computes_nothing(spec.graph):
        for who in recipients(spec, jpb.OUTPUT_PREDICTIONS):
            if who != me and who not in policy.reveal_inputs_to:
                return Verdict(
                    False,
                    f"the job would reveal this party's raw inputs (its model has no weights) "
                    f"to {who!r}, and policy.reveal_inputs_to does not list {who!r}",
                )
    return Verdict(True)
