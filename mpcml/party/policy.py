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
min_rows = 32             # the fewest of a dataset's rows any revealed aggregate may cover
# Which models may touch this party's data (default "*": any). A digest admits that graph with
# weights trained from the job's seed; a table also pins private or public weights.
graphs = ["sha256:...", { graph = "sha256:...", weights = { party = "alice", model = "m",
          commitment = "sha256:..." } }]
# Who may receive each output (predictions, weights, metrics) computed from this party's data.
# This party itself always may; nobody else unless named (the default names nobody). A list
# instead of a table names the recipients of every output; "coordinator" (metrics only) makes
# them public job metadata.
outputs_to = { predictions = ["carol"], metrics = ["carol", "coordinator"] }

[policy.for_dataset.bc-test]  # replaces outputs_to, graphs and/or min_rows for this dataset
outputs_to = { predictions = ["carol"] }

[policy.for_model.digits-mlp]  # likewise for a private model of the catalogue
outputs_to = { predictions = ["alice"] }
```
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpcml.config import ConfigError
from mpcml.graph.digest import graph_digest
from mpcml.jobs.coverage import Coverage, CoverageError, coverage
from mpcml.jobs.spec import recipients
from mpcml.proto.v1 import job_pb2 as jpb

ANY = "*"
TRAINED = "trained"
"""An allow-list entry's weights: trained in mpcml from the job's seed (the default)."""
SEED = "seed"
"""A model's start: the weights every party derives from the job's seed."""
DEFAULT_MIN_ROWS = 32
"""The fewest of a dataset's rows that a revealed aggregate may cover, unless a policy says."""
OUTPUTS = {
    "predictions": jpb.OUTPUT_PREDICTIONS,
    "weights": jpb.OUTPUT_WEIGHTS,
    "metrics": jpb.OUTPUT_METRICS,
}
IDS = "ids"
"""Not an output of the job but what comes with its predictions: the row ids of a vertical job,
which the first features party sends to a predictions recipient holding none of the rows."""

Source = tuple[str, str]
"""("dataset" or "model", its name in the party's catalogue)."""


@dataclass(frozen=True)
class Pinned:
    """Private weights pinned by their commitment.

    Without a party and a model: public weights, whoever holds them.
    """

    commitment: str
    party: str = ""
    model: str = ""

    def covers(self, other: Pinned) -> bool:
        """Whether weights `other` are the ones this entry pins."""
        return (
            self.commitment == other.commitment
            and self.party in ("", other.party)
            and self.model in ("", other.model)
        )

    def __str__(self) -> str:
        owner = f"{self.party}'s model {self.model!r} " if self.party else "public weights "
        return f"{owner}({self.commitment or 'no commitment'})"


Start = str | Pinned | None
"""Where a model's weights started: SEED, private weights, or None when nobody recorded it."""


@dataclass(frozen=True)
class Record:
    """A party's own record of a model a train job left: what trained it, from what start."""

    sources: frozenset[Source]
    rows: Mapping[str, int] = field(default_factory=dict)
    """Rows of each of the party's datasets that trained it."""
    start: Start = None


Lineage = Callable[[str], Record]
"""The party's record of the model a finished train job left, by job id."""


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
        model |= lineage(spec.weights.from_job).sources
    every = frozenset(features | labels | model)
    return {
        jpb.OUTPUT_PREDICTIONS: frozenset(features | model),
        jpb.OUTPUT_WEIGHTS: every,
        jpb.OUTPUT_METRICS: every,
    }


@dataclass(frozen=True)
class Weights:
    """Where a job's weights come from, as party `me` knows it."""

    start: Start
    earlier_job: str = ""
    """The train job that left them (`from_job`), "" when they start in this job."""
    trained_on_mine: bool = False
    """That earlier job trained them on some of this party's datasets."""

    def __str__(self) -> str:
        if not self.earlier_job:
            return "weights from the job's seed" if self.start == SEED else str(self.start)
        start = str(self.start)
        if self.start == SEED:
            start = "the seed"
        elif self.start is None:
            start = "an unrecorded start"
        mine = "some" if self.trained_on_mine else "none"
        return f"job {self.earlier_job}'s model (trained from {start}, on {mine} of its datasets)"


def weights(spec: jpb.JobSpec, lineage: Lineage) -> Weights:
    """Where the job's weights come from."""
    kind = spec.weights.WhichOneof("source")
    if kind == "private":
        p = spec.weights.private
        return Weights(Pinned(p.commitment, p.party, p.model))
    if kind == "from_job":
        record = lineage(spec.weights.from_job)
        mine = any(k == "dataset" for k, _ in record.sources)
        return Weights(record.start, spec.weights.from_job, mine)
    return Weights(SEED)


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_KEYS = {
    "submitters",
    "datasets",
    "graphs",
    "outputs_to",
    "min_rows",
    "for_dataset",
    "for_model",
    "limits",
}
"""`limits` is read by `mpcml.party.limits`: what a job may cost, not who may run it."""
_RULE_KEYS = {"graphs", "outputs_to", "min_rows"}


def _names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where} must be a name or a list of names, got {value!r}")


def _digest(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise ConfigError(
            f"{where}: {value!r} is not {what} (sha256: and 64 hex digits, as {_SHOWN[what]})"
        )
    return value


_SHOWN = {
    "a model digest": "`mpcml job status` and `mpcml job digest` show it",
    "a commitment": "`mpcml job parties` shows each registered model's",
}


@dataclass(frozen=True)
class Admit:
    """One allow-list entry: a graph, and where its weights may come from."""

    graph: str
    weights: str | Pinned = TRAINED
    """TRAINED, or the private (or public) weights it pins."""

    def admits(self, digest: str, w: Weights, me: str) -> bool:
        """Whether a job with graph `digest` and weights `w` passes this entry for party `me`.

        Weights an earlier job trained pass only if that job trained them on some of this
        party's datasets, from the start the entry names; the party's own private model passes
        with any entry of its graph.
        """
        if self.graph == ANY:
            return True
        if digest != self.graph or (w.earlier_job and not w.trained_on_mine):
            return False
        if isinstance(w.start, Pinned) and w.start.party == me:
            return True
        if self.weights == TRAINED:
            return w.start == SEED
        return (
            isinstance(self.weights, Pinned)
            and isinstance(w.start, Pinned)
            and (self.weights.covers(w.start))
        )

    def __str__(self) -> str:
        if self.graph == ANY:
            return ANY
        what = "weights trained from the job's seed" if self.weights == TRAINED else self.weights
        return f"{self.graph} with {what}"

    @classmethod
    def parse(cls, value: Any, where: str) -> Admit:
        """An entry of `graphs`: "*", a digest, or {graph = ..., weights = ...}."""
        if value == ANY:
            return cls(ANY)
        if isinstance(value, str):
            return cls(_digest(value, where, "a model digest"))
        if not isinstance(value, dict) or set(value) - {"graph", "weights"} or "graph" not in value:
            raise ConfigError(
                f"{where}: {value!r} is not an entry ('*', a digest, or a table with graph and "
                "optionally weights)"
            )
        graph = _digest(value["graph"], f"{where}.graph", "a model digest")
        pinned = value.get("weights", TRAINED)
        if pinned == TRAINED:
            return cls(graph)
        keys = {"commitment", "party", "model"}
        if not isinstance(pinned, dict) or set(pinned) - keys or "commitment" not in pinned:
            raise ConfigError(
                f"{where}.weights must be {TRAINED!r} or a table with commitment (and party and "
                f"model for a party's private model), got {pinned!r}"
            )
        if ("party" in pinned) != ("model" in pinned):
            raise ConfigError(f"{where}.weights names a party and a model together, or neither")
        commitment = _digest(pinned["commitment"], f"{where}.weights.commitment", "a commitment")
        return cls(
            graph, Pinned(commitment, str(pinned.get("party", "")), str(pinned.get("model", "")))
        )


@dataclass(frozen=True)
class Rule:
    """For some of the party's data: who may receive each output, and which models may use it.

    Also the fewest of its rows a revealed aggregate may cover.
    """

    outputs_to: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Recipients by output name; an output not listed reaches nobody but the party."""
    graphs: tuple[Admit, ...] = (Admit(ANY),)
    min_rows: int = DEFAULT_MIN_ROWS
    where: str = "policy"
    """Where the rule is written, for messages (`policy` or `policy.for_dataset.NAME`)."""
    min_rows_from: str = ""
    """Where its `min_rows` is written ("": nowhere, the default)."""

    def floor(self) -> str:
        """The floor and the setting it comes from, for messages."""
        if not self.min_rows_from:
            return f"the default min_rows is {self.min_rows} (policy.min_rows sets it)"
        return f"{self.min_rows_from}.min_rows is {self.min_rows}"

    def allows(self, output: str, who: str) -> bool:
        """Whether `who` may receive `output`."""
        named = self.outputs_to.get(output, ())
        return ANY in named or who in named

    def admits(self, digest: str, w: Weights, me: str) -> bool:
        """Whether a model of this digest with these weights may touch the data."""
        return any(entry.admits(digest, w, me) for entry in self.graphs)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, base: Rule | None = None) -> Rule:
        """A rule from `table`; what it does not say comes from `base`."""
        allowed = _RULE_KEYS - ({"min_rows"} if ".for_model." in where else set())
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise ConfigError(
                f"{where} has no setting {unknown[0]!r} (settings: {', '.join(sorted(allowed))})"
            )
        outputs_to = dict(base.outputs_to) if base else {}
        if "outputs_to" in table:
            outputs_to = _outputs_to(table["outputs_to"], f"{where}.outputs_to")
        graphs = base.graphs if base else (Admit(ANY),)
        if "graphs" in table:
            entries = table["graphs"]
            entries = entries if isinstance(entries, list) else [entries]
            graphs = tuple(Admit.parse(e, f"{where}.graphs[{i}]") for i, e in enumerate(entries))
        min_rows = base.min_rows if base else DEFAULT_MIN_ROWS
        min_rows_from = base.min_rows_from if base else ""
        if "min_rows" in table:
            min_rows_from = where
            min_rows = table["min_rows"]
            if not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 1:
                raise ConfigError(f"{where}.min_rows must be a whole number >= 1, got {min_rows!r}")
        return cls(outputs_to, graphs, min_rows, where, min_rows_from)


def _outputs_to(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        named = _names(value, where)
        return dict.fromkeys([*OUTPUTS, IDS], named)
    unknown = sorted(set(value) - {*OUTPUTS, IDS})
    if unknown:
        raise ConfigError(
            f"{where}: {unknown[0]!r} is not an output (outputs: {', '.join([*OUTPUTS, IDS])})"
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


Rows = tuple[Sequence[int], Sequence[int]]
"""The rows of each features binding and of each labels binding, in binding order."""


def check(
    policy: Policy,
    me: str,
    spec: jpb.JobSpec,
    submitter: str,
    lineage: Lineage,
    rows: Rows | None = None,
) -> Verdict:
    """Apply `policy` of party `me` to a job submitted by `submitter`.

    `lineage` gives the party's own record of a model trained earlier. `rows` are the rows of
    every binding (the coordinator's registrations when vetting, the shared inputs in the
    worker); without them the floor under revealed aggregates is left to the worker.
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
    origin = weights(spec, lineage)
    for kind, name in sorted(frozenset().union(*by_output.values())):
        rule = policy.rule((kind, name))
        if rule.admits(digest, origin, me):
            continue
        listed = [str(a) for a in rule.graphs if a.graph == digest]
        if not listed:
            return Verdict(
                False,
                f"its {kind} {name!r} may meet only the models {rule.where}.graphs lists, and "
                f"the job's model {digest} is not one of them",
            )
        return Verdict(
            False,
            f"its {kind} {name!r} may meet the model {digest} only as {rule.where}.graphs "
            f"admits it ({'; '.join(listed)}), and the job brings {origin}",
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
    ids = _ids_rule(policy, me, spec)
    if not ids.allowed:
        return ids
    return _floor(policy, me, spec, lineage, by_output, rows)


def _ids_rule(policy: Policy, me: str, spec: jpb.JobSpec) -> Verdict:
    """The row ids a vertical job's predictions carry reach a non-holder only if allowed.

    A recipient holding a binding took part in the intersection and knows the shared ids; any
    other recipient gets them from the first features party, whose dataset's rule decides.
    """
    if not spec.align_on or spec.split != jpb.SPLIT_VERTICAL or not spec.features:
        return Verdict(True)
    source = spec.features[0]
    if source.party != me:
        return Verdict(True)
    holders = {b.party for b in [*spec.features, *spec.labels]}
    rule = policy.rule(("dataset", source.dataset))
    for who in recipients(spec, jpb.OUTPUT_PREDICTIONS):
        if who not in holders and not rule.allows(IDS, who):
            return Verdict(
                False,
                f"the row ids of its dataset {source.dataset!r} would reach {who!r} with the "
                f"predictions, and {rule.where}.outputs_to does not name {who!r} for ids",
            )
    return Verdict(True)


def _floor(
    policy: Policy,
    me: str,
    spec: jpb.JobSpec,
    lineage: Lineage,
    by_output: Mapping[int, frozenset[Source]],
    rows: Rows | None,
) -> Verdict:
    """The floor: no value revealed to another computed from fewer than `min_rows` rows."""
    bound = {b.dataset for b in [*spec.features, *spec.labels] if b.party == me}
    covered: dict[int, dict[str, Coverage]] = {}
    if rows is not None:
        try:
            found = coverage(spec, *rows)
        except CoverageError as exc:
            return Verdict(False, f"the row counts it was sent do not fit the job: {exc}")
        for (party, dataset), outputs in found.items():
            if party == me:
                for output, c in outputs.items():
                    mine = covered.setdefault(output, {})
                    if dataset not in mine or c.rows < mine[dataset].rows:
                        mine[dataset] = c
    earlier = spec.weights.from_job if spec.weights.WhichOneof("source") == "from_job" else ""
    record = lineage(earlier) if earlier else None
    for output_name, output in OUTPUTS.items():
        others = [w for w in recipients(spec, output) if w != me]
        if not others:
            continue
        for kind, name in sorted(by_output[output]):
            if kind != "dataset":
                continue
            rule = policy.rule((kind, name))
            if name in bound and name in covered.get(output, {}):
                c = covered[output][name]
                if c.rows < rule.min_rows:
                    return Verdict(
                        False,
                        f"{output_name} computed from its dataset {name!r} would reach "
                        f"{others[0]!r} from as few as {c.rows} of its rows ({c.why}), and "
                        f"{rule.floor()}",
                    )
            if record is not None and (kind, name) in record.sources:
                trained = record.rows.get(name, 0)
                if trained < rule.min_rows:
                    return Verdict(
                        False,
                        f"{output_name} computed from its dataset {name!r} would reach "
                        f"{others[0]!r} through job {earlier}'s model, trained on "
                        f"{trained or 'an unrecorded number'} of its rows, and {rule.floor()}",
                    )
    return Verdict(True)
