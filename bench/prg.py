"""Throughput of mpcml's ChaCha20 share randomness against `torch.randint` with a generator.

What CrypTen draws is uniform int64 ring elements; each row draws `SIZE_MIB` MiB of them,
`REPEATS` times, and reports the best MiB/s. Target (issue 4): ChaCha20 at least half of
`torch.randint`'s speed on the CPU. A second table gives the cost of one small draw: CrypTen
draws thousands of tensors of a few dozen elements per training epoch, so that fixed cost
weighs as much as the throughput. Run by `make bench`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpcml.runtime.prg import ChaChaStream, keystream_torch  # noqa: E402

SIZE_MIB = 64
REPEATS = 5
SMALL = (32, 30)
"""One small draw: a batch of 32 rows of the demo's 30 features."""
SMALL_DRAWS = 2000


def rate(draw: Callable[[], object], sync: Callable[[], None] = lambda: None) -> float:
    """Best MiB/s over REPEATS draws of SIZE_MIB."""
    draw()
    sync()
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        draw()
        sync()
        best = min(best, time.perf_counter() - start)
    return SIZE_MIB / best


def per_draw_us(draw: Callable[[], object]) -> float:
    """Mean microseconds of one small draw over SMALL_DRAWS of them."""
    draw()
    start = time.perf_counter()
    for _ in range(SMALL_DRAWS):
        draw()
    return (time.perf_counter() - start) / SMALL_DRAWS * 1e6


def main() -> None:
    """Print the table."""
    n = SIZE_MIB * 2**20 // 8
    key = os.urandom(32)
    stream = ChaChaStream(key)
    generator = torch.Generator().manual_seed(1)
    rows = [
        (
            "cpu",
            "torch.randint (mt19937)",
            rate(lambda: torch.randint(-(2**63), 2**63 - 1, (n,), generator=generator)),
        ),
        ("cpu", "ChaCha20, OpenSSL (what mpcml uses)", rate(lambda: stream.ring((n,)))),
        ("cpu", "ChaCha20, torch kernel", rate(lambda: keystream_torch(key, bytes(12), 8 * n))),
    ]
    if torch.cuda.is_available():
        cuda = torch.Generator(device="cuda").manual_seed(1)
        sync = torch.cuda.synchronize
        rows += [
            (
                "cuda",
                "torch.randint (Philox)",
                rate(
                    lambda: torch.randint(-(2**63), 2**63 - 1, (n,), generator=cuda, device="cuda"),
                    sync,
                ),
            ),
            (
                "cuda",
                "ChaCha20, torch kernel (what mpcml uses)",
                rate(lambda: stream.ring((n,), device="cuda"), sync),
            ),
        ]
    print(f"share randomness: best of {REPEATS} draws of {SIZE_MIB} MiB of int64 ring elements")
    print(f"{'device':<6} {'generator':<42} {'MiB/s':>9} {'vs randint':>10}")
    base = {dev: r for dev, name, r in rows if name.startswith("torch.randint")}
    for device, name, r in rows:
        print(f"{device:<6} {name:<42} {r:>9.0f} {r / base[device]:>10.2f}")
    chacha = next(r for d, name, r in rows if d == "cpu" and "mpcml uses" in name)
    verdict = "PASS" if chacha >= 0.5 * base["cpu"] else "MISS"
    print(f"target: ChaCha20 >= 0.5 x torch.randint on cpu: {chacha / base['cpu']:.2f} {verdict}")
    print()
    small = [
        (
            "torch.randint (mt19937)",
            per_draw_us(lambda: torch.randint(-(2**63), 2**63 - 1, SMALL, generator=generator)),
        ),
        ("ChaCha20, OpenSSL (what mpcml uses)", per_draw_us(lambda: stream.ring(SMALL))),
    ]
    print(f"one small draw on cpu: {SMALL[0]}x{SMALL[1]} int64, mean of {SMALL_DRAWS}")
    print(f"{'generator':<42} {'us/draw':>9}")
    for name, us in small:
        print(f"{name:<42} {us:>9.1f}")


if __name__ == "__main__":
    main()
