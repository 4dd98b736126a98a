"""`mpcml doctor --config FILE`: a daemon's preflight check, before (or while) it runs.

It reads the daemon's config as the daemon would (with `MPCML_*` overrides) and reports its
certificate (names, SANs, role, expiry, issuer, key), whether the coordinator, the dealer and
the other parties answer at their addresses and present the names they must, and how far their
clocks are from this machine's. Each finding that needs action says how to fix it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import ssl
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mpcml import config as cfg
from mpcml.cli.exits import EXIT_FAILED, EXIT_OK
from mpcml.proto.v1 import coordinator_pb2 as cpb
from mpcml.proto.v1 import coordinator_pb2_grpc as cgrpc
from mpcml.transport.address import AddressError, parse, reachable
from mpcml.transport.interceptors import TIME_METADATA
from mpcml.transport.serving import channel
from mpcml.transport.tls import (
    COORDINATOR_ROLE,
    DEALER_ROLE,
    PARTY_ROLE,
    TLSFiles,
    cert_names,
    cert_role,
    presented_certificate,
)

OK, WARN, FAIL = "ok", "warn", "fail"
EXPIRY_WARN_DAYS = 30
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 30.0
TIMEOUT_S = 5.0


@dataclass
class Finding:
    """One line of the report."""

    level: str
    check: str
    detail: str
    fix: str = ""


@dataclass
class Daemon:
    """What the check needs from any daemon's config."""

    role: str
    name: str
    tls: TLSFiles | None
    own_address: str
    """Where this daemon itself answers health checks (empty when it serves none)."""
    coordinator: str = ""
    coordinator_name: str = "coordinator"
    dealer: str = ""
    dealer_name: str = "dealer"
    store: str = ""
    """The coordinator's job store: a SQLite file's path or a postgresql:// URL."""


def read_config(path: str | Path, role: str | None = None) -> Daemon:
    """The daemon a config file describes; the role is guessed from its keys unless given."""
    data, _ = cfg.load(path)
    role = role or (
        PARTY_ROLE
        if "data_address" in data
        else COORDINATOR_ROLE
        if "parties" in data or "store" in data or "database" in data
        else DEALER_ROLE
    )
    if role == PARTY_ROLE:
        from mpcml.party.config import PartyConfig

        party = PartyConfig.load(path)
        return Daemon(
            PARTY_ROLE,
            party.name,
            party.tls,
            party.public_health_address(),
            party.coordinator,
            party.coordinator_name,
            party.dealer,
            party.dealer_name,
        )
    if role == COORDINATOR_ROLE:
        from mpcml.coordinator.server import CoordinatorConfig

        coordinator = CoordinatorConfig.load(path)
        return Daemon(
            COORDINATOR_ROLE,
            "coordinator",
            coordinator.tls,
            reachable(coordinator.listen),
            store=coordinator.store,
        )
    from mpcml.dealer.server import DealerConfig

    dealer = DealerConfig.load(path)
    return Daemon(DEALER_ROLE, "dealer", dealer.tls, reachable(dealer.listen))


# --- the certificate -------------------------------------------------------------------------


