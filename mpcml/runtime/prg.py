"""Share randomness from ChaCha20 (RFC 8439) instead of torch's mt19937 and Philox.

CrypTen draws share masks, pseudo-random zero shares and provider randomness through two
functions of `crypten.common.rng`, with `torch.Generator`s seeded by `crypten._setup_prng`
(docs/security.md); neither generator is cryptographically secure. `install()` replaces both
functions (also where CrypTen imported them by name) and the seeding: every generator gets a
256-bit key from the operating system's CSPRNG (`os.urandom`), the keys shared with the next and
previous party and the global key travel over the session's mutual-TLS data plane, and draws
come from the keyed ChaCha20 stream of that generator.

Each draw of a stream uses the next nonce (the draw count, and the round) from block counter 0,
so a stream's position is its round and its number of draws in it, and the same key and draw
give the same bytes on CPU (OpenSSL, through `cryptography`) and on CUDA (the torch kernel below).

A job's runs draw the same randomness round by round (bit-exact resume, docs/failures.md): with
`JobRandomness` the keys derive from the party's per-job secret and the run's binding (what the
parties agree at start-up from each one's secret tag, the job and the dealer's tag), and every
stream goes to its round's start at `start_round`. When any party's secret or the dealer's
secret changed, the binding does, and so does every key: either all is drawn as before, or
nothing is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from mpcml.errors import MpcmlError
from mpcml.runtime import devices

log = logging.getLogger(__name__)

KEY_BYTES = 32
_MASK = 0xFFFFFFFF
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"


def _nonce(draw: int, round: int = 0) -> bytes:
    """The 96-bit nonce of draw number `draw` of `round`."""
    return draw.to_bytes(8, "little") + round.to_bytes(4, "little")


_CHUNK = 4 * 2**20
_ZEROS = bytes(_CHUNK)


def keystream_into(key: bytes, nonce: bytes, out: torch.Tensor, counter: int = 0) -> None:
    """Fill the uint8 CPU tensor `out` with ChaCha20 keystream through `cryptography`.

    That is OpenSSL, whose 16-byte nonce is counter || nonce; it encrypts zeros chunk by chunk,
    straight into `out` (no scratch buffer: CrypTen draws many small tensors, so the fixed cost
    of a draw matters as much as the throughput).
    """
    full = counter.to_bytes(4, "little") + nonce
    encryptor = Cipher(algorithms.ChaCha20(key, full), mode=None).encryptor()
    view = memoryview(out.numpy())  # type: ignore[arg-type]
    for start in range(0, len(view), _CHUNK):
        n = min(_CHUNK, len(view) - start)
        written = encryptor.update_into(memoryview(_ZEROS)[:n], view[start : start + n])
        if written != n:
            raise PRGError(f"OpenSSL wrote {written} of {n} keystream bytes")


def keystream_openssl(key: bytes, nonce: bytes, nbytes: int, counter: int = 0) -> bytes:
    """The keystream as bytes (for tests and small draws)."""
    out = torch.empty(nbytes, dtype=torch.uint8)
    keystream_into(key, nonce, out, counter)
    return out.numpy().tobytes()


def _rotl(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x << n) | (x >> (32 - n))) & _MASK


def _quarter(s: list[torch.Tensor], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & _MASK
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & _MASK
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _MASK
    s[b] = _rotl(s[b] ^ s[c], 7)


def keystream_torch(
    key: bytes, nonce: bytes, nbytes: int, counter: int = 0, device: Any = "cpu"
) -> torch.Tensor:
    """The same keystream computed with torch on `device`, as a uint8 tensor (RFC 8439 2.3)."""
    nblocks = -(-nbytes // 64)
    words = [int.from_bytes(key[i : i + 4], "little") for i in range(0, 32, 4)]
    nonces = [int.from_bytes(nonce[i : i + 4], "little") for i in range(0, 12, 4)]
    blocks = torch.arange(counter, counter + nblocks, dtype=torch.int64, device=device)
    initial = [torch.full_like(blocks, v) for v in (*_CONSTANTS, *words)]
    initial += [blocks & _MASK, *(torch.full_like(blocks, v) for v in nonces)]
    s = list(initial)
    for _ in range(10):
        _quarter(s, 0, 4, 8, 12)
        _quarter(s, 1, 5, 9, 13)
        _quarter(s, 2, 6, 10, 14)
        _quarter(s, 3, 7, 11, 15)
        _quarter(s, 0, 5, 10, 15)
        _quarter(s, 1, 6, 11, 12)
        _quarter(s, 2, 7, 8, 13)
        _quarter(s, 3, 4, 9, 14)
    out = torch.stack([(x + y) & _MASK for x, y in zip(s, initial, strict=True)], dim=1)
    signed = torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)
    return signed.contiguous().view(torch.uint8).reshape(-1)[:nbytes]


class ChaChaStream:
    """One generator's keyed stream; a draw of n bytes moves it on by one draw."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a ChaCha20 key has {KEY_BYTES} bytes, got {len(key)}")
        self._key = key
        self.draws = 0
        self.round = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the key
        return f"ChaChaStream(round={self.round}, draws={self.draws})"

    def start_round(self, round: int) -> None:
        """Go to the first draw of `round`: a round's draws do not depend on earlier rounds'."""
        if not 0 <= round < 2**32:
            raise ValueError(f"a round is a number from 0 to 2^32 - 1, not {round}")
        with self._lock:
            self.round, self.draws = round, 0

    def random_bytes(self, nbytes: int, device: Any = None) -> torch.Tensor:
        """The next draw, as a uint8 tensor on `device`."""
        with self._lock:
            nonce = _nonce(self.draws, self.round)
            self.draws += 1
        device = torch.device("cpu") if device is None else torch.device(device)
        if device.type == "cpu":
            out = torch.empty(nbytes, dtype=torch.uint8)
            keystream_into(self._key, nonce, out)
            return out
        return keystream_torch(self._key, nonce, nbytes, device=device)

    def ring(self, size: Any, bitlength: int = 64, device: Any = None) -> torch.Tensor:
        """Uniform int64 elements of shape `size` (of `bitlength` low bits when < 64)."""
        shape = torch.Size(size)
        raw = self.random_bytes(8 * shape.numel(), device).view(torch.int64).reshape(shape)
        if bitlength < 64:
            raw = raw & ((1 << bitlength) - 1)
        return raw


