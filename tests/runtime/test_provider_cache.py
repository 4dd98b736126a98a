"""CrypTen's tuple-cache calls get a named refusal from the dealer provider."""

from __future__ import annotations

import pytest

from mpcml.runtime.provider import DealerError, DealerProvider


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("trace", ()),
        ("trace", (False,)),
        ("trace_once", ()),
        ("fill_cache", ()),
        ("save_cache", ("/tmp/x",)),
        ("load_cache", ()),
    ],
)
def test_tuple_cache_calls_are_refused_by_name(call: str, args: tuple[object, ...]) -> None:
    with pytest.raises(DealerError, match="keeps no tuple cache"):
        getattr(DealerProvider(), call)(*args)
