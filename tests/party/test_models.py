"""A private model's commitment pins its content: a re-saved file keeps it, any changed value,
key, dtype or shape changes it, and the owner refuses to load weights that no longer match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpcml.graph.digest import weights_commitment
from mpcml.party.catalogue import DataError, describe_model, load_model


def test_the_commitment_follows_the_content_not_the_file(tmp_path: Path) -> None:
    state = nn.Sequential(nn.Linear(3, 2)).state_dict()
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(state, first)
    torch.save({k: v.clone() for k, v in reversed(list(state.items()))}, second)
    commitment = weights_commitment(state)
    assert describe_model("m", first).commitment == commitment
    assert describe_model("m", second).commitment == commitment
    info = describe_model("m", first)
    assert [(p.name, list(p.shape)) for p in info.parameters] == [
        ("0.bias", [2]),
        ("0.weight", [2, 3]),
    ]
    changed = {k: v.clone() for k, v in state.items()}
    changed["0.bias"][0] += 1e-6
    variants = [
        changed,
        {"0.bias2": state["0.bias"], "0.weight": state["0.weight"]},
        {k: v.double() for k, v in state.items()},
        {"0.bias": state["0.bias"].reshape(1, 2), "0.weight": state["0.weight"]},
    ]
    assert len({commitment, *(weights_commitment(v) for v in variants)}) == 5


def test_weights_changed_after_approval_are_refused_by_their_owner(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    state = {"w": torch.ones(2)}
    torch.save(state, path)
    commitment = weights_commitment(state)
    assert torch.equal(load_model("m", path, commitment)["w"], torch.ones(2))
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(DataError, match="model 'm' no longer matches the commitment sha256:"):
        load_model("m", path, commitment)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match="model 'm': cannot load"):
        load_model("m", path)
    torch.save([torch.ones(1)], path)
    with pytest.raises(DataError, match="is not a state_dict of named tensors"):
        load_model("m", path)