class PRGError(MpcmlError):
    """A CrypTen generator has no ChaCha20 key: the PRG was not set up for this session."""


_STREAMS: dict[int, ChaChaStream] = {}
"""id(torch.Generator in crypten.generators) -> the stream that replaces it."""


@dataclass(frozen=True)
class JobRandomness:
    """What makes every run of a job draw the same randomness (set with `use` before init)."""

    job_id: str
    secret: bytes = field(repr=False)
    """This party's secret for the job: 32 bytes it keeps beside its checkpoints."""
    context: bytes = b""
    """What else the binding covers: the job spec's digest."""
    dealer_tag: bytes = b""
    """The dealer's `OpenReply.tag` (empty without a dealer)."""


_JOB: JobRandomness | None = None
_BINDING = b""


def use(job: JobRandomness | None) -> None:
    """The randomness of the session `crypten.init` sets up next (None: fresh keys)."""
    global _JOB, _BINDING
    _JOB, _BINDING = job, b""


def binding() -> bytes:
    """What the parties agreed at set-up for this run: empty without `JobRandomness`."""
    return _BINDING


def _derive(secret: bytes, binding: bytes, name: str) -> bytes:
    return hashlib.blake2b(
        binding + name.encode(), key=secret, digest_size=KEY_BYTES, person=b"mpcml-prg"
    ).digest()


def start_round(round: int) -> None:
    """Every stream, and the torch generators seeded from them, to the start of `round`."""
    import crypten

    seen: set[int] = set()
    for stream in _STREAMS.values():
        if id(stream) not in seen:
            seen.add(id(stream))
            stream.start_round(round)
    _seed_generators(crypten.generators)


def _device(value: Any) -> torch.device:
    return torch.device("cpu") if value is None else torch.device(value)


def _stream(generator: Any, device: torch.device) -> ChaChaStream:
    import crypten

    if generator is None:
        generator = crypten.generators["local"][device]
    stream = _STREAMS.get(id(generator))
    if stream is None:
        raise PRGError(
            "a CrypTen generator has no ChaCha20 key: mpcml.runtime.prg.install() must run "
            "before crypten.init() (mpcml.session does this)"
        )
    return stream


def _shape(size: Any) -> torch.Size:
    return torch.Size([size]) if isinstance(size, int) else torch.Size(size)


def wrap(tensor: torch.Tensor) -> Any:
    """A share as CrypTen holds it: CUDA shares in its `CUDALongTensor`, CPU ones as they are."""
    if tensor.is_cuda or devices.emulating():
        return devices.wrapper()(tensor)
    return tensor


def generate_random_ring_element(
    size: Any, ring_size: int = 2**64, generator: Any = None, **kwargs: Any
) -> Any:
    """CrypTen's `crypten.common.rng.generate_random_ring_element`, from ChaCha20."""
    if ring_size != 2**64:
        raise PRGError(f"only the 2^64 ring is supported, not {ring_size}")
    device = _device(kwargs.get("device"))
    return wrap(_stream(generator, device).ring(_shape(size), 64, device))


