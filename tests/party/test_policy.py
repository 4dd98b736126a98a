"""A party's policy decides by recipient and by what an output is computed from, never by the
model's shape: the routes that carried bob's raw inputs to alice are refused, naming the party's
dataset, the output and the recipient. tests/system/test_security.py runs the same routes
through the live daemons."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from torch import nn

from mpcml.config import ConfigError
from mpcml.demo import models
from mpcml.demo.cluster import PARTIES_DIR
from mpcml.graph.digest import graph_digest
from mpcml.graph.trace import trace
from mpcml.party import provenance
from mpcml.party.config import PartyConfig
from mpcml.party.policy import Lineage, Policy, Source, check, sources
from mpcml.proto.v1 import job_pb2 as jpb

ANALYST = "analyst"
IDENTITY = trace(nn.Sequential(nn.BatchNorm1d(15, momentum=0.0)))
FROM_JOB = jpb.WeightSource(from_job="t" * 32)
ALICES_MODEL = jpb.WeightSource(private=jpb.PrivateWeights(party="alice", model="m"))


def _policy(toml: str) -> Policy:
    return Policy.from_table(tomllib.loads(toml).get("policy"))


def _profile(party: str) -> PartyConfig:
    return PartyConfig.load(PARTIES_DIR / party / "party.toml")


def _infer(
    features: dict[str, str],
    recipient: str,
    graph: object = IDENTITY,
    weights: jpb.WeightSource | None = None,
) -> jpb.JobSpec:
    spec = jpb.JobSpec(
        task=jpb.TASK_INFER,
        features=[jpb.DataBinding(party=p, dataset=d) for p, d in features.items()],
        reveal=[jpb.Reveal(output=jpb.OUTPUT_PREDICTIONS, recipients=[recipient])],
        weights=weights or ALICES_MODEL,
    )
    spec.graph.CopyFrom(graph)  # type: ignore[arg-type]
    return spec


def _never(job_id: str) -> frozenset[Source]:
    raise AssertionError(f"no lineage expected, asked for {job_id}")


def _lineage(*datasets: str) -> Lineage:
    return lambda job_id: frozenset(("dataset", d) for d in datasets)


def test_the_example_profiles_name_their_recipients() -> None:
    bob = _profile("bob").policy
    assert bob.default.outputs_to["predictions"] == ("carol",)
    assert bob.rule(("model", "digits-mlp")).outputs_to["predictions"] == ("alice",)
    assert _profile("carol").policy.default.outputs_to == {"metrics": ("coordinator",)}


def test_a_near_identity_model_on_bobs_rows_cannot_reveal_them_to_alice() -> None:
    """The reported attack: BatchNorm at init trained with a tiny learning rate (from_job),
    then run on bob's test rows with the predictions revealed to alice."""
    spec = _infer({"bob": "bc-test"}, "alice", weights=FROM_JOB)
    verdict = check(_profile("bob").policy, "bob", spec, ANALYST, _lineage("bc-train"))
    assert not verdict.allowed
    assert verdict.reason == (
        "predictions computed from its dataset 'bc-test' would reach 'alice', and "
        "policy.outputs_to does not name 'alice' for predictions"
    )


def test_the_model_a_train_job_left_carries_its_training_data_to_the_recipient() -> None:
    """Bob binds nothing in this job; the model it holds shares of was trained on bob's rows."""
    spec = _infer({"alice": "bc-test"}, "alice", weights=FROM_JOB)
    policy = _profile("bob").policy
    verdict = check(policy, "bob", spec, ANALYST, _lineage("bc-train"))
    assert not verdict.allowed
    assert "computed from its dataset 'bc-train' would reach 'alice'" in verdict.reason
    assert check(policy, "bob", spec, ANALYST, _lineage()).allowed  # trained on nothing of bob's


def test_a_public_seed_linear_layer_is_refused_like_any_other_model() -> None:
    linear = trace(nn.Sequential(nn.Linear(15, 15)))
    spec = _infer({"bob": "bc-test"}, "alice", graph=linear, weights=FROM_JOB)
    verdict = check(_profile("bob").policy, "bob", spec, ANALYST, _lineage("bc-train"))
    assert not verdict.allowed and "would reach 'alice'" in verdict.reason


