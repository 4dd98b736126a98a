"""Round checkpoints on a party's own disk: digests, pruning, and leftovers of killed writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpcml.party.catalogue import DataError
from mpcml.party.durable import (
    checkpoint_path,
    discard_uncommitted,
    read_checkpoint,
    write_checkpoint,
)


def test_a_checkpoint_reads_back_only_with_its_digest(tmp_path: Path) -> None:
    shares = {"w": torch.arange(6).reshape(2, 3)}
    digest = write_checkpoint(tmp_path, 1, {"round": 1, "shares": shares})
    back = read_checkpoint(tmp_path, 1, digest, "alice")
    assert torch.equal(back["shares"]["w"], shares["w"])
    with pytest.raises(DataError, match=r"party 'alice': its checkpoint of round 1 .* does not"):
        read_checkpoint(tmp_path, 1, "0" * 64, "alice")
    with pytest.raises(DataError, match="party 'alice' holds no checkpoint of round 2"):
        read_checkpoint(tmp_path, 2, digest, "alice")


def test_only_the_last_two_rounds_are_kept(tmp_path: Path) -> None:
    for round in range(1, 5):
        write_checkpoint(tmp_path, round, {"round": round})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3.pt", "checkpoint-4.pt"]


def test_leftovers_and_uncommitted_rounds_are_removed_and_committed_checkpoints_kept(
    tmp_path: Path,
) -> None:
    write_checkpoint(tmp_path, 1, {"round": 1})
    write_checkpoint(tmp_path, 2, {"round": 2})  # this party's, not committed by every party
    (tmp_path / ".checkpoint-3.pt.abc123").write_bytes(b"half")
    discard_uncommitted(tmp_path, 1)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_path(tmp_path, 1).name]
    discard_uncommitted(tmp_path / "missing", 0)  # a job that never wrote one


def test_a_jobs_secret_is_made_once_kept_private_and_refused_for_another_spec(
    tmp_path: Path,
) -> None:
    import stat

    from mpcml.party.durable import SECRET_FILE, job_secret

    secret = job_secret(tmp_path / "job", b"spec-1", "alice")
    assert len(secret) == 32
    assert job_secret(tmp_path / "job", b"spec-1", "alice") == secret
    assert stat.S_IMODE((tmp_path / "job" / SECRET_FILE).stat().st_mode) == 0o600
    assert job_secret(tmp_path / "other", b"spec-1", "alice") != secret
    with pytest.raises(DataError, match="belongs to another job spec under the same job id"):
        job_secret(tmp_path / "job", b"spec-2", "alice")
