"""Ids as points of Curve25519, and the masks ECDH-PSI puts on them.

An id is hashed (BLAKE2b, keyed with a domain) to 32 bytes, taken as the u-coordinate of a point
of Curve25519 or of its twist (about half the hashes are each), and masked by X25519
(`crypto_scalarmult`) with a secret scalar. X25519's ladder commutes on both: k1 * (k2 * P) =
k2 * (k1 * P), so two parties that each mask once arrive at the same value for an id they both
hold, and neither learns the other's ids. Curve25519 was chosen to be twist-secure: both groups
are a large prime order times a cofactor (8, 4) that X25519's clamped scalars (multiples of 8)
clear, so a masked value lies in a prime-order subgroup and a chosen point teaches nothing about
a scalar. SecretFlow's Curve25519 ECDH-PSI hashes the same way; an earlier version here mapped
each hash onto the prime-order subgroup with Elligator 2 and a subgroup check, which cost twice a
scalar multiplication per id (70 us against 33 us on this project's machine) and bought nothing
that clamping does not.

libsodium releases the GIL in its calls through cffi, so chunks of a large set are masked on
several threads.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from nacl import bindings

from mpcml.errors import MpcmlError

POINT_BYTES = 32
KEY_BYTES = 32
CHUNK = 4096
"""Points per task on the thread pool."""
DOMAIN = b"mpcml-psi-v2"


class PsiError(MpcmlError):
    """A PSI message that is not a set of valid points, or a set too large."""


def threads() -> int:
    """How many threads mask and hash: the cores this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def new_key() -> bytes:
    """A fresh secret scalar (X25519 clamps it)."""
    return os.urandom(KEY_BYTES)


def _hash_chunk(ids: Sequence[bytes]) -> bytes:
    out = bytearray()
    for one in ids:
        u = bytearray(hashlib.blake2b(one, digest_size=32, key=DOMAIN).digest())
        u[31] &= 0x7F  # X25519 ignores the top bit: clear it so that one id has one encoding
        out += u
    return bytes(out)


def _mask_chunk(key: bytes, points: bytes) -> bytes:
    out = bytearray()
    for start in range(0, len(points), POINT_BYTES):
        try:
            out += bindings.crypto_scalarmult(key, points[start : start + POINT_BYTES])
        except Exception:  # libsodium refuses a point of small order: not one of ours
            raise PsiError("a PSI message holds a point outside the group") from None
    return bytes(out)


def _chunks(total: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, total)) for i in range(0, total, size)]


def hash_ids(ids: Sequence[bytes], workers: int | None = None) -> bytes:
    """Each id as a group element, concatenated (32 bytes each, in the ids' order)."""
    spans = _chunks(len(ids), CHUNK)
    with ThreadPoolExecutor(workers or threads()) as pool:
        return b"".join(pool.map(lambda s: _hash_chunk(ids[s[0] : s[1]]), spans))


def mask(key: bytes, points: bytes, workers: int | None = None) -> bytes:
    """Every point of `points` (concatenated) times the secret `key`, in the same order."""
    if len(points) % POINT_BYTES:
        raise PsiError(f"a PSI message of {len(points)} bytes is not a whole number of points")
    spans = _chunks(len(points), CHUNK * POINT_BYTES)
    with ThreadPoolExecutor(workers or threads()) as pool:
        return b"".join(pool.map(lambda s: _mask_chunk(key, points[s[0] : s[1]]), spans))