def check_certificate(daemon: Daemon, now: dt.datetime | None = None) -> list[Finding]:
    """Names, role, expiry, issuer and key of the daemon's own certificate."""
    tls = daemon.tls
    if tls is None:
        return [
            Finding(
                WARN,
                "tls",
                "insecure: plaintext gRPC with no authentication",
                "give the config a [tls] table (ca, cert, key) and drop `insecure`",
            )
        ]
    issue = (
        f"mpcml certs issue --ca CA_DIR --name {daemon.name} --role {daemon.role} "
        "--san HOST_OTHERS_USE"
    )
    try:
        cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        ca = x509.load_pem_x509_certificate(Path(tls.ca).read_bytes())
        key = serialization.load_pem_private_key(Path(tls.key).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        return [Finding(FAIL, "certificate", f"cannot read the TLS files: {exc}", issue)]
    names = cert_names(cert)
    sans = [*names.dns_names, *names.ip_addresses]
    found = [
        Finding(
            OK,
            "certificate",
            f"{tls.cert}: name {names.common_name!r}, role {cert_role(cert)!r}, "
            f"SANs {', '.join(sans) or 'none'}",
        )
    ]
    if daemon.name not in names.dns_names:
        found.append(
            Finding(
                FAIL,
                "certificate name",
                f"the certificate does not carry the name {daemon.name!r} this daemon runs as",
                issue,
            )
        )
    if cert_role(cert) != daemon.role:
        found.append(
            Finding(
                FAIL,
                "certificate role",
                f"role {cert_role(cert)!r}; a {daemon.role} needs role {daemon.role!r}",
                issue,
            )
        )
    now = now or dt.datetime.now(dt.UTC)
    left = cert.not_valid_after_utc - now
    until = f"valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if left.total_seconds() <= 0 or cert.not_valid_before_utc > now:
        found.append(Finding(FAIL, "expiry", f"not valid now ({until})", issue))
    elif left.days < EXPIRY_WARN_DAYS:
        found.append(Finding(WARN, "expiry", f"{until}: {left.days} days left", issue))
    else:
        found.append(Finding(OK, "expiry", f"{until} ({left.days} days)"))
    try:
        cert.verify_directly_issued_by(ca)
        found.append(Finding(OK, "issuer", f"signed by the CA in {tls.ca}"))
    except (InvalidSignature, ValueError, TypeError) as exc:
        found.append(
            Finding(
                FAIL,
                "issuer",
                f"not signed by the CA in {tls.ca} ({type(exc).__name__})",
                f"issue it from that CA: {issue}",
            )
        )
    ours = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    theirs = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if ours != theirs:
        found.append(
            Finding(FAIL, "key", f"{tls.key} is not the key of {tls.cert}", "use the pair issued")
        )
    return found


# --- reaching the others ---------------------------------------------------------------------


def _presented(address: str, tls: TLSFiles) -> list[str]:
    """The DNS names on the certificate the daemon at `address` presents to us."""
    return list(cert_names(presented_certificate(address, tls, TIMEOUT_S)).dns_names)


def probe(what: str, address: str, expected: str, tls: TLSFiles | None) -> list[Finding]:
    """Is `address` reachable, does it present `expected`, is it SERVING, and its clock."""
    try:
        where = parse(address)
    except AddressError as exc:
        return [Finding(FAIL, what, str(exc), "fix the address")]
    host, port = where.host, where.port
    if tls is not None:
        try:
            names = _presented(address, tls)
        except ssl.SSLCertVerificationError:
            return [
                Finding(
                    FAIL,
                    what,
                    f"{address} presents a certificate not signed by our CA ({tls.ca})",
                    "both ends need certificates from the same CA (mpcml certs issue)",
                )
            ]
        except socket.gaierror:
            return [Finding(FAIL, what, f"cannot resolve {host!r}", "fix the name or DNS")]
        except ConnectionRefusedError:
            return [
                Finding(
                    FAIL,
                    what,
                    f"{address} refuses connections: nothing listens on port {port}",
                    f"start the {expected} daemon, or fix the address",
                )
            ]
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            return [
                Finding(
                    FAIL,
                    what,
                    f"{address} unreachable: {exc}",
                    f"open port {port} between this host and {host} (firewall, routes)",
                )
            ]
        if expected not in names:
            return [
                Finding(
                    FAIL,
                    what,
                    f"{address} presents a certificate for {names}, not {expected!r}",
                    f"point the address at {expected}, or issue its certificate with that name",
                )
            ]
    return [*_health(what, address, expected, tls)]


def _health(what: str, address: str, expected: str, tls: TLSFiles | None) -> list[Finding]:
    with channel(address, tls, expected) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        sent = time.time()
        try:
            reply, call = stub.Check.with_call(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return [
                Finding(
                    FAIL,
                    what,
                    f"{address} ({expected}) does not answer health checks: "
                    f"{exc.code().name}: {exc.details()}",
                    f"is {expected} an mpcml daemon of this version?",
                )
            ]
        received = time.time()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    found = [
        Finding(
            OK if status == "SERVING" else WARN,
            what,
            f"{address} answers as {expected!r}: {status}",
            "" if status == "SERVING" else f"see {expected}'s log",
        )
    ]
    stamp = dict(call.initial_metadata() or ()).get(TIME_METADATA)
    if stamp is not None:
        skew = float(stamp) - (sent + received) / 2
        bound = (received - sent) / 2
        level = OK if abs(skew) <= SKEW_WARN_S else WARN if abs(skew) <= SKEW_FAIL_S else FAIL
        found.append(
            Finding(
                level,
                f"clock vs {expected}",
                f"{expected}'s clock is {skew:+.3f} s from ours (+/- {bound:.3f} s)",
                "" if level == OK else "synchronise both clocks (NTP, chrony)",
            )
        )
    return found


def peers(daemon: Daemon) -> list[cpb.PeerEndpoint] | str:
    """The other attached parties, from the coordinator; or why they cannot be listed."""
    with channel(daemon.coordinator, daemon.tls, daemon.coordinator_name) as ch:
        try:
            reply = cgrpc.PartyControlStub(ch).ListPeers(cpb.ListPeersRequest(), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return list(reply.peers)


def _data_port(peer: cpb.PeerEndpoint) -> Finding:
    """A peer's data plane listens only while one of its workers runs: refused is normal."""
    what = f"peer {peer.name} data plane"
    try:
        where = parse(peer.data_address)
    except AddressError as exc:
        return Finding(FAIL, what, str(exc), "the peer's data_address must be HOST:PORT")
    try:
        with socket.create_connection((where.host, where.port), timeout=TIMEOUT_S):
            return Finding(OK, what, f"{peer.data_address} accepts connections (a job is running)")
    except ConnectionRefusedError:
        return Finding(
            OK,
            what,
            f"{peer.data_address}: the host answers, nothing listens now "
            "(workers listen only while a job runs)",
        )
    except OSError as exc:
        return Finding(
            FAIL,
            what,
            f"{peer.data_address} unreachable: {exc}",
            f"open port {where.port} from this host to {where.host} (the data plane of every job)",
        )


def check_store(store: str) -> Finding:
    """The coordinator's job store opens (a SQLite file is not created if it is missing)."""
    from mpcml.coordinator.sql_store import POSTGRES_SCHEMES, postgres_name
    from mpcml.coordinator.store import StoreError, open_store

    postgres = store.startswith(POSTGRES_SCHEMES)
    name = postgres_name(store) if postgres else store
    if not postgres and not Path(store).exists():
        folder = Path(store).parent
        if os.access(folder, os.W_OK) or not folder.exists():
            return Finding(OK, "job store", f"{name} does not exist yet: the coordinator makes it")
        return Finding(FAIL, "job store", f"cannot create {name}", f"make {folder} writable")
    try:
        opened = open_store(store)
    except (StoreError, OSError) as exc:
        fix = (
            "check the URL, that PostgreSQL runs there, and the password (PGPASSWORD)"
            if postgres
            else "check the file's owner and mode"
        )
        return Finding(FAIL, "job store", str(exc), fix)
    try:
        return Finding(OK, "job store", f"{name}: {len(opened.jobs())} jobs")
    finally:
        opened.close()


def run_checks(daemon: Daemon) -> list[Finding]:
    """Every check that applies to the daemon.

    Without readable TLS files nothing can be reached: the checks that connect are reported as
    not run, pointing at the certificate finding.
    """
    found = check_certificate(daemon)
    if any(f.check == "certificate" and f.detail.startswith("cannot read") for f in found):
        return [
            *found,
            Finding(
                FAIL,
                "connections",
                "not checked: this daemon's TLS files cannot be read",
                "fix the certificate finding above, then run mpcml doctor again",
            ),
        ]
    if daemon.own_address:
        found += probe(f"this {daemon.role}", daemon.own_address, daemon.name, daemon.tls)
    if daemon.store:
        found.append(check_store(daemon.store))
    if daemon.role != PARTY_ROLE:
        return found
    found += probe("coordinator", daemon.coordinator, daemon.coordinator_name, daemon.tls)
    if daemon.dealer:
        found += probe("dealer", daemon.dealer, daemon.dealer_name, daemon.tls)
    else:
        found.append(
            Finding(
                WARN,
                "dealer",
                "no dealer configured: only jobs with insecure_provider = 'tfp' can run",
                'set `dealer = "HOST:PORT"` in the config',
            )
        )
    listed = peers(daemon)
    if isinstance(listed, str):
        found.append(
            Finding(
                WARN,
                "peers",
                f"the coordinator did not list the other parties: {listed}",
                "fix the coordinator check above first",
            )
        )
        return found
    if not listed:
        found.append(Finding(WARN, "peers", "no other party is attached to the coordinator now"))
    for peer in listed:
        if peer.health_address:
            found += probe(f"peer {peer.name}", peer.health_address, peer.name, daemon.tls)
        found.append(_data_port(peer))
    return found


# --- the command -----------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """The `doctor` command."""
    p = sub.add_parser("doctor", help="preflight check of a daemon's config, certs and network")
    p.add_argument("--config", required=True, help="the daemon's TOML config")
    p.add_argument(
        "--role",
        choices=[PARTY_ROLE, COORDINATOR_ROLE, DEALER_ROLE],
        help="which daemon the config is for (default: guessed from its keys)",
    )
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when nothing failed, 1 when something did, 2 for an unreadable config."""
    daemon = read_config(args.config, args.role)
    found = run_checks(daemon)
    if args.format == "json":
        print(json.dumps([asdict(f) for f in found], indent=2))
    else:
        print(f"mpcml doctor: {daemon.role} {daemon.name!r} ({args.config})")
        for f in found:
            print(f"{f.level.upper():<5} {f.check}: {f.detail}")
            if f.fix:
                print(f"      fix: {f.fix}")
    failed = sum(f.level == FAIL for f in found)
    print(
        f"{failed} failed, {sum(f.level == WARN for f in found)} warnings",
        file=sys.stderr if args.format == "json" else sys.stdout,
    )
    return EXIT_FAILED if failed else EXIT_OK
