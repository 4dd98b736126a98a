"""`mpcml dealer`: serves correlated randomness to the parties of each job over mutual TLS.

Per job session it draws one 256-bit key per party from `os.urandom` and hands each party its
own key (`Open`). For every tuple rank 0 asks for, it draws every party's shares of it
from their keys (`runtime/tuples.py`), computes the true tuple and answers with rank 0's
correcting share only. With a `state_dir`, open sessions are kept on disk
(`dealer/sessions.py`): a dealer restarted mid-job serves them again, and the parties, which
wait `RESTART_WAIT_S` for it, ask again. It holds every key of a session, so it must not
collude with any party (the semi-honest, non-colluding dealer of docs/security.md); it never
sees an input or an output.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from mpcml import config as cfg
from mpcml import metrics
from mpcml.dealer.metrics import DealerMetrics
from mpcml.dealer.sessions import SessionFiles
from mpcml.errors import StatusError
from mpcml.proto.v1 import dealer_pb2 as pb
from mpcml.proto.v1 import dealer_pb2_grpc as pb_grpc
from mpcml.runtime import tuples
from mpcml.runtime.prg import KEY_BYTES
from mpcml.runtime.tuples import CHUNK_BYTES, MAX_MESSAGE_BYTES
from mpcml.transport.interceptors import RequestGuard
from mpcml.transport.serving import caller, start_server
from mpcml.transport.tls import (
    DEALER_ROLE,
    PARTY_ROLE,
    TLSFiles,
    caller_identity,
    check_certificate,
)

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
"""Default `max_message_bytes`: dealer requests carry sizes and session ids, never tensors."""

MAX_ELEMENTS = 2**26
"""Default `max_tuple_elements`: the most elements of any tensor of a tuple the dealer computes
(512 MiB of int64); a bigger request is RESOURCE_EXHAUSTED. The dealer holds every party's
shares of the tuple while computing it: about 3 x parties x this x 8 bytes at the most."""
SESSION_IDLE_S = 3600.0
"""A session nobody used for this long is forgotten."""
TOUCH_EVERY_S = 60.0
"""How often a session in use has its file's time renewed (so a restart keeps it)."""


@dataclass(frozen=True)
class DealerConfig:
    """What `dealer.toml` holds.

    `listen`, `[tls]`, `insecure`, `max_message_bytes`, `metrics_address`, `state_dir`,
    `max_tuple_elements`.
    """

    listen: str
    tls: TLSFiles | None
    max_message_bytes: int = MAX_REQUEST_BYTES
    metrics_address: str = ""
    """HOST:PORT of the Prometheus endpoint (mpcml/dealer/metrics.py); empty: none."""
    state_dir: Path | None = None
    """Where open sessions are kept (mpcml/dealer/sessions.py), so that a restarted dealer
    serves the jobs under way; None: in memory only, and a restart fails every running job."""
    max_tuple_elements: int = MAX_ELEMENTS

    @classmethod
    def load(cls, path: str | Path) -> DealerConfig:
        """Read the file (and `MPCML_*` overrides)."""
        data, base = cfg.load(path)
        return cls(
            listen=str(cfg.need(data, "listen", base)),
            tls=cfg.tls_files(data, base),
            max_message_bytes=cfg.positive_int(data, "max_message_bytes", MAX_REQUEST_BYTES, base),
            metrics_address=metrics.address(data, base),
            state_dir=cfg.resolve(base, str(data["state_dir"])) if "state_dir" in data else None,
            max_tuple_elements=cfg.positive_int(data, "max_tuple_elements", MAX_ELEMENTS, base),
        )


