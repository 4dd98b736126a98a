"""The measured cost table: rounds and bytes per element of every implementation.

`python -m mpcml.approx.costs` runs each implementation, for every setting of its structural
knobs, on 1024 elements in real 2- and 3-party sessions (separate processes on loopback, the
gRPC data plane), reads CrypTen's own counters (communication rounds, and bytes this party
sent), and writes `costs.json` beside this file, with the command that made it (`--only
softmax reciprocal/range` measures just those and keeps the other rows). Nothing in the table
is written by hand. It counts the data plane only: the dealer's correcting shares to party 0
are not in it (`make bench` measures them). The sessions use CrypTen's TFP provider, which at
3 parties sends one message more per truncation than the dealer does (party 0 hands out the
wrap-count masks that the dealer sends out of band): a 3-party product and its truncation
take 3 rounds here and 2 with the dealer, so the table overstates every 3-party cost alike.

The cost of an implementation on a network is `rounds x RTT + elements x bytes / bandwidth`;
`LAN` and `WAN` are the two networks the tuner knows.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpcml.approx import registry

TABLE = Path(__file__).with_name("costs.json")
ELEMENTS = 1024
COMMAND = "python -m mpcml.approx.costs"


@dataclass(frozen=True)
class Network:
    """What a round and a byte cost."""

    name: str
    rtt_s: float
    bytes_per_s: float


LAN = Network("lan", 0.0005, 1.25e9)
"""0.5 ms round trip, 10 Gbit/s."""
WAN = Network("wan", 0.04, 1.25e7)
"""40 ms round trip, 100 Mbit/s."""
NETWORKS = {n.name: n for n in (LAN, WAN)}


@dataclass(frozen=True)
class Cost:
    """One implementation's measured cost."""

    rounds: int
    bytes_per_element: float

    def seconds(self, elements: int, network: Network) -> float:
        """Its time on `network` for `elements` inputs."""
        return self.rounds * network.rtt_s + elements * self.bytes_per_element / network.bytes_per_s


def settings() -> Iterator[tuple[str, str, dict[str, float]]]:
    """Every (function, implementation, knobs) the table measures.

    Each structural knob over its range (odd degrees only), the others at their defaults.
    """
    for function, table in registry.SPECS.items():
        for name, spec in table.items():
            structural = [k for k in spec.knobs if k.structural]
            ranges = []
            for knob in structural:
                values = range(int(knob.low), int(knob.high) + 1)
                if knob.name == "degree":
                    values = range(int(knob.low), int(knob.high) + 1, 2)
                ranges.append([float(v) for v in values])
            for combination in itertools.product(*ranges):
                given = {k.name: v for k, v in zip(structural, combination, strict=True)}
                yield function, name, registry.knobs(function, name, given)


@functools.cache
def table() -> dict[str, Any]:
    """The committed table."""
    data: dict[str, Any] = json.loads(TABLE.read_text())
    return data


def cost(function: str, name: str, knobs: dict[str, float], parties: int) -> Cost:
    """The measured cost of an implementation (its knobs filled in) with `parties` parties."""
    settings_ = registry.knobs(function, name, knobs)
    by_parties = table()["parties"]
    key = registry.cost_key(function, name, settings_)
    row = by_parties[str(min(max(parties, 2), 3))].get(key)
    if row is None:
        raise registry.PlanError(
            f"{key} is not in the cost table; run `{COMMAND}` after adding an implementation"
        )
    return Cost(int(row["rounds"]), float(row["bytes_per_element"]))


# --- measuring --------------------------------------------------------------------------------


