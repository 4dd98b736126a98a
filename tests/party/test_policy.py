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
from mpcml.graph.capture import capture
from mpcml.graph.digest import graph_digest
from mpcml.party import provenance
from mpcml.party.config import PartyConfig
from mpcml.party.policy import SEED, Lineage, Pinned, Policy, Record, Source, check, sources
from mpcml.proto.v1 import job_pb2 as jpb

ANALYST = "analyst"
IDENTITY = capture(nn.Sequential(nn.BatchNorm1d(15, momentum=0.0)), (15,))
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


def _never(job_id: str) -> Record:
    raise AssertionError(f"no lineage expected, asked for {job_id}")


def _lineage(*datasets: str, rows: int = 1000, start: object = SEED) -> Lineage:
    """An earlier train job's record: trained on `datasets`, `rows` rows each, from `start`."""
    found: frozenset[Source] = frozenset(("dataset", d) for d in datasets)
    return lambda job_id: Record(found, dict.fromkeys(datasets, rows), start)  # type: ignore[arg-type]


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
    linear = capture(nn.Sequential(nn.Linear(15, 15)), (15,))
    spec = _infer({"bob": "bc-test"}, "alice", graph=linear, weights=FROM_JOB)
    verdict = check(_profile("bob").policy, "bob", spec, ANALYST, _lineage("bc-train"))
    assert not verdict.allowed and "would reach 'alice'" in verdict.reason


def test_a_private_model_goes_only_where_its_owner_allows() -> None:
    digits = capture(models.DigitsMLP(), (64,))
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
    linear = capture(nn.Sequential(nn.Linear(15, 15)), (15,))
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
    approved = _infer({"bob": "sensitive"}, "alice", graph=linear, weights=FROM_JOB)
    verdict = check(policy, "bob", approved, "eve", _lineage("sensitive"))
    assert "policy.for_dataset.sensitive.outputs_to does not name 'alice'" in verdict.reason


