"""Private set intersection: seconds and bytes per id at 10^4-10^6 ids per party.

Each party holds `n` string ids, half of them shared by every party, and runs mpcml's ECDH-PSI
(mpcml/psi) as a job worker does: one process per party, in an `mpcml.session` (gRPC, mutual
TLS), the group arithmetic from libsodium through PyNaCl on the party's threads. Beside it, on
the same sets, OpenMined's `openmined-psi` (two parties: its client and server in one process,
as its own benchmarks run it; it pins protobuf 6, so it runs in an environment of its own,
`.venv-psi`, made by `make bench`). Target (issue 29): 10^6 x 10^6 ids under 3 minutes on this
2-core machine. Run by `make bench`; `--quick` stops at 10^5.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sessions import run_parties  # noqa: E402
from tests.support.parties import make_pki  # noqa: E402

PSI_VENV = ROOT / ".venv-psi"
SIZES = (10_000, 100_000, 1_000_000)
PARTIES = (2, 3)


def ids(rank: int, n: int) -> list[str]:
    """Party `rank`'s ids: the first half shared by every party, the rest its own."""
    shared = n // 2
    return [f"customer-{i}@bank.example" for i in range(shared)] + [
        f"party{rank}-{i}@bank.example" for i in range(n - shared)
    ]


NAMES = ["alice", "bob", "carol"]


def mpcml_psi(n: int, parties: int, tmp: Path, pki: dict[str, dict[str, str]]) -> dict[str, Any]:
    results = run_parties(
        tmp,
        {name: pki[name] for name in NAMES[:parties]},
        f"psi-{parties}-{n}",
        lambda rank: {"role": "psi", "n": n},
        timeout=1800,
        provider="none",
    )
    return {
        "parties": parties,
        "n": n,
        "seconds": max(r["seconds"] for r in results),
        "bytes_per_id": results[0]["bytes"] / n,
        "shared": results[0]["shared"],
        "peak_mib": max(r["peak_rss"] for r in results) / 2**20,
    }


OPENMINED = """
import json, sys, time
import private_set_intersection.python as psi
n = int(sys.argv[1])
def ids(rank):
    shared = n // 2
    return [f"customer-{i}@bank.example" for i in range(shared)] + [
        f"party{rank}-{i}@bank.example" for i in range(n - shared)]
client_items, server_items = ids(0), ids(1)
began = time.perf_counter()
client = psi.client.CreateWithNewKey(True)
server = psi.server.CreateWithNewKey(True)
setup = server.CreateSetupMessage(1e-9, len(client_items), server_items, psi.DataStructure.RAW)
request = client.CreateRequest(client_items)
response = server.ProcessRequest(request)
found = client.GetIntersectionSize(setup, response)
seconds = time.perf_counter() - began
wire = sum(len(m.SerializeToString()) for m in (setup, request, response))
print(json.dumps({"seconds": seconds, "bytes": wire, "shared": found}))
"""


def openmined_psi(n: int) -> dict[str, Any] | None:
    python = PSI_VENV / "bin" / "python"
    if not python.exists():
        return None
    run = subprocess.run(
        [str(python), "-c", OPENMINED, str(n)], capture_output=True, text=True, timeout=3600
    )
    if run.returncode:
        print(f"openmined-psi failed: {run.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    out = json.loads(run.stdout.strip().splitlines()[-1])
    return {
        "n": n,
        "seconds": out["seconds"],
        "bytes_per_id": out["bytes"] / n,
        "shared": out["shared"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10^4 and 10^5 ids only")
    parser.add_argument("--sizes", type=int, nargs="+", help="ids per party (default 10^4-10^6)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    sizes = args.sizes or (SIZES[:2] if args.quick else SIZES)
    rows: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mpcml-psi-") as folder:
        tmp = Path(folder)
        pki = make_pki(tmp / "pki", NAMES)
        for n in sizes:
            for parties in PARTIES:
                rows.append(mpcml_psi(n, parties, tmp, pki))
                print(
                    f"mpcml {parties} parties, {n} ids: {rows[-1]['seconds']:.1f} s",
                    file=sys.stderr,
                )
            peer = openmined_psi(n)
            if peer is not None:
                peers.append(peer)
    print(
        "| ids per party | parties | mpcml s | mpcml B/id | shared found | peak MiB/party "
        "| openmined-psi s (2 parties) | its B/id |"
    )
    print("|---|---|---|---|---|---|---|---|")
    by_n = {p["n"]: p for p in peers}
    for r in rows:
        peer = by_n.get(r["n"]) if r["parties"] == 2 else None
        theirs = f"{peer['seconds']:.1f} | {peer['bytes_per_id']:.0f}" if peer else "- | -"
        print(
            f"| {r['n']:,} | {r['parties']} | {r['seconds']:.1f} | {r['bytes_per_id']:.0f} | "
            f"{r['shared']:,} | {r['peak_mib']:.0f} | {theirs} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"mpcml": rows, "openmined": peers}))


if __name__ == "__main__":
    main()
