"""Private set intersection: seconds and bytes per id at 10^4-10^6 ids per party.

Each party holds `n` string ids, half of them shared by every party, and runs mpcml's ECDH-PSI
(mpcml/psi) as a job worker does: one process per party, in an `mpcml.session` (gRPC, mutual
TLS), the group arithmetic from libsodium through PyNaCl on the party's threads. Beside it, on
the same sets, OpenMined's `openmined-psi` (two parties: its client and server in one process,
as its own benchmarks run it; it pins protobuf 6, so it runs in an environment of its own,
`.venv-psi`, made by `make bench`), and SecretFlow's two-party ECDH-PSI and RR22 from the `spu`
wheel (`.venv-spu`, numpy < 2). Target (issue 29): 10^6 x 10^6 ids under 3 minutes on this
2-core machine. Run by `make bench`; `--quick` stops at 10^5.

Then the datasets those ids come from: a 10^6-row, 30-column table with string ids, as CSV and
as Parquet, registered (`describe`) and loaded (`read`) by the party's catalogue in a fresh
process each: seconds, and the process's peak memory above its resident size before the load.
"""

from __future__ import annotations

import argparse
import json
import os
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


LOAD = """
import json, resource, sys, time
from pathlib import Path
from mpcml.party import catalogue
from mpcml.party.config import DatasetEntry
entry = DatasetEntry(name="customers", path=Path(sys.argv[1]), id_column="id")
page_kib = resource.getpagesize() // 1024
before = int(open("/proc/self/statm").read().split()[1]) * page_kib  # resident now, KiB
began = time.perf_counter()
info = catalogue.describe(entry)
described = time.perf_counter()
table = catalogue.read(entry)
read = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert info.rows == len(table.values) and table.ids is not None
print(json.dumps({"describe_s": described - began, "read_s": read - described,
                  "peak_mib": (peak - before) / 1024, "values_mib": table.values.nbytes / 2**20,
                  "ids_mib": table.ids.nbytes / 2**20}))
"""


def load_bench(tmp: Path, rows: int, columns: int) -> list[dict[str, Any]]:
    """Write one table as CSV and Parquet; describe and read each in a fresh process."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": ids(0, rows),
            **{f"x{j}": rng.standard_normal(rows).astype(np.float32) for j in range(columns)},
        }
    )
    paths = [tmp / "customers.csv", tmp / "customers.parquet"]
    pacsv.write_csv(table, paths[0])
    pq.write_table(table, paths[1])
    del table
    out = []
    for path in paths:
        run = subprocess.run(
            [sys.executable, "-c", LOAD, str(path)],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        if run.returncode:
            raise RuntimeError(f"loading {path.name} failed: {run.stderr.strip()[-800:]}")
        figures = json.loads(run.stdout.strip().splitlines()[-1])
        out.append({"format": path.suffix[1:], "file_mib": path.stat().st_size / 2**20, **figures})
    return out


SPU_PYTHON = ROOT / ".venv-spu" / "bin" / "python"
SPU = """
import json, sys, time
import spu.libspu as libspu
import spu.psi as psi
rank, protocol, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ports = [int(p) for p in sys.argv[4].split(",")]
desc = libspu.link.Desc()
desc.recv_timeout_ms = 3_600_000
for i, port in enumerate(ports):
    desc.add_party(f"party{i}", f"127.0.0.1:{port}")
link = libspu.link.create_brpc(desc, rank)
config = psi.PsiExecuteConfig(
    protocol_conf=psi.PsiProtocolConfig(
        protocol=getattr(psi.PsiProtocol, f"PROTOCOL_{protocol.upper()}"),
        receiver_rank=0,
        broadcast_result=True,
        ecdh_params=psi.EcdhParams(curve=psi.EllipticCurveType.CURVE_25519),
    ),
    input_params=psi.InputParams(
        path=f"{folder}/ids{rank}.csv", selected_keys=["id"], keys_unique=True
    ),
    output_params=psi.OutputParams(path=f"{folder}/out{rank}.csv", disable_alignment=True),
)
link.barrier()
began = time.perf_counter()
report = psi.psi_execute(config, link)
seconds = time.perf_counter() - began
link.stop_link()
print("RESULT " + json.dumps({"seconds": seconds, "shared": report.intersection_count}))
"""


def _loopback_bytes() -> int:
    """Bytes sent on the loopback interface so far (Linux), for peers that count none."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])
    return 0