def test_a_private_model_goes_only_where_its_owner_allows() -> None:
    digits = trace(models.DigitsMLP())
    private = jpb.WeightSource(private=jpb.PrivateWeights(party="bob", model="digits-mlp"))
    policy = _profile("bob").policy
    to_alice = _infer({"alice": "digits-test"}, "alice", digits, private)
    assert check(policy, "bob", to_alice, ANALYST, _never).allowed
    to_carol = _infer({"alice": "digits-test"}, "carol", digits, private)
    verdict = check(policy, "bob", to_carol, ANALYST, _never)
    assert verdict.reason == (
        "predictions computed from its model 'digits-mlp' would reach 'carol', and "
        "policy.for_model.digits-mlp.outputs_to does not name 'carol' for predictions"
    )


def test_the_party_itself_always_receives_and_labels_do_not_flow_into_predictions() -> None:
    policy = _policy("[policy]\nsubmitters = ['analyst']\n")  # outputs_to names nobody
    assert check(policy, "bob", _infer({"bob": "bc-test"}, "bob"), ANALYST, _never).allowed
    evaluate = jpb.JobSpec(
        task=jpb.TASK_EVALUATE,
        features=[jpb.DataBinding(party="alice", dataset="bc-test")],
        labels=[jpb.DataBinding(party="carol", dataset="bc-test-labels")],
        reveal=[jpb.Reveal(output=jpb.OUTPUT_PREDICTIONS, recipients=["alice"])],
        weights=jpb.WeightSource(private=jpb.PrivateWeights(party="alice", model="m")),
    )
    assert check(policy, "carol", evaluate, ANALYST, _never).allowed
    evaluate.reveal.append(jpb.Reveal(output=jpb.OUTPUT_METRICS, recipients=["alice"]))
    verdict = check(policy, "carol", evaluate, ANALYST, _never)
    assert "metrics computed from its dataset 'bc-test-labels' would reach 'alice'" in (
        verdict.reason
    )


def test_per_dataset_rules_and_the_graph_allow_list() -> None:
    linear = trace(nn.Sequential(nn.Linear(15, 15)))
    policy = _policy(
        f"""
        [policy]
        submitters = "*"
        outputs_to = ["alice"]
        [policy.for_dataset.sensitive]
        outputs_to = {{ metrics = ["coordinator"] }}
        graphs = ["{graph_digest(linear)}"]
        """
    )
    assert check(policy, "bob", _infer({"bob": "bc-test"}, "alice"), "eve", _never).allowed
    refused = check(policy, "bob", _infer({"bob": "sensitive"}, "alice"), "eve", _never)
    assert refused.reason == (
        f"its dataset 'sensitive' may meet only the models policy.for_dataset.sensitive.graphs "
        f"lists, and the job's model {graph_digest(IDENTITY)} is not one of them"
    )
    approved = _infer({"bob": "sensitive"}, "alice", graph=linear)
    verdict = check(policy, "bob", approved, "eve", _never)
    assert "policy.for_dataset.sensitive.outputs_to does not name 'alice'" in verdict.reason


def test_a_model_of_unknown_origin_counts_as_trained_on_the_whole_catalogue(
    tmp_path: Path,
) -> None:
    config = _profile("bob")
    assert provenance.read(tmp_path, provenance.catalogue(config)) == provenance.catalogue(config)
    provenance.record(tmp_path, [("dataset", "bc-train")])
    assert provenance.read(tmp_path, ()) == {("dataset", "bc-train")}
    (tmp_path / provenance.FILE).write_text("{not json")
    assert ("model", "digits-mlp") in provenance.read(tmp_path, provenance.catalogue(config))


def test_sources_by_output() -> None:
    spec = jpb.JobSpec(
        task=jpb.TASK_TRAIN,
        features=[jpb.DataBinding(party="bob", dataset="x")],
        labels=[jpb.DataBinding(party="bob", dataset="y")],
        weights=jpb.WeightSource(from_job="j"),
    )
    out = sources(spec, "bob", _lineage("old"))
    assert out[jpb.OUTPUT_PREDICTIONS] == {("dataset", "x"), ("dataset", "old")}
    assert out[jpb.OUTPUT_WEIGHTS] == {("dataset", d) for d in ("x", "y", "old")}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("reveal_inputs_to = []", "policy.reveal_inputs_to is gone"),
        ("reveal_to = []", "policy has no setting 'reveal_to'"),
        ("outputs_to = { logits = ['a'] }", "'logits' is not an output"),
        ("graphs = ['abc']", "'abc' is not a model digest"),
        ("outputs_to = 3", "must be a name or a list of names"),
        ("[policy.for_dataset.x]\ncolumns = []", "policy.for_dataset.x has no setting 'columns'"),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_setting(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _policy(f"[policy]\n{toml}\n")
