"""Bad arguments to `mpcml.session` are refused before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

import mpcml

PEERS = ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 0, "world_size": 1, "peers": PEERS[:1], "insecure": True}, "at least 2"),
        ({"rank": 2, "world_size": 2, "peers": PEERS, "insecure": True}, "outside 0..1"),
        ({"rank": 0, "world_size": 3, "peers": PEERS, "insecure": True}, "2 addresses"),
        ({"rank": 0, "world_size": 2, "peers": ["nohost", "x:1"], "insecure": True}, "HOST:PORT"),
        ({"rank": 0, "world_size": 2, "peers": PEERS}, "tls is required"),
        (
            {
                "rank": 0,
                "world_size": 2,
                "peers": PEERS,
                "insecure": True,
                "tls": mpcml.TLSFiles("a", "b", "c"),
            },
            "not both",
        ),
        (
            {
                "rank": 0,
                "world_size": 2,
                "peers": PEERS,
                "insecure": True,
                "peer_names": ["a", "a"],
            },
            "distinct",
        ),
        (
            {
                "rank": 0,
                "world_size": 2,
                "peers": PEERS,
                "tls": mpcml.TLSFiles("/nonexistent/ca.pem", "b", "c"),
            },
            "cannot read the TLS CA certificate '/nonexistent/ca.pem'",
        ),
    ],
)
def test_bad_session_arguments_are_refused_with_the_reason(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message), mpcml.session(**kwargs):
        pass