@dataclass
class Session:
    """One job's keys and what was served."""

    parties: list[str]
    keys: list[bytes] = field(repr=False)
    tuples: int = 0
    bytes_served: int = 0
    closed: set[str] = field(default_factory=set)
    """Parties that closed; the session goes when all have (one may finish before another)."""
    used: float = field(default_factory=time.monotonic)
    touched: float = field(default_factory=time.monotonic)
    """When its file's time was last renewed."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def _job(session_id: str) -> dict[str, str]:
    """The log context of a session: a job worker names its session JOB_ID or JOB_ID.ATTEMPT."""
    return {"job_id": session_id.partition(".")[0]}


class DealerService(pb_grpc.DealerServicer):
    """The `mpcml.v1.Dealer` service."""

    def __init__(
        self,
        insecure: bool = False,
        registry: CollectorRegistry | None = None,
        files: SessionFiles | None = None,
        max_elements: int = MAX_ELEMENTS,
    ) -> None:
        self.insecure = insecure
        self.files = files
        self.max_elements = max_elements
        self.sessions: dict[str, Session] = {}
        self._secret = files.secret() if files is not None else os.urandom(KEY_BYTES)
        """Whence a job's keys derive; kept in `state_dir`, or new at every start without one."""
        self.tag = tuples.secret_tag(self._secret)
        if files is not None:
            for sid, (parties, keys) in files.load(SESSION_IDLE_S).items():
                self.sessions[sid] = Session(parties, keys)
                log.info("session %s kept from before the restart", sid, extra=_job(sid))
        self._lock = threading.Lock()
        self.metrics = DealerMetrics(registry or CollectorRegistry(), lambda: len(self.sessions))
        """Counted whether or not anything serves them (`registry` is what the daemon serves)."""

    def _caller(self, context: grpc.ServicerContext, expected: str = "") -> None:
        """PERMISSION_DENIED unless a party's certificate calls (named `expected`, if given).

        Every call checks the caller's role first, before it looks at the request: a caller
        who is not a party learns nothing, not even whether a session exists.
        """
        caller(
            context,
            (PARTY_ROLE,),
            "get correlated randomness",
            insecure=self.insecure,
            expected=expected,
        )

    def _session(self, session_id: str) -> Session:
        with self._lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise StatusError("NOT_FOUND", f"no dealer session {session_id!r}")
        return session

    def Open(self, request: pb.OpenRequest, context: grpc.ServicerContext) -> pb.OpenReply:
        """Join a session; returns the caller's key."""
        self._caller(context)
        parties = list(request.parties)
        if not request.session_id or len(parties) < 2 or len(set(parties)) != len(parties):
            raise StatusError(
                "INVALID_ARGUMENT",
                "a session needs an id and at least two distinct parties",
            )
        if request.rank >= len(parties):
            raise StatusError("INVALID_ARGUMENT", f"rank {request.rank} of {parties}")
        self._caller(context, parties[request.rank])
        with self._lock:
            self._forget_idle()
            session = self.sessions.get(request.session_id)
            if session is None:
                keys = [
                    tuples.job_key(self._secret, request.job_id, parties, rank)
                    if request.job_id
                    else os.urandom(KEY_BYTES)
                    for rank in range(len(parties))
                ]
                session = Session(parties, keys)
                if self.files is not None:  # on disk before any key leaves the dealer
                    self.files.save(request.session_id, parties, keys)
                self.sessions[request.session_id] = session
                self.metrics.opened.inc()
                log.info(
                    "session %s opened for %s",
                    request.session_id,
                    ", ".join(parties),
                    extra=_job(request.session_id),
                )
        if session.parties != parties:
            raise StatusError(
                "FAILED_PRECONDITION",
                f"session {request.session_id!r} has parties {session.parties}, not {parties}",
            )
        return pb.OpenReply(key=session.keys[request.rank], tag=self.tag)

    def _forget_idle(self) -> None:
        now = time.monotonic()
        for sid in [s for s, v in self.sessions.items() if now - v.used > SESSION_IDLE_S]:
            del self.sessions[sid]
            if self.files is not None:
                self.files.remove(sid)

    def _limit(self, *elements: int) -> None:
        """RESOURCE_EXHAUSTED for a tensor beyond the limit (before any is allocated)."""
        largest = max(abs(n) for n in elements)
        if largest > self.max_elements:
            raise StatusError(
                "RESOURCE_EXHAUSTED",
                f"a tuple of {largest} elements exceeds the dealer's limit of "
                f"{self.max_elements} (max_tuple_elements in its config)",
            )

    def Correction(self, request: pb.TupleRequest, context: grpc.ServicerContext) -> pb.TupleReply:
        """Rank 0's correcting share of one tuple of the session."""
        return self._serve(self._rank0_session(request, context), request)

    def _rank0_session(self, request: pb.TupleRequest, context: grpc.ServicerContext) -> Session:
        """The request's session, once the caller is its rank 0 and the tuple is one to serve."""
        self._caller(context)
        session = self._session(request.session_id)
        self._caller(context, session.parties[0])
        self._check(request)
        return session

    def Corrections(self, request: pb.TupleBatch, context: grpc.ServicerContext) -> pb.TupleReplies:
        """Several corrections: every request is checked before any is computed."""
        self._caller(context)
        ids = {r.session_id for r in request.requests}
        if len(ids) > 1:
            raise StatusError("INVALID_ARGUMENT", f"a batch names {len(ids)} sessions, not one")
        if not ids:
            return pb.TupleReplies()
        session = self._session(ids.pop())
        self._caller(context, session.parties[0])
        for r in request.requests:
            self._check(r)
        return pb.TupleReplies(replies=[self._serve(session, r) for r in request.requests])

    def CorrectionChunks(
        self, request: pb.TupleRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.TupleReply]:
        """One correction in chunks of at most CHUNK_BYTES of data: the shape in the first."""
        reply = self._serve(self._rank0_session(request, context), request)
        data = memoryview(reply.data)
        yield pb.TupleReply(shape=reply.shape, data=bytes(data[:CHUNK_BYTES]))
        for start in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
            yield pb.TupleReply(data=bytes(data[start : start + CHUNK_BYTES]))

    def _check(self, request: pb.TupleRequest) -> None:
        """INVALID_ARGUMENT or RESOURCE_EXHAUSTED for a tuple the dealer will not compute."""
        if request.binding and len(request.binding) != KEY_BYTES:
            raise StatusError(
                "INVALID_ARGUMENT",
                f"a binding has {KEY_BYTES} bytes, not {len(request.binding)}",
            )
        self._limit(math.prod(request.size0), math.prod(request.size1))
        try:
            size = tuples.result_size(request)
        except tuples.TupleError as exc:
            raise StatusError("INVALID_ARGUMENT", str(exc)) from None
        self._limit(math.prod(size))

    def _serve(self, session: Session, request: pb.TupleRequest) -> pb.TupleReply:
        # Each tuple has its own keys (tuples.tuple_key), so no lock is held while computing.
        keys = [tuples.bound_key(k, request.binding) for k in session.keys]
        draws = {r: tuples.draw(k, r, request) for r, k in enumerate(keys)}
        share = tuples.correction(request, draws).contiguous()
        log.debug(
            "session %s tuple %d: %s %s of %s and %s",
            request.session_id,
            request.seq,
            pb.TupleKind.Name(request.kind),
            request.op or "-",
            list(request.size0),
            list(request.size1),
            extra=_job(request.session_id),
        )
        reply = pb.TupleReply(shape=list(share.shape), data=share.numpy().tobytes())
        served = reply.ByteSize()
        with session.lock:
            session.tuples += 1
            session.bytes_served += served
            session.used = time.monotonic()
            touch = self.files is not None and session.used - session.touched > TOUCH_EVERY_S
            if touch:
                session.touched = session.used
        if touch and self.files is not None:
            self.files.touch(request.session_id)
        self.metrics.tuples.labels(pb.TupleKind.Name(request.kind).lower()).inc()
        self.metrics.bytes.inc(served)
        return reply

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext) -> pb.CloseReply:
        """A party is done with the session; forgotten once every party is."""
        self._caller(context)
        with self._lock:
            session = self.sessions.get(request.session_id)
        if session is None:
            return pb.CloseReply()
        identity = caller_identity(context)
        if identity is not None and identity.name not in session.parties:
            raise StatusError("PERMISSION_DENIED", "not a party of the session")
        with self._lock:
            session.closed.add(identity.name if identity else str(len(session.closed)))
            if len(session.closed) >= len(session.parties):
                self.sessions.pop(request.session_id, None)
                if self.files is not None:
                    self.files.remove(request.session_id)
                log.info(
                    "session %s closed: %d tuples, %d bytes served",
                    request.session_id,
                    session.tuples,
                    session.bytes_served,
                    extra=_job(request.session_id),
                )
        return pb.CloseReply()


