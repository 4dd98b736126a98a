"""Mutual-TLS material for the data plane, and the identity checks built on it.

A party's identity is the common name of its certificate. The receiving side of a stream checks
it against the name the claimed rank must carry; the connecting side makes gRPC verify that the
server's certificate carries the expected name (`ssl_target_name_override`) and, when the
handshake fails, probes the peer once with Python's `ssl` to say which name it presented.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from mpcml.transport.address import parse


@dataclass(frozen=True)
class TLSFiles:
    """Paths of the PEM files a party uses: the CA it trusts, its certificate and its key."""

    ca: str | Path
    cert: str | Path
    key: str | Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """The (ca, cert, key) PEM bytes; a missing file raises an error naming it."""
        out = []
        for what, path in (
            ("CA certificate", self.ca),
            ("certificate", self.cert),
            ("private key", self.key),
        ):
            try:
                out.append(Path(path).read_bytes())
            except OSError as exc:
                raise ValueError(f"cannot read the TLS {what} {str(path)!r}: {exc}") from exc
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class CertNames:
    """The names a certificate carries."""

    common_name: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]

    def describe(self) -> str:
        """Human-readable summary for error messages."""
        sans = [*self.dns_names, *self.ip_addresses]
        return f"{self.common_name!r} (SANs: {', '.join(sans) or 'none'})"


def cert_names(cert: x509.Certificate) -> CertNames:
    """Common name and subject alternative names of `cert`."""
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common_name = str(cns[0].value) if cns else ""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    return CertNames(common_name, dns, ips)


def check_certificate(tls: TLSFiles, role: str | None) -> None:
    """Refuse, before connecting, a certificate the other side would refuse.

    The other side would say only "handshake failed"; here the message says why: not from our
    CA, expired or not yet valid, or (unless `role` is None) made for another role.
    """
    ca_pem, cert_pem, key_pem = tls.read()
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    name = cert_names(cert).common_name
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{str(tls.key)!r} is not an unencrypted PEM private key") from None
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*raw) != cert.public_key().public_bytes(*raw):
        raise ValueError(
            f"the key {str(tls.key)!r} does not belong to the certificate {str(tls.cert)!r} "
            f"({name!r}): give the key made with that certificate"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ValueError(
            f"certificate {str(tls.cert)!r} ({name!r}) is not issued by the CA in {str(tls.ca)!r}"
        ) from None
    now = dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc < now:
        raise ValueError(
            f"certificate {str(tls.cert)!r} ({name!r}) expired on "
            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if cert.not_valid_before_utc > now:
        raise ValueError(
            f"certificate {str(tls.cert)!r} ({name!r}) is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    if role is not None and cert_role(cert) != role:
        raise ValueError(
            f"certificate {str(tls.cert)!r} ({name!r}) has role {cert_role(cert) or 'none'!r}; "
            f"this needs a {role!r} certificate"
        )


def pem_names(pem: bytes) -> CertNames:
    """Names of the first certificate in a PEM blob."""
    return cert_names(x509.load_pem_x509_certificate(pem))


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    """Server side: present our certificate and require one from our CA."""
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(tls: TLSFiles) -> grpc.ChannelCredentials:
    """Client side: trust only our CA and present our certificate."""
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


PARTY_ROLE = "party"
CLIENT_ROLE = "client"
COORDINATOR_ROLE = "coordinator"
DEALER_ROLE = "dealer"


@dataclass(frozen=True)
class Identity:
    """Who a TLS client certificate says its holder is.

    The name, and the role (party, coordinator, dealer or client), which
    `mpcml.security.certs` writes as the OU.
    """

    name: str
    role: str


def cert_role(cert: x509.Certificate) -> str:
    """The role a certificate carries, "" when it has none."""
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return str(units[0].value) if units else ""


def caller_identity(context: grpc.ServicerContext) -> Identity | None:
    """The identity of the call's TLS client certificate, None on a plaintext call."""
    pem = context.auth_context().get("x509_pem_cert")
    if not pem:
        return None
    return _identity(bytes(pem[0]))


@functools.lru_cache(maxsize=256)
def _identity(pem: bytes) -> Identity:
    # Cached by the certificate's bytes: a peer calls thousands of times with the same one
    # (the dealer, once per tuple), and parsing it costs a tenth of a dealer call.
    cert = x509.load_pem_x509_certificate(pem)
    return Identity(cert_names(cert).common_name, cert_role(cert))


def presented_certificate(address: str, tls: TLSFiles, timeout: float = 3.0) -> x509.Certificate:
    """The certificate the daemon at `address` presents when we connect with `tls`.

    Raises ssl.SSLCertVerificationError when it is not from our CA, OSError when it cannot be
    reached.
    """
    ca, _cert, _key = tls.read()
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode())
    context.check_hostname = False  # the caller checks the names against the one it expects
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.set_alpn_protocols(["h2"])
    where = parse(address)
    with (
        socket.create_connection((where.host, where.port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=_sni(where.host)) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    if der is None:
        raise ssl.SSLError(f"{address} presented no certificate")
    return x509.load_der_x509_certificate(der)


def diagnose_peer(
    address: str, tls: TLSFiles, expected_name: str, timeout: float = 3.0
) -> str | None:
    """Why a TLS connection to `address` fails our checks, or None if it passes or cannot tell.

    Called only after gRPC reported a failure, to turn it into a message that says which
    certificate the peer presented.
    """
    try:
        cert = presented_certificate(address, tls, timeout)
    except ssl.SSLCertVerificationError as exc:
        return (
            f"its certificate is not accepted by our CA ({exc.verify_message}); "
            f"expected a certificate for {expected_name!r} issued by our CA"
        )
    except (OSError, ssl.SSLError):
        return None
    names = cert_names(cert)
    if names.common_name != expected_name or expected_name not in names.dns_names:
        return f"expected a certificate for {expected_name!r}, it presented {names.describe()}"
    return None


def _sni(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    return None
