"""A party's own policy: who may run jobs on its data, and who may receive what comes of it.

Outputs are governed by their recipients, not by the model's shape: any model, however it looks,
can carry a party's raw inputs to whoever receives its outputs (an identity, a layer from a
public seed, a tiny learning rate), so the policy names who may receive each output computed
from this party's datasets and models, and optionally which models may touch them at all. The
party applies it itself, from the spec it is sent, when the coordinator asks (before the job is
accepted) and again when it is told to start the job, so the policy never leaves the party.

```toml
[policy]
submitters = ["analyst"]  # client certificate names allowed to run jobs here ("*": any)
datasets = "*"            # datasets jobs may use (default "*": the whole catalogue)
graphs = "*"              # digests of the models allowed to touch this party's data (default "*")
# Who may receive each output (predictions, weights, metrics) computed from this party's data.
# This party itself always may; nobody else unless named (the default names nobody). A list
# instead of a table names the recipients of every output; "coordinator" (metrics only) makes
# them public job metadata.
outputs_to = { predictions = ["carol"], metrics = ["carol", "coordinator"] }

[policy.for_dataset.bc-test]  # replaces outputs_to and/or graphs for outputs of this dataset
outputs_to = { predictions = ["carol"] }

[policy.for_model.digits-mlp]  # likewise for a private model of the catalogue
outputs_to = { predictions = ["alice"] }
```
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpcml.config import ConfigError
from mpcml.graph.digest import graph_digest
from mpcml.jobs.spec import recipients
from mpcml.proto.v1 import job_pb2 as jpb

ANY = "*"
OUTPUTS = {
    "predictions": jpb.OUTPUT_PREDICTIONS,
    "weights": jpb.OUTPUT_WEIGHTS,
    "metrics": jpb.OUTPUT_METRICS,
}

Source = tuple[str, str]
"""("dataset" or "model", its name in the party's catalogue)."""

Lineage = Callable[[str], frozenset[Source]]
"""The sources of the model a finished train job left, by job id."""


def sources(spec: jpb.JobSpec, me: str, lineage: Lineage) -> dict[int, frozenset[Source]]:
    """For each output (`jpb.Output`), the sources of party `me` it is computed from.

    Predictions depend on the features and the model; weights and metrics also on the labels.
    """
    features = {("dataset", b.dataset) for b in spec.features if b.party == me}
    labels = {("dataset", b.dataset) for b in spec.labels if b.party == me}
    model: set[Source] = set()
    kind = spec.weights.WhichOneof("source")
    if kind == "private" and spec.weights.private.party == me:
        model.add(("model", spec.weights.private.model))
    elif kind == "from_job":
        model |= lineage(spec.weights.from_job)
    every = frozenset(features | labels | model)
    return {
        jpb.OUTPUT_PREDICTIONS: frozenset(features | model),
        jpb.OUTPUT_WEIGHTS: every,
        jpb.OUTPUT_METRICS: every,
    }


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_KEYS = {"submitters", "datasets", "graphs", "outputs_to", "for_dataset", "for_model"}
_RULE_KEYS = {"graphs", "outputs_to"}


def _names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where} must be a name or a list of names, got {value!r}")