def test_a_model_of_unknown_origin_counts_as_trained_on_the_whole_catalogue(
    tmp_path: Path,
) -> None:
    config = _profile("bob")
    unknown = provenance.read(tmp_path, provenance.catalogue(config))
    assert unknown == Record(provenance.catalogue(config))  # no rows, no start known
    pinned = Pinned("sha256:" + "a" * 64, "alice", "m")
    provenance.record(tmp_path, [("dataset", "bc-train")], {"bc-train": 455}, pinned)
    assert provenance.read(tmp_path, ()) == Record(
        frozenset({("dataset", "bc-train")}), {"bc-train": 455}, pinned
    )
    provenance.record(tmp_path, [], {}, SEED)
    assert provenance.read(tmp_path, ()).start == SEED
    (tmp_path / provenance.FILE).write_text("{not json")
    assert ("model", "digits-mlp") in provenance.read(
        tmp_path, provenance.catalogue(config)
    ).sources


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
        ("min_rows = 0", "policy.min_rows must be a whole number >= 1, got 0"),
        ("min_rows = '5'", "policy.min_rows must be a whole number >= 1"),
        ("[policy.for_model.m]\nmin_rows = 5", "policy.for_model.m has no setting 'min_rows'"),
        ("graphs = [{ weights = 'trained' }]", "is not an entry"),
        (
            f"graphs = [{{ graph = '{graph_digest(IDENTITY)}', weights = 'any' }}]",
            "weights must be 'trained' or a table with commitment",
        ),
        (
            f"graphs = [{{ graph = '{graph_digest(IDENTITY)}', weights = {{ commitment = 'x' }}"
            " }]",
            "'x' is not a commitment",
        ),
        (
            f"graphs = [{{ graph = '{graph_digest(IDENTITY)}', weights = {{ party = 'a', "
            f"commitment = 'sha256:{'0' * 64}' }} }}]",
            "names a party and a model together, or neither",
        ),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_setting(toml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _policy(f"[policy]\n{toml}\n")


COMMITMENT = "sha256:" + "c" * 64
AGREED = capture(nn.Sequential(nn.Linear(15, 1)), (15,))


def _agreed_policy(weights: str = "") -> Policy:
    entry = f"{{ graph = '{graph_digest(AGREED)}'{weights} }}"
    return _policy(
        f"""
        [policy]
        submitters = "*"
        outputs_to = {{ predictions = ["alice"] }}
        graphs = [{entry}]
        """
    )


def _pinned(commitment: str = COMMITMENT, owner: str = "alice") -> jpb.WeightSource:
    return jpb.WeightSource(
        private=jpb.PrivateWeights(party=owner, model="m", commitment=commitment)
    )


def test_a_graph_digest_alone_does_not_admit_another_partys_private_weights() -> None:
    """Route 2 of the report: bob admits the agreed graph; alice brings her own weights for
    it, which select bob's column 0. The digest matches, the weights' origin does not."""
    spec = _infer({"bob": "bc-test"}, "alice", AGREED, _pinned())
    verdict = check(_agreed_policy(), "bob", spec, ANALYST, _never)
    assert verdict.reason == (
        f"its dataset 'bc-test' may meet the model {graph_digest(AGREED)} only as policy.graphs "
        f"admits it ({graph_digest(AGREED)} with weights trained from the job's seed), and the "
        f"job brings alice's model 'm' ({COMMITMENT})"
    )
    # The same graph with weights trained from the seed on bob's rows is what the entry means.
    trained = _infer({"bob": "bc-test"}, "alice", AGREED, FROM_JOB)
    assert check(_agreed_policy(), "bob", trained, ANALYST, _lineage("bc-train")).allowed


def test_pinned_weights_are_admitted_only_with_their_commitment() -> None:
    pin = f", weights = {{ party = 'alice', model = 'm', commitment = '{COMMITMENT}' }}"
    policy = _agreed_policy(pin)
    assert check(policy, "bob", _infer({"bob": "x"}, "alice", AGREED, _pinned()), ANALYST, _never)
    changed = _pinned("sha256:" + "d" * 64)
    verdict = check(policy, "bob", _infer({"bob": "x"}, "alice", AGREED, changed), ANALYST, _never)
    assert not verdict.allowed and f"alice's model 'm' (sha256:{'d' * 64})" in verdict.reason
    other_owner = _pinned(owner="carol")
    verdict = check(
        policy, "bob", _infer({"bob": "x"}, "alice", AGREED, other_owner), ANALYST, _never
    )
    assert not verdict.allowed
    # Public weights: pinned by commitment alone, whoever holds them.
    public = _agreed_policy(f", weights = {{ commitment = '{COMMITMENT}' }}")
    spec = _infer({"bob": "x"}, "alice", AGREED, other_owner)
    assert check(public, "bob", spec, ANALYST, _never).allowed
    # Pinned weights are not weights trained from the seed.
    trained = _infer({"bob": "x"}, "alice", AGREED, FROM_JOB)
    assert not check(policy, "bob", trained, ANALYST, _lineage("x")).allowed


def test_trained_weights_must_be_trained_on_the_partys_own_data_from_the_seed() -> None:
    """A model alice trained from the seed on her data alone, with bob holding shares, is
    hers to shape: it does not pass as 'trained' for bob's rows; nor does one fine-tuned from
    unpinned private weights, or of unrecorded origin."""
    spec = _infer({"bob": "x"}, "alice", AGREED, FROM_JOB)
    policy = _agreed_policy()
    refused = check(policy, "bob", spec, ANALYST, _lineage())
    assert "on none of its datasets" in refused.reason
    fine_tuned = _lineage("x", start=Pinned(COMMITMENT, "alice", "m"))
    assert not check(policy, "bob", spec, ANALYST, fine_tuned).allowed
    assert not check(policy, "bob", spec, ANALYST, _lineage("x", start=None)).allowed
    pinned = _agreed_policy(
        f", weights = {{ party = 'alice', model = 'm', commitment = '{COMMITMENT}' }}"
    )
    assert check(pinned, "bob", spec, ANALYST, fine_tuned).allowed
    # bob's own private model passes with any entry of its graph.
    own = _infer({"bob": "x"}, "alice", AGREED, _pinned(owner="bob"))
    assert check(policy, "bob", own, ANALYST, _never).allowed


def _mse_train(batch_size: int, per_round: int, to: str = "alice") -> jpb.JobSpec:
    """Route 1 of the report: alice's labels, bob's features, a loss revealed to alice."""
    spec = jpb.JobSpec(
        task=jpb.TASK_TRAIN,
        split=jpb.SPLIT_VERTICAL,
        features=[jpb.DataBinding(party="bob", dataset="bc-train")],
        labels=[jpb.DataBinding(party="alice", dataset="hundreds")],
        weights=ALICES_MODEL,
        hyper=jpb.HyperParameters(
            epochs=1, batch_size=batch_size, batches_per_round=per_round, loss=jpb.LOSS_MSE
        ),
        reveal=[jpb.Reveal(output=jpb.OUTPUT_METRICS, recipients=[to])],
    )
    spec.graph.CopyFrom(AGREED)
    return spec


def test_a_metric_over_fewer_than_min_rows_rows_is_refused_naming_the_numbers() -> None:
    policy = _policy(
        "[policy]\nsubmitters = '*'\noutputs_to = { metrics = ['alice'] }\nmin_rows = 32"
    )
    rows = ([455], [455])
    verdict = check(policy, "bob", _mse_train(1, 1), ANALYST, _never, rows)
    assert verdict.reason == (
        "metrics computed from its dataset 'bc-train' would reach 'alice' from as few as 1 of "
        "its rows (the loss of round 1 is computed from 1 of its rows (batch_size 1, "
        "batches_per_round 1, 455 rows in all)), and policy.min_rows is 32"
    )
    last = check(policy, "bob", _mse_train(64, 1), ANALYST, _never, rows)
    assert "as few as 7 of its rows (the loss of round 8" in last.reason
    assert check(policy, "bob", _mse_train(64, 0), ANALYST, _never, rows).allowed  # per epoch
    assert check(policy, "bob", _mse_train(1, 65), ANALYST, _never, rows).allowed  # 455 = 7 x 65
    # Revealed to bob alone, nothing of bob's reaches anyone else.
    assert check(policy, "bob", _mse_train(1, 1, to="bob"), ANALYST, _never, rows).allowed
    lower = _policy("[policy]\nsubmitters = '*'\noutputs_to = ['alice']\nmin_rows = 1\n")
    assert check(lower, "bob", _mse_train(1, 1), ANALYST, _never, rows).allowed
    per_dataset = _policy(
        "[policy]\nsubmitters = '*'\noutputs_to = ['alice']\nmin_rows = 1\n"
        "[policy.for_dataset.bc-train]\nmin_rows = 100\n"
    )
    verdict = check(per_dataset, "bob", _mse_train(1, 65), ANALYST, _never, rows)
    assert "policy.for_dataset.bc-train.min_rows is 100" in verdict.reason
    # Without row counts (a re-check at start) the floor is the worker's, on the true counts.
    assert check(policy, "bob", _mse_train(1, 1), ANALYST, _never).allowed


def test_the_floor_covers_evaluations_weights_and_models_trained_earlier() -> None:
    policy = _policy("[policy]\nsubmitters = '*'\noutputs_to = ['alice', 'coordinator']\n")
    evaluate = jpb.JobSpec(
        task=jpb.TASK_EVALUATE,
        features=[jpb.DataBinding(party="alice", dataset="x")],
        labels=[jpb.DataBinding(party="bob", dataset="few")],
        weights=ALICES_MODEL,
        reveal=[jpb.Reveal(output=jpb.OUTPUT_METRICS, recipients=["coordinator"])],
    )
    evaluate.graph.CopyFrom(AGREED)
    verdict = check(policy, "bob", evaluate, ANALYST, _never, ([20], [20]))
    assert "from as few as 20 of its rows (the evaluation's loss and accuracy cover its 20 " in (
        verdict.reason
    )
    train = _mse_train(64, 0)
    del train.reveal[:]
    train.reveal.append(jpb.Reveal(output=jpb.OUTPUT_WEIGHTS, recipients=["alice"]))
    verdict = check(policy, "bob", train, ANALYST, _never, ([20], [20]))
    assert "weights computed from its dataset 'bc-train' would reach 'alice' from as few as 20" in (
        verdict.reason
    )
    # A model trained earlier on 20 of bob's rows carries them into every later output.
    infer = _infer({"alice": "x"}, "alice", AGREED, FROM_JOB)
    verdict = check(policy, "bob", infer, ANALYST, _lineage("few", rows=20), ([100], []))
    assert verdict.reason == (
        f"predictions computed from its dataset 'few' would reach 'alice' through job "
        f"{'t' * 32}'s model, trained on 20 of its rows, and the default min_rows is 32 "
        "(policy.min_rows sets it)"
    )
    assert check(policy, "bob", infer, ANALYST, _lineage("few", rows=500), ([100], [])).allowed


def _vertical_infer(recipient: str, labels: bool = False) -> jpb.JobSpec:
    spec = _infer({"alice": "customers-test", "bob": "customers-test"}, recipient)
    spec.split, spec.align_on = jpb.SPLIT_VERTICAL, "id"
    if labels:
        spec.labels.append(jpb.DataBinding(party="carol", dataset="customers-train-labels"))
    return spec


def test_the_row_ids_reach_a_recipient_holding_no_rows_only_where_allowed() -> None:
    # the example profiles let carol receive alice's ids with the predictions
    lineage = _lineage("customers-test")
    alice = _profile("alice").policy
    assert check(alice, "alice", _vertical_infer("carol"), ANALYST, lineage).allowed
    policy = _policy(
        "[policy]\nsubmitters = ['analyst']\n"
        "outputs_to = { predictions = ['carol', 'dave'], ids = ['carol'] }\n"
    )
    assert check(policy, "alice", _vertical_infer("carol"), ANALYST, lineage).allowed
    verdict = check(policy, "alice", _vertical_infer("dave"), ANALYST, lineage)
    assert verdict.reason == (
        "the row ids of its dataset 'customers-test' would reach 'dave' with the predictions, "
        "and policy.outputs_to does not name 'dave' for ids"
    )
    # bob sends no ids (alice's binding comes first); a recipient holding a binding needs none
    assert check(policy, "bob", _vertical_infer("dave"), ANALYST, lineage).allowed
    no_ids = _policy(
        "[policy]\nsubmitters = ['analyst']\noutputs_to = { predictions = ['carol'] }\n"
    )
    assert check(no_ids, "alice", _vertical_infer("carol", labels=True), ANALYST, lineage).allowed
    assert not check(no_ids, "alice", _vertical_infer("carol"), ANALYST, lineage).allowed
