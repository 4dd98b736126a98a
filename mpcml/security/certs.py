"""A small certificate authority on `cryptography`: a CA, and party certificates it signs.

Certificates carry the identity as the common name and again as a DNS subject alternative name
(what gRPC's name check reads), plus the addresses the holder serves on. Private keys are
written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mpcml.transport.tls import (
    CLIENT_ROLE,
    COORDINATOR_ROLE,
    DEALER_ROLE,
    PARTY_ROLE,
    cert_names,
    cert_role,
)

ROLES = (PARTY_ROLE, COORDINATOR_ROLE, DEALER_ROLE, CLIENT_ROLE)


@dataclass(frozen=True)
class Issued:
    """Paths of a written certificate and its key."""

    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _load(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_dir / 'ca.key'} is not an EC private key")
    return cert, key


def init_ca(out: str | Path, name: str = "mpcml-ca", days: int = 3650) -> Issued:
    """Create `out/ca.pem` and `out/ca.key`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    issued = Issued(out / "ca.pem", out / "ca.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(issued.key, key)
    return issued


def issue(
    ca_dir: str | Path,
    name: str,
    *,
    role: str = "party",
    sans: tuple[str, ...] = (),
    out: str | Path | None = None,
    days: int = 825,
    not_before: dt.datetime | None = None,
) -> Issued:
    """Issue `out/<name>.pem` and `out/<name>.key`, signed by the CA in `ca_dir`.

    `sans` are DNS names or IP addresses; `name` itself is always added as a DNS name.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    ca_dir = Path(ca_dir)
    out_dir = Path(out) if out is not None else ca_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = [x509.DNSName(name)]
    for san in sans:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            if san != name:
                alt.append(x509.DNSName(san))
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    issued = Issued(out_dir / f"{name}.pem", out_dir / f"{name}.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(issued.key, key)
    return issued


def setup(
    out: str | Path,
    identities: Sequence[tuple[str, str]],
    sans: Sequence[str] = (),
    owner: tuple[int, int] | None = None,
) -> list[Path]:
    """A deployment's certificates, one folder per holder; returns the files it wrote.

    `out/ca/` holds the CA; `out/NAME/` holds `ca.pem`, `NAME.pem` and `NAME.key` of each
    (name, role), so that each service mounts only its own folder. What exists is kept: run
    again (a restarted one-shot service), it only adds what is missing and never replaces the
    CA under certificates it signed. `owner` (uid, gid) is given each holder's folder and
    files, so that a daemon running as that user can read its key (mode 0600).
    """
    out = Path(out)
    ca_dir = out / "ca"
    written: list[Path] = []
    if not (ca_dir / "ca.pem").exists():
        issued = init_ca(ca_dir)
        written += [issued.cert, issued.key]
    for name, role in identities:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "ca.pem").exists():
            (folder / "ca.pem").write_bytes((ca_dir / "ca.pem").read_bytes())
            written.append(folder / "ca.pem")
        if not (folder / f"{name}.pem").exists():
            issued = issue(ca_dir, name, role=role, sans=tuple(sans), out=folder)
            written += [issued.cert, issued.key]
        if owner is not None:
            for path in (folder, *folder.iterdir()):
                os.chown(path, *owner)
    return written


def describe(path: str | Path) -> str:
    """Name, role, subject alternative names, issuer and validity of a certificate file."""
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    except ValueError:
        raise ValueError(f"{str(path)!r} is not a PEM certificate") from None
    names = cert_names(cert)
    sans = [*names.dns_names, *names.ip_addresses]
    now = dt.datetime.now(dt.UTC)
    after = cert.not_valid_after_utc
    state = "EXPIRED" if after < now else f"valid for {(after - now).days} more days"
    return "\n".join(
        [
            f"name:    {names.common_name}",
            f"role:    {cert_role(cert) or '(none)'}",
            f"SANs:    {', '.join(sans) or '(none)'}",
            f"issuer:  {cert.issuer.rfc4514_string()}",
            f"valid:   {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {after:%Y-%m-%d %H:%M} UTC"
            f" ({state})",
        ]
    )