@dataclass(frozen=True)
class Rule:
    """For some of the party's data: who may receive each output, and which models may use it."""

    outputs_to: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Recipients by output name; an output not listed reaches nobody but the party."""
    graphs: tuple[str, ...] = (ANY,)
    where: str = "policy"
    """Where the rule is written, for messages (`policy` or `policy.for_dataset.NAME`)."""

    def allows(self, output: str, who: str) -> bool:
        """Whether `who` may receive `output`."""
        named = self.outputs_to.get(output, ())
        return ANY in named or who in named

    def admits(self, digest: str) -> bool:
        """Whether a model of this digest may touch the data."""
        return ANY in self.graphs or digest in self.graphs

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, base: Rule | None = None) -> Rule:
        """A rule from `table`; what it does not say comes from `base`."""
        unknown = sorted(set(table) - _RULE_KEYS)
        if unknown:
            raise ConfigError(
                f"{where} has no setting {unknown[0]!r} (settings: {', '.join(sorted(_RULE_KEYS))})"
            )
        outputs_to = dict(base.outputs_to) if base else {}
        if "outputs_to" in table:
            outputs_to = _outputs_to(table["outputs_to"], f"{where}.outputs_to")
        graphs = base.graphs if base else (ANY,)
        if "graphs" in table:
            graphs = _names(table["graphs"], f"{where}.graphs")
            bad = [g for g in graphs if g != ANY and not _DIGEST.fullmatch(g)]
            if bad:
                raise ConfigError(
                    f"{where}.graphs: {bad[0]!r} is not a model digest (sha256: and 64 hex "
                    "digits, as `mpcml job status` shows it)"
                )
        return cls(outputs_to, graphs, where)


def _outputs_to(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        named = _names(value, where)
        return dict.fromkeys(OUTPUTS, named)
    unknown = sorted(set(value) - set(OUTPUTS))
    if unknown:
        raise ConfigError(
            f"{where}: {unknown[0]!r} is not an output (outputs: {', '.join(OUTPUTS)})"
        )
    return {k: _names(v, f"{where}.{k}") for k, v in value.items()}


@dataclass(frozen=True)
class Policy:
    """What a party allows."""

    submitters: tuple[str, ...] = ()
    datasets: tuple[str, ...] = (ANY,)
    default: Rule = field(default_factory=Rule)
    """The rule for every dataset and model without its own."""
    for_dataset: Mapping[str, Rule] = field(default_factory=dict)
    for_model: Mapping[str, Rule] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Any) -> Policy:
        """From the `[policy]` table of party.toml (absent: nobody may submit)."""
        table = dict(table or {})
        if "reveal_inputs_to" in table:
            raise ConfigError(
                "policy.reveal_inputs_to is gone: name who may receive the outputs computed "
                "from this party's data in policy.outputs_to (docs/security.md)"
            )
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ConfigError(
                f"policy has no setting {unknown[0]!r} (settings: {', '.join(sorted(_KEYS))})"
            )
        default = Rule.from_table({k: v for k, v in table.items() if k in _RULE_KEYS}, "policy")
        per: dict[str, dict[str, Rule]] = {}
        for kind in ("for_dataset", "for_model"):
            entries = table.get(kind, {})
            if not isinstance(entries, dict) or not all(
                isinstance(v, dict) for v in entries.values()
            ):
                raise ConfigError(f"policy.{kind} must hold one table per name")
            per[kind] = {
                name: Rule.from_table(rule, f"policy.{kind}.{name}", base=default)
                for name, rule in entries.items()
            }
        return cls(
            _names(table.get("submitters", []), "policy.submitters"),
            _names(table.get("datasets", ANY), "policy.datasets"),
            default,
            per["for_dataset"],
            per["for_model"],
        )

    def rule(self, source: Source) -> Rule:
        """The rule for one dataset or model of the catalogue."""
        kind, name = source
        own = self.for_dataset if kind == "dataset" else self.for_model
        return own.get(name, self.default)


@dataclass(frozen=True)
class Verdict:
    """Whether the job may run, and the rule that says no."""

    allowed: bool
    reason: str = ""


def check(policy: Policy, me: str, spec: jpb.JobSpec, submitter: str, lineage: Lineage) -> Verdict:
    """Apply `policy` of party `me` to a job submitted by `submitter`.

    `lineage` gives the sources of a model trained earlier (the party's own record).
    """
    if ANY not in policy.submitters and submitter not in policy.submitters:
        return Verdict(False, f"policy.submitters does not list {submitter!r}")
    for binding in [*spec.features, *spec.labels]:
        if binding.party != me:
            continue
        if ANY not in policy.datasets and binding.dataset not in policy.datasets:
            return Verdict(False, f"policy.datasets does not allow {binding.dataset!r}")
    by_output = sources(spec, me, lineage)
    digest = graph_digest(spec.graph)
    for kind, name in sorted(frozenset().union(*by_output.values())):
        rule = policy.rule((kind, name))
        if not rule.admits(digest):
            return Verdict(
                False,
                f"its {kind} {name!r} may meet only the models {rule.where}.graphs lists, and "
                f"the job's model {digest} is not one of them",
            )
    for output_name, output in OUTPUTS.items():
        for who in recipients(spec, output):
            if who == me:
                continue
            for kind, name in sorted(by_output[output]):
                rule = policy.rule((kind, name))
                if not rule.allows(output_name, who):
                    return Verdict(
                        False,
                        f"{output_name} computed from its {kind} {name!r} would reach {who!r}, "
                        f"and {rule.where}.outputs_to does not name {who!r} for {output_name}",
                    )
    return Verdict(True)
