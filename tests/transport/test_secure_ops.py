"""CrypTen's operations between 2 and 3 party processes over gRPC with mutual TLS, compared
with plaintext PyTorch on the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.check import crypten_close
from tests.support.parties import (
    PartyResult,
    party_specs,
    run_session,
    run_specs_on_dealer,
)
from tests.transport import scenarios

pytestmark = pytest.mark.system

OPS = sorted(scenarios.reference(2))


@pytest.fixture(
    scope="module",
    params=[(2, "tfp"), (3, "tfp"), (2, "dealer"), (3, "dealer")],
    ids=["2-parties-tfp", "3-parties-tfp", "2-parties-dealer", "3-parties-dealer"],
)
def secure_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, list[PartyResult]]:
    world_size, provider = request.param
    tmp = tmp_path_factory.mktemp(f"ops{world_size}{provider}")
    if provider == "tfp":
        results = run_session(tmp, world_size, "tests.transport.scenarios:ops")
    else:
        specs = party_specs(tmp, world_size, "tests.transport.scenarios:ops")
        results = run_specs_on_dealer(tmp, specs, timeout=240)
    for r in results:
        assert r.ok, f"rank {r.rank} failed: {r.error_type}: {r.error}\n{r.traceback}"
    return world_size, results


@pytest.mark.parametrize("op", OPS)
def test_secure_op_matches_plaintext_pytorch(
    secure_results: tuple[int, list[PartyResult]], op: str
) -> None:
    world_size, results = secure_results
    expected = scenarios.reference(world_size)[op]
    for r in results:
        ok, detail = crypten_close(r.value[op], expected, scenarios.TOLERANCE.get(op, 0.05))
        assert ok, f"{op} on rank {r.rank} of {world_size}: {detail}"


def test_binary_xor_is_exact(secure_results: tuple[int, list[PartyResult]]) -> None:
    world_size, results = secure_results
    for r in results:
        assert torch.equal(r.value["binary_xor"], scenarios.reference(world_size)["binary_xor"])


def test_every_party_reveals_the_same_values(secure_results: tuple[int, list[PartyResult]]) -> None:
    _, results = secure_results
    for op in OPS:
        for r in results[1:]:
            assert torch.equal(r.value[op], results[0].value[op]), op


def test_communication_stats_count_what_crypten_counts(tmp_path: Path) -> None:
    # docs/architecture.md, measured on stock CrypTen over gloo: 2 parties, 64x64 matmul 1 round and
    # 128 KiB, relu 9 rounds and 1856 KiB.
    results = run_session(tmp_path, 2, "tests.transport.scenarios:comm_stats")
    for r in results:
        assert r.ok, r.traceback
        assert r.value["matmul"].tolist() == [1, 128 * 1024]
        assert r.value["relu"].tolist() == [9, 1856 * 1024]


def test_three_party_comparison_takes_one_adder(tmp_path: Path) -> None:
    # Stock CrypTen's relu at 3 parties on TFP: 16 rounds (two adders in its A2B); the
    # carry-save conversion (mpcml.runtime.compat) makes it 10.
    results = run_session(tmp_path, 3, "tests.transport.scenarios:comm_stats")
    for r in results:
        assert r.ok, r.traceback
        assert r.value["relu"][0] == 10


def test_tensor_over_64_mib_crosses_intact(tmp_path: Path) -> None:
    results = run_session(tmp_path, 3, "tests.transport.scenarios:big_tensor")
    assert all(r.ok for r in results), [r.traceback for r in results]
    sent = results[0].value["digest"]
    for r in results[1:]:
        assert r.value["numel"] == scenarios.BIG_ELEMENTS
        assert r.value["digest"] == sent


def test_objects_travel_schemad_and_unknown_types_are_refused(tmp_path: Path) -> None:
    results = run_session(tmp_path, 2, "tests.transport.scenarios:objects")
    assert all(r.ok for r in results), [r.traceback for r in results]
    for r in results:
        assert r.value["size"] == [3, 4]
        assert r.value["nested"] == repr([1, 2.5, "x", None, (True, b"\x00")])
        assert torch.equal(r.value["tensor"], torch.arange(3))
    assert "objects of type object cannot be sent" in results[0].value["refused"]


def test_plaintext_session_works_only_when_asked_for(tmp_path: Path) -> None:
    results = run_session(tmp_path, 2, "tests.transport.scenarios:comm_stats", tls=False)
    assert all(r.ok for r in results), [r.traceback for r in results]


@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_give_what_torch_distributed_would(tmp_path: Path, world_size: int) -> None:
    results = run_session(tmp_path, world_size, "tests.transport.scenarios:collectives")
    assert all(r.ok for r in results), [r.traceback for r in results]
    ts = scenarios.rank_tensors(world_size)
    others = [t * 3 + 1 for t in ts]
    total, total_others = torch.stack(ts).sum(0), torch.stack(others).sum(0)
    xor = others[0].clone()
    for t in others[1:]:
        xor ^= t
    xor_mine = ts[0].clone()
    for t in ts[1:]:
        xor_mine ^= t
    bigs = scenarios.rank_tensors(world_size, scenarios.BIG_SHAPE)
    big_xor = bigs[0].clone()
    for t in bigs[1:]:
        big_xor ^= t
    for r in results:
        v = r.value
        assert torch.equal(v["all_reduce_sum"], total)
        assert torch.equal(v["all_reduce_big_sum"], torch.stack(bigs).sum(0))
        assert torch.equal(v["all_reduce_big_bxor_batched"][0], big_xor)
        assert torch.equal(v["all_reduce_big_bxor_batched"][1], xor_mine)
        assert torch.equal(v["all_reduce_bxor_batched"][0], xor_mine)
        assert torch.equal(v["all_reduce_bxor_batched"][1], xor)
        assert all(torch.equal(a, b) for a, b in zip(v["all_gather"], ts, strict=True))
        assert torch.equal(v["broadcast_batched"][0], ts[1])
        assert torch.equal(v["broadcast_batched"][1], others[1])
        assert torch.equal(v["scatter"], ts[r.rank] + 7)
        prv = (r.rank - 1) % world_size
        assert torch.equal(v["irecv_first"], ts[prv])
        assert torch.equal(v["irecv_second"], others[prv])
    assert torch.equal(results[0].value["reduce_batched"][0], total)
    assert torch.equal(results[0].value["reduce_batched"][1], total_others)
    assert all(torch.equal(a, b) for a, b in zip(results[-1].value["gather"], ts, strict=True))