def _input(function: str, name: str, knobs: dict[str, float]) -> Any:
    import torch

    from mpcml.approx.bounds import sample

    x = sample(function, name, knobs).to(torch.float32)
    flat = x.reshape(-1)
    reps = -(-ELEMENTS // flat.numel())
    values = flat.repeat(reps)[:ELEMENTS]
    return values.reshape(-1, x.shape[-1]) if x.dim() == 2 else values


def _chosen(function: str, name: str, only: list[str] | None) -> bool:
    return not only or function in only or f"{function}/{name}" in only


def _party(rank: int, world: int, ports: list[int], out: Any, only: list[str] | None) -> None:
    import crypten
    import crypten.communicator as comm

    import mpcml
    from mpcml.approx.implementations import apply

    peers = [f"127.0.0.1:{p}" for p in ports]
    rows: dict[str, dict[str, float]] = {}
    with mpcml.session(rank, world, peers, insecure=True, session_id=f"costs-{world}"):
        crypten.cfg.communicator.verbose = True
        for function, name, knobs in settings():
            if not _chosen(function, name, only):
                continue
            x = crypten.cryptensor(_input(function, name, knobs), src=0)
            c = comm.get()
            c.barrier()
            c.reset_communication_stats()
            began = time.perf_counter()
            apply(function, name, x, knobs)
            seconds = time.perf_counter() - began
            stats = c.get_communication_stats()
            rows[registry.cost_key(function, name, knobs)] = {
                "rounds": int(stats["rounds"]),
                "bytes_per_element": float(stats["bytes"]) / ELEMENTS,
                "loopback_seconds": round(seconds, 4),
            }
            c.barrier()
    if rank == 0:
        out.put(rows)


def measure(world: int, only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Every (chosen) setting's cost with `world` parties, from party 0's counters."""
    from mpcml.transport.address import free_ports

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ports = free_ports(world)
    processes = [
        ctx.Process(target=_party, args=(r, world, ports, out, only)) for r in range(world)
    ]
    for p in processes:
        p.start()
    try:
        rows: dict[str, dict[str, float]] = out.get(timeout=1800)
    finally:
        for p in processes:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return rows


DOC = Path(__file__).resolve().parents[2] / "docs" / "approximations.md"
BEGIN, END = "<!-- table: begin -->", "<!-- table: end -->"


def markdown() -> str:
    """The registry at its defaults, with bounds and the committed costs, as a Markdown table."""
    from mpcml.approx.bounds import error_bound

    lines = [
        "| function | implementation | knobs (defaults) | domain | error bound | rounds 2p / 3p |"
        " bytes per element 2p / 3p |",
        "|---|---|---|---|---|---|---|",
    ]
    for function, name, settings in defaults():
        spec = registry.spec(function, name)
        knobs = ", ".join(f"{k}={v:g}" for k, v in settings.items()) or "-"
        lo, hi = registry.domain(function, name, settings)
        bound = error_bound(function, name, settings)
        scale = {"absolute": "", "relative": " rel.", "relative1": " rel. (min 1)"}[spec.scale]
        two, three = (cost(function, name, dict(settings), p) for p in (2, 3))
        lines.append(
            f"| {function} | {name} | {knobs} | [{lo:.4g}, {hi:.4g}] | {bound:.3g}{scale} | "
            f"{two.rounds} / {three.rounds} | {two.bytes_per_element:.0f} / "
            f"{three.bytes_per_element:.0f} |"
        )
    return "\n".join(lines) + "\n"


def defaults() -> Iterator[tuple[str, str, dict[str, float]]]:
    """Every implementation at its default knobs."""
    for function, table in registry.SPECS.items():
        for name in table:
            yield function, name, registry.knobs(function, name, {})


def document(text: str) -> str:
    """`text` (docs/approximations.md) with its table replaced by `markdown()`."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Measure the table and write it, and the table of docs/approximations.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument(
        "--doc-only", action="store_true", help="only rewrite the docs' table from costs.json"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="FUNCTION[/IMPLEMENTATION]",
        help="measure only these, keeping the committed rows of the others",
    )
    args = parser.parse_args(argv)
    if args.doc_only:
        DOC.write_text(document(DOC.read_text()))
        return 0
    began = time.monotonic()
    data: dict[str, Any] = {
        "command": COMMAND,
        "elements": ELEMENTS,
        "note": "rounds: CrypTen's communication rounds; bytes_per_element: bytes party 0 "
        "sent per input element; loopback_seconds: party 0's wall time on 127.0.0.1 (info)",
        "parties": {str(world): measure(world, args.only) for world in (2, 3)},
    }
    if args.only:  # the committed rows, with the measured ones replaced
        for world, rows in table()["parties"].items():
            data["parties"][world] = {**rows, **data["parties"][world]}
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if args.out == TABLE:
        table.cache_clear()
        DOC.write_text(document(DOC.read_text()))
    print(
        f"wrote {args.out}: {len(data['parties']['2'])} settings at 2 and 3 parties in "
        f"{time.monotonic() - began:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
