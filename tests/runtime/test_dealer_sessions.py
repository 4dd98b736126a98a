"""The dealer's sessions on disk: a restarted dealer hands out the same keys and corrections.

The multi-process test (a dealer killed and restarted in the middle of a training job) is in
tests/system/test_recovery.py; these check the files themselves.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from mpcml.dealer.server import DealerConfig, DealerService
from mpcml.dealer.sessions import SECRET_FILE, SUFFIX, SessionFiles
from mpcml.errors import StatusError
from mpcml.proto.v1 import dealer_pb2 as pb

PARTIES = ["alice", "bob", "carol"]


class _Context:
    """What the dealer reads of a call on a plaintext server: no peer certificate."""

    def auth_context(self) -> dict[str, Any]:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _open(service: DealerService, session: str, rank: int, job_id: str = "") -> bytes:
    request = pb.OpenRequest(session_id=session, rank=rank, parties=PARTIES, job_id=job_id)
    return bytes(service.Open(request, _Context()).key)  # type: ignore[arg-type]


def _triple(service: DealerService, session: str, seq: int, binding: bytes = b"") -> bytes:
    request = pb.TupleRequest(
        session_id=session,
        seq=seq,
        kind=pb.ADDITIVE,
        op="mul",
        size0=[4, 3],
        size1=[4, 3],
        binding=binding,
    )
    return bytes(service.Correction(request, _Context()).data)  # type: ignore[arg-type]


def _sessions(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.suffix == SUFFIX]


def test_a_restarted_dealer_serves_the_same_keys_and_corrections(tmp_path: Path) -> None:
    files = SessionFiles(tmp_path / "state")
    before = DealerService(insecure=True, files=files)
    keys = [_open(before, "job1.1", rank) for rank in range(3)]
    correction = _triple(before, "job1.1", 7)
    after = DealerService(insecure=True, files=SessionFiles(tmp_path / "state"))
    assert [_open(after, "job1.1", rank) for rank in range(3)] == keys
    assert _triple(after, "job1.1", 7) == correction
    assert len(set(keys)) == 3


def test_session_files_are_the_dealers_alone_and_named_by_digest(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    service = DealerService(insecure=True, files=SessionFiles(folder))
    _open(service, "../../etc/passwd", 0)
    [path] = _sessions(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((folder / SECRET_FILE).stat().st_mode) == 0o600
    assert "passwd" not in path.name and path.parent == folder


def test_a_closed_session_leaves_no_keys_on_disk(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    service = DealerService(insecure=True, files=SessionFiles(folder))
    for rank in range(3):
        _open(service, "job2.1", rank)
    assert len(_sessions(folder)) == 1
    for _ in PARTIES:  # no certificates here: each close counts as one more party
        service.Close(pb.CloseRequest(session_id="job2.1"), _Context())  # type: ignore[arg-type]
    assert [p.name for p in folder.iterdir()] == [SECRET_FILE]
    with pytest.raises(StatusError, match=r"no dealer session 'job2\.1'"):
        _triple(DealerService(insecure=True, files=SessionFiles(folder)), "job2.1", 0)


def test_sessions_idle_past_the_limit_and_unreadable_files_are_left_out(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    files = SessionFiles(folder)
    files.save("old", PARTIES, [b"k" * 32] * 3)
    files.save("new", PARTIES, [b"n" * 32] * 3)
    (folder / "broken.session").write_text("{not json")
    old = next(p for p in folder.iterdir() if files._path("old") == p)
    hours_ago = time.time() - 7200
    os.utime(old, (hours_ago, hours_ago))
    assert set(files.load(3600.0)) == {"new"}
    assert not old.exists()


def test_the_tuple_limit_is_a_setting_named_in_the_refusal(tmp_path: Path) -> None:
    config = tmp_path / "dealer.toml"
    config.write_text(
        'listen = "127.0.0.1:0"\ninsecure = true\nmax_tuple_elements = 10\nstate_dir = "s"\n'
    )
    loaded = DealerConfig.load(config)
    assert loaded.max_tuple_elements == 10 and loaded.state_dir == tmp_path / "s"
    service = DealerService(insecure=True, max_elements=loaded.max_tuple_elements)
    _open(service, "job3.1", 0)
    with pytest.raises(StatusError, match=r"limit of 10 \(max_tuple_elements in its config\)"):
        _triple(service, "job3.1", 0)


def test_every_run_of_a_job_gets_the_same_keys_from_a_dealer_that_keeps_its_secret(
    tmp_path: Path,
) -> None:
    first = DealerService(insecure=True, files=SessionFiles(tmp_path / "state"))
    keys = [_open(first, "job3", rank, job_id="job3") for rank in range(3)]
    assert len(set(keys)) == 3
    assert [_open(first, "job3.1", rank, job_id="job3") for rank in range(3)] == keys
    restarted = DealerService(insecure=True, files=SessionFiles(tmp_path / "state"))
    assert [_open(restarted, "job3.2", rank, job_id="job3") for rank in range(3)] == keys
    assert _open(restarted, "job4", 0, job_id="job4") != keys[0]
    assert _open(restarted, "plain", 0) != keys[0]  # no job: fresh keys
    forgetful = DealerService(insecure=True)  # no state_dir: a new secret, a new tag
    assert _open(forgetful, "job3.3", 0, job_id="job3") != keys[0]
    assert forgetful.tag != restarted.tag and first.tag == restarted.tag


def test_a_binding_gives_other_tuples_that_are_still_correct(tmp_path: Path) -> None:
    import torch

    from mpcml.runtime import tuples

    service = DealerService(insecure=True)
    keys = [_open(service, "job5", rank, job_id="job5") for rank in range(3)]
    binding = bytes(range(32))
    plain, bound = _triple(service, "job5", 3), _triple(service, "job5", 3, binding)
    assert plain != bound
    request = pb.TupleRequest(
        session_id="job5", seq=3, kind=pb.ADDITIVE, op="mul", size0=[4, 3], size1=[4, 3]
    )
    draws = [tuples.draw(tuples.bound_key(k, binding), r, request) for r, k in enumerate(keys)]
    correction = torch.frombuffer(bytearray(bound), dtype=torch.int64).reshape(4, 3)
    a = draws[0][0] + draws[1][0] + draws[2][0]
    b = draws[0][1] + draws[1][1] + draws[2][1]
    c = correction + draws[1][2] + draws[2][2]
    assert torch.equal(a * b, c)
    with pytest.raises(StatusError, match="a binding has 32 bytes, not 3"):
        _triple(service, "job5", 4, b"abc")
