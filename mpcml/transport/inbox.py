"""Messages received from one peer, handed out in the order the computation asks for them.

CrypTen's calls are SPMD, so the n-th receive from a peer matches the n-th message that peer
sent us. Each receive takes a ticket when it is *posted* (an `irecv` posts before it waits), so
that waits in another order still get the right messages. On an emulated network
(`shaping.EmulatedLink`), a message is handed out no earlier than its link would have delivered it.
"""

from __future__ import annotations

import threading
import time

from mpcml.transport.errors import PeerFailedError, TransportError
from mpcml.transport.framing import Message
from mpcml.transport.shaping import EmulatedLink

OBJECT_BYTES = 64
"""What a schema'd object (not a tensor) counts for on an emulated link: they are small."""


class Inbox:
    """Arrived messages of one peer, plus that peer's end-of-session state."""

    def __init__(self, peer: str, link: EmulatedLink | None = None) -> None:
        self._peer = peer
        self._link = link
        self._cond = threading.Condition()
        self._messages: dict[int, Message] = {}
        self._release: dict[int, float] = {}
        self._arrived = 0
        self._tickets = 0
        self._closed = False
        self._failure: TransportError | None = None

    def put(self, message: Message) -> None:
        """Store the next message of the stream."""
        with self._cond:
            if self._link is not None:
                size = message.tensor.nbytes if message.tensor is not None else OBJECT_BYTES
                self._release[self._arrived] = self._link.release(size)
            self._messages[self._arrived] = message
            self._arrived += 1
            self._cond.notify_all()

    def close(self) -> None:
        """The peer ended its stream cleanly: nothing more will arrive."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: TransportError) -> None:
        """Wake every waiter with `error` (the first failure wins)."""
        with self._cond:
            if self._failure is None:
                self._failure = error
            self._cond.notify_all()

    def ticket(self) -> int:
        """Reserve the next message for a receive being posted now."""
        with self._cond:
            ticket = self._tickets
            self._tickets += 1
            return ticket

    def take(self, ticket: int) -> Message:
        """Block until the message for `ticket` has arrived, or the session has failed.

        Messages that arrived before a failure are still handed out.
        """
        with self._cond:
            while True:
                wait = self._release.get(ticket, 0.0) - time.monotonic()
                if ticket in self._messages and wait > 0 and self._failure is None:
                    self._cond.wait(wait)  # still on the emulated link
                    continue
                message = self._messages.pop(ticket, None)
                if message is not None:
                    self._release.pop(ticket, None)
                    return message
                if self._failure is not None:
                    raise type(self._failure)(*self._failure.args)
                if self._closed and ticket >= self._arrived:
                    raise PeerFailedError(
                        f"{self._peer} closed its session while this party still expected "
                        f"message {ticket} from it: the parties' computations diverged"
                    )
                self._cond.wait()