def spu_psi(n: int, protocol: str, tmp: Path) -> dict[str, Any] | None:
    """SecretFlow's two-party PSI (`spu.psi.psi_execute`) on the same sets.

    From CSV files, as it reads them; one process per party over brpc on loopback. It exposes
    no byte count: the loopback interface's bytes during the run (both parties, TCP/IP headers
    included) stand in.
    """
    if not SPU_PYTHON.exists():
        return None
    from mpcml.transport.address import free_ports

    folder = tmp / f"spu-{protocol}-{n}"
    folder.mkdir(exist_ok=True)
    for rank in (0, 1):
        (folder / f"ids{rank}.csv").write_text("id\n" + "\n".join(ids(rank, n)) + "\n")
    ports = ",".join(str(p) for p in free_ports(2))
    before = _loopback_bytes()
    runs = [
        subprocess.Popen(
            [str(SPU_PYTHON), "-c", SPU, str(rank), protocol, str(folder), ports],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [r.communicate(timeout=3600) for r in runs]
    sent = _loopback_bytes() - before
    if any(r.returncode for r in runs):
        print(f"spu psi {protocol} failed: {outs[0][1].strip()[-500:]}", file=sys.stderr)
        return None
    figures = [
        json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
        for out, _ in outs
    ]
    return {
        "n": n,
        "protocol": protocol,
        "seconds": max(f["seconds"] for f in figures),
        "bytes_per_id": sent / 2 / n,
        "shared": figures[0]["shared"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10^4 and 10^5 ids only")
    parser.add_argument("--sizes", type=int, nargs="+", help="ids per party (default 10^4-10^6)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--load-rows", type=int, default=1_000_000, help="rows of the load table")
    parser.add_argument("--no-psi", action="store_true", help="the load table only")
    args = parser.parse_args()
    sizes = args.sizes or (SIZES[:2] if args.quick else SIZES)
    rows: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []
    spus: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mpcml-psi-") as folder:
        tmp = Path(folder)
        pki = make_pki(tmp / "pki", NAMES)
        for n in [] if args.no_psi else sizes:
            for parties in PARTIES:
                rows.append(mpcml_psi(n, parties, tmp, pki))
                print(
                    f"mpcml {parties} parties, {n} ids: {rows[-1]['seconds']:.1f} s",
                    file=sys.stderr,
                )
            peer = openmined_psi(n)
            if peer is not None:
                peers.append(peer)
            for protocol in ("ecdh", "rr22"):
                theirs = spu_psi(n, protocol, tmp)
                if theirs is not None:
                    spus.append(theirs)
                    print(f"spu {protocol}, {n} ids: {theirs['seconds']:.1f} s", file=sys.stderr)
        loads = load_bench(tmp, args.load_rows, 30)
    print(
        "| ids per party | parties | mpcml s | mpcml B/id | shared found | peak MiB/party "
        "| openmined-psi s | its B/id | SPU ECDH s | its B/id | SPU RR22 s | its B/id |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_n = {p["n"]: p for p in peers}
    by_spu = {(p["n"], p["protocol"]): p for p in spus}
    for r in rows:
        cells = []
        for peer in (by_n.get(r["n"]), by_spu.get((r["n"], "ecdh")), by_spu.get((r["n"], "rr22"))):
            if peer is None or r["parties"] != 2:
                cells.append("- | -")
            else:
                cells.append(f"{peer['seconds']:.1f} | {peer['bytes_per_id']:.0f}")
        print(
            f"| {r['n']:,} | {r['parties']} | {r['seconds']:.1f} | {r['bytes_per_id']:.0f} | "
            f"{r['shared']:,} | {r['peak_mib']:.0f} | {' | '.join(cells)} |"
        )
    print(
        "peers: two parties only. openmined-psi runs client and server in one process; SPU runs "
        "one process per party over brpc, its bytes counted on the loopback interface (TCP/IP "
        "headers included)."
    )
    print()
    print(
        f"| {args.load_rows:,} rows x 30 columns | file MiB | describe s | read s "
        "| peak MiB over start | values MiB | ids MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for load in loads:
        print(
            f"| {load['format']} | {load['file_mib']:.0f} | {load['describe_s']:.2f} | "
            f"{load['read_s']:.2f} | {load['peak_mib']:.0f} | {load['values_mib']:.0f} | "
            f"{load['ids_mib']:.0f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"mpcml": rows, "openmined": peers, "spu": spus, "load": loads})
        )


if __name__ == "__main__":
    main()