def generate_kbit_random_tensor(
    size: Any, bitlength: int | None = None, generator: Any = None, **kwargs: Any
) -> Any:
    """CrypTen's `crypten.common.rng.generate_kbit_random_tensor`, from ChaCha20."""
    device = _device(kwargs.get("device"))
    bits = 64 if bitlength is None else bitlength
    return wrap(_stream(generator, device).ring(_shape(size), bits, device))


def _key_tensor(key: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(key), dtype=torch.int64).clone()


def _setup_prng() -> None:
    """Replaces `crypten._setup_prng` with 256-bit keys from os.urandom, or derived.

    With `JobRandomness` they derive from the job's secret and the run's binding. They are
    exchanged over the data plane like CrypTen's seeds: next to the next party, global from
    rank 0.
    """
    import crypten
    import crypten.communicator as comm

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda")]
        devices += [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    for name in crypten.generators:
        for device in devices:
            crypten.generators[name][device] = torch.Generator(device=device)
    c = comm.get()
    rank, world = c.get_rank(), c.get_world_size()
    secret = _agree_binding(c)

    def draw(name: str) -> torch.Tensor:
        key = os.urandom(KEY_BYTES) if secret is None else _derive(secret, _BINDING, name)
        return _key_tensor(key)

    next_key = draw("next")
    prev_key = torch.zeros(KEY_BYTES // 8, dtype=torch.int64)
    if world >= 2:
        send = c.isend(next_key, (rank + 1) % world)
        recv = c.irecv(prev_key, src=(rank - 1) % world)
        send.wait()
        recv.wait()
    else:
        prev_key = next_key
    global_key = draw("global") if rank == 0 else _key_tensor(bytes(KEY_BYTES))
    global_key = c.broadcast(global_key, 0)
    keys = {"prev": prev_key, "next": next_key, "local": draw("local"), "global": global_key}
    log.debug(
        "ChaCha20 keys %s; next and previous keys exchanged with ranks %d and %d",
        "drawn" if secret is None else "derived from the job's secret",
        (rank + 1) % world,
        (rank - 1) % world,
    )
    _STREAMS.clear()
    for name, key in keys.items():
        stream = ChaChaStream(key.numpy().tobytes())
        for generator in crypten.generators[name].values():
            _STREAMS[id(generator)] = stream
    _seed_generators(crypten.generators)


def _agree_binding(c: Any) -> bytes | None:
    """With `JobRandomness`: the run's binding, from every party's secret tag; its secret."""
    global _BINDING
    job = _JOB
    if job is None:
        return None
    from mpcml.runtime.tuples import secret_tag

    tags = c.all_gather(_key_tensor(secret_tag(job.secret)))
    parts = [job.job_id.encode(), job.context, job.dealer_tag]
    parts += [t.numpy().tobytes() for t in tags]
    data = b"".join(len(p).to_bytes(4, "little") + p for p in parts)
    _BINDING = hashlib.blake2b(data, digest_size=KEY_BYTES, person=b"mpcml-binding").digest()
    log.debug(
        "run binding %s: spec %s, dealer %s, parties %s",
        _BINDING.hex()[:12],
        job.context.hex()[:12],
        job.dealer_tag.hex()[:12],
        " ".join(p.hex()[:12] for p in parts[3:]),
    )
    return job.secret


def _seed_generators(generators: Any) -> None:
    """Seed each torch generator from its stream's next draw.

    CrypTen still draws dropout masks from the torch "global" generator itself, and code beyond
    the two replaced functions may use any of them: seeded from their streams, the parties that
    share a key share a seed (prev with the previous party's next, as CrypTen's
    test_przs_generators checks) and no generator keeps torch's fixed default seed.
    """
    for by_device in generators.values():
        first = next(iter(by_device.values()))
        seed = int(_STREAMS[id(first)].ring((1,)).item())
        for generator in by_device.values():
            generator.manual_seed(seed & (2**63 - 1))


_installed = False


def install() -> None:
    """Route every CrypTen share draw through ChaCha20 (idempotent; before crypten.init)."""
    global _installed
    if _installed:
        return
    import crypten
    import crypten.common.rng as rng
    import crypten.mpc.primitives.arithmetic as arithmetic
    import crypten.mpc.primitives.binary as binary
    import crypten.mpc.provider.tfp_provider as tfp
    import crypten.mpc.provider.ttp_provider as ttp

    for module in (rng, arithmetic, binary, tfp, ttp):
        for name in ("generate_random_ring_element", "generate_kbit_random_tensor"):
            if hasattr(module, name):
                setattr(module, name, globals()[name])
    crypten._setup_prng = _setup_prng
    _installed = True