def serve(config: DealerConfig, stop: threading.Event) -> None:
    """Serve until `stop` is set."""
    if config.tls is None:
        log.warning("the dealer runs over PLAINTEXT gRPC (insecure): keys travel in the clear")
    else:
        check_certificate(config.tls, DEALER_ROLE)
    tuples.warm()
    guard = RequestGuard(config.max_message_bytes, "max_message_bytes")
    registry = metrics.registry()
    service = (
        pb.DESCRIPTOR.services_by_name["Dealer"].full_name,
        pb_grpc.add_DealerServicer_to_server,
        DealerService(
            config.tls is None,
            registry,
            SessionFiles(config.state_dir) if config.state_dir is not None else None,
            config.max_tuple_elements,
        ),
    )
    server, port, _ = start_server(
        "dealer",
        config.listen,
        config.tls,
        guard,
        [service],
        max_workers=32,
        max_send_bytes=MAX_MESSAGE_BYTES,
    )
    log.info("dealer listening on %s (port %d)", config.listen, port)
    if config.state_dir is None:
        log.warning(
            "the dealer keeps its sessions in memory only: a restart fails every running job "
            "(set state_dir in its config to keep them)"
        )
    else:
        log.info("open sessions are kept in %s", config.state_dir)
    endpoint = None
    try:
        endpoint = metrics.serve(config.metrics_address, registry)
        stop.wait()
    finally:
        if endpoint is not None:
            endpoint.stop()
        server.stop(grace=2).wait()
        log.info("dealer stopped")
