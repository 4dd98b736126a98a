"""Errors of the data plane.

Never a `RuntimeError`: CrypTen's A2B conversion catches RuntimeError (it means out-of-memory
there) and retries, which would desynchronise the parties.
"""

from __future__ import annotations

from mpcml.errors import MpcmlError


class TransportError(MpcmlError):
    """The data plane failed; the message names the peer and what went wrong.

    A peer is unreachable, died, presented the wrong identity, or sent something that does not
    fit the protocol.
    """


class PeerConnectError(TransportError):
    """A peer could not be reached, or did not reach us, before the connect timeout."""


class PeerIdentityError(TransportError):
    """A peer's certificate is not from our CA or does not carry the name its rank requires."""


class PeerFailedError(TransportError):
    """A peer died, aborted or became unreachable during the session."""


class ProtocolError(TransportError):
    """A peer sent a frame that does not fit the protocol (sizes, order, types)."""
