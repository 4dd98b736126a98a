"""A binding naming several columns its dataset lacks is refused naming all of them."""

from __future__ import annotations

import pytest

from mpcml.jobs.validate import SpecError, _dataset
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import job_pb2 as jpb


def test_every_unknown_column_is_named() -> None:
    alice = cpb.AttachRequest(
        party="alice", datasets=[cpb.DatasetInfo(name="d", columns=["a", "b"], rows=3)]
    )
    binding = jpb.DataBinding(party="alice", dataset="d", columns=["a", "x", "y"])
    with pytest.raises(SpecError, match=r"has no columns 'x', 'y' \(columns: a, b\)"):
        _dataset(binding, {"alice": alice}, "features")
    binding = jpb.DataBinding(party="alice", dataset="d", columns=["x"])
    with pytest.raises(SpecError, match=r"has no column 'x' \(columns"):
        _dataset(binding, {"alice": alice}, "features")
