"""One benchmark process: `python -m bench.party SPEC.json`, started by `bench/transport.py`.

Each party is its own interpreter so that the numbers include what real parties pay (their own
GIL, their own sockets). The spec is plain JSON; the process writes its result as JSON to
`spec["out"]` and exits 0, or writes the traceback and exits 1.

Roles:
- `grpc-mpc`: one party of the MPC workloads inside `mpcml.session` (gRPC, mTLS), on CrypTen's
  TFP provider or, with `dealer` set, on mpcml's dealer.
- `gloo-mpc`: a launcher that runs every party of the same workloads on stock CrypTen over
  torch.distributed/gloo, with CrypTen's own `run_multiprocess` (which forks the parties).
- `grpc-tput`: one end of the two-party throughput test over CrypTen's communicator in a session.
- `gloo-tput`: a launcher running both ends of that test on stock CrypTen over gloo.
- `tcp-tput`: one end of the same test over a plain TCP socket.
- `grpc-bare-tput`: one end of the same test over a bare gRPC stream, without mpcml.
- `gpu-model`: one party of bench/gpu.py's CNN rows, on the device its spec names.
- `transformer`, `scaling`: one party of bench/transformers.py's and bench/scaling.py's runs.
- `scaling-gloo`: a launcher running every party of bench/scaling.py's epoch on stock CrypTen.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mpcml  # first: its import hook lets crypten load on current torch

TORCH_THREADS = 1
"""Intra-op threads per party: 3 parties share 2 cores, so more would only contend."""


# -- MPC workloads -----------------------------------------------------------------------------


def grpc_mpc(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from bench import workloads
    from mpcml.runtime import compat

    compat.stock()  # CrypTen as shipped (config reads, comparisons)
    torch.set_num_threads(TORCH_THREADS)
    from mpcml.runtime.provider import DealerEndpoint

    tls = mpcml.TLSFiles(**spec["tls"]) if spec["tls"] is not None else None
    with mpcml.session(
        rank=spec["rank"],
        world_size=spec["world_size"],
        peers=spec["peers"],
        peer_names=spec["peer_names"],
        tls=tls,
        insecure=tls is None,
        session_id=spec["session_id"],
        dealer=DealerEndpoint(spec["dealer"]) if spec.get("dealer") else None,
    ):
        return workloads.run(spec["workloads"], spec["reps"], spec["warmup"])


def _gloo_party(names: list[str], reps: int, warmup: int) -> dict[str, Any]:
    import crypten.communicator as comm
    import torch

    from bench import workloads
    from mpcml.runtime import compat

    compat.stock()  # CrypTen as shipped (config reads, comparisons)
    torch.set_num_threads(TORCH_THREADS)
    result = workloads.run(names, reps, warmup)
    result["rank"] = comm.get().get_rank()
    result["backend"] = comm.get().get_distributed_backend()
    return result


def _gloo_launch(
    func: Callable[..., dict[str, Any]], world_size: int, *args: Any
) -> dict[str, Any]:
    from mpcml.runtime import compat

    compat.apply()
    from crypten.mpc.context import run_multiprocess

    # Keep gloo on loopback (it would otherwise pick the interface the hostname resolves to).
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    results = run_multiprocess(world_size=world_size)(func)(*args)
    if results is None or len(results) != world_size:
        raise SystemExit("a gloo party failed (CrypTen's launcher logged which)")
    return {"parties": results}


def gloo_mpc(spec: dict[str, Any]) -> dict[str, Any]:
    return _gloo_launch(
        _gloo_party, spec["world_size"], spec["workloads"], spec["reps"], spec["warmup"]
    )


# -- throughput --------------------------------------------------------------------------------


def _tput_loop(rank: int, plan: list[list[int]]) -> dict[str, list[float]]:
    # Runs inside a live CrypTen communicator (mpcml's or gloo's): the same calls on both.
    import crypten.communicator as comm
    import torch

    c = comm.get()
    ack = torch.zeros(1, dtype=torch.long)
    out: dict[str, list[float]] = {}
    for nbytes, count, trials in plan:
        g = torch.Generator().manual_seed(nbytes)
        tensor = torch.randint(-(2**62), 2**62, (nbytes // 8,), generator=g)
        seconds = []
        for trial in range(trials + 1):  # the first trial warms the stream up, untimed
            c.barrier()
            start = time.perf_counter()
            if rank == 0:
                for _ in range(count):
                    c.send(tensor, 1)
                c.recv(ack, 1)
            else:
                for _ in range(count):
                    c.recv(tensor, 0)
                c.send(ack, 0)
            if trial:
                seconds.append(time.perf_counter() - start)
        out[str(nbytes)] = seconds
    return out


SMALL_ROUNDS, SMALL_WARMUP = 2000, 200
"""Rounds of the small-message test, after untimed ones."""


def _small_rounds() -> dict[str, float]:
    """Wall and CPU seconds (this process, all its threads) per all_reduce of 8 elements.

    The cost of one communication round of CrypTen's with nothing to compute: what the data
    plane alone adds to every round of a protocol.
    """
    import crypten.communicator as comm
    import torch

    c = comm.get()
    tensor = torch.arange(8, dtype=torch.long)
    for _ in range(SMALL_WARMUP):
        c.all_reduce(tensor)
    c.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(SMALL_ROUNDS):
        c.all_reduce(tensor)
    return {
        "wall": (time.perf_counter() - wall) / SMALL_ROUNDS,
        "cpu": (time.process_time() - cpu) / SMALL_ROUNDS,
    }


def grpc_tput(spec: dict[str, Any]) -> dict[str, Any]:
    tls = mpcml.TLSFiles(**spec["tls"]) if spec["tls"] is not None else None
    with mpcml.session(
        rank=spec["rank"],
        world_size=2,
        peers=spec["peers"],
        peer_names=spec["peer_names"],
        tls=tls,
        insecure=tls is None,
        session_id=spec["session_id"],
    ):
        return {"seconds": _tput_loop(spec["rank"], spec["plan"]), "round": _small_rounds()}


def _gloo_tput_party(plan: list[list[int]]) -> dict[str, Any]:
    import crypten.communicator as comm

    return {"seconds": _tput_loop(comm.get().get_rank(), plan), "round": _small_rounds()}


def gloo_tput(spec: dict[str, Any]) -> dict[str, Any]:
    return _gloo_launch(_gloo_tput_party, 2, spec["plan"])


def grpc_bare_tput(spec: dict[str, Any]) -> dict[str, Any]:
    """One end of the throughput test on a bare gRPC stream: gRPC-python's own ceiling.

    Pre-built 4 MiB messages over mTLS with mpcml's channel options, and none of mpcml's
    framing, copies or inboxes.
    """
    from concurrent import futures

    import grpc

    from mpcml.transport import options
    from mpcml.transport import tls as tls_files

    tls = mpcml.TLSFiles(**spec["tls"])
    chunk = options.CHUNK_BYTES
    if spec["rank"] == 1:
        finished = threading.Event()

        def consume(messages: Any, context: grpc.ServicerContext) -> bytes:
            return str(sum(len(m) for m in messages)).encode()

        def stop(request: bytes, context: grpc.ServicerContext) -> bytes:
            finished.set()
            return b""

        handlers = {
            "Stream": grpc.stream_unary_rpc_method_handler(consume),
            "Stop": grpc.unary_unary_rpc_method_handler(stop),
        }
        server = grpc.server(futures.ThreadPoolExecutor(4), options=options.server_options(chunk))
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Bare", handlers),)
        )
        server.add_secure_port(spec["address"], tls_files.server_credentials(tls))
        server.start()
        finished.wait(120)
        server.stop(0)
        return {}
    channel = grpc.secure_channel(
        spec["address"],
        tls_files.channel_credentials(tls),
        options=options.channel_options(chunk, "party1"),
    )
    grpc.channel_ready_future(channel).result(timeout=30)
    stream = channel.stream_unary("/bench.Bare/Stream", None, None)
    out: dict[str, list[float]] = {}
    for nbytes, count, trials in spec["plan"]:
        payload = os.urandom(min(nbytes, chunk))
        messages = count * max(1, nbytes // chunk)
        seconds = []
        for trial in range(trials + 1):  # the first trial warms the stream up, untimed
            start = time.perf_counter()
            stream(iter([payload] * messages), timeout=60)
            if trial:
                seconds.append(time.perf_counter() - start)
        out[str(nbytes)] = seconds
    channel.unary_unary("/bench.Bare/Stop", None, None)(b"", timeout=10)
    channel.close()
    return {"seconds": out}


def _recv_exact(conn: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = conn.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("peer closed the socket early")
        got += n


def tcp_tput(spec: dict[str, Any]) -> dict[str, Any]:
    rank, port = spec["rank"], spec["port"]
    deadline = time.monotonic() + 30
    if rank == 1:
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(30)
            conn, _ = server.accept()
    else:
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    out: dict[str, list[float]] = {}
    sync = memoryview(bytearray(1))
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for nbytes, count, trials in spec["plan"]:
            buf = memoryview(bytearray(random.Random(nbytes).randbytes(nbytes)))
            seconds = []
            for trial in range(trials + 1):
                # Rank 1 says it is ready (what the barrier does on the other transports).
                if rank == 1:
                    conn.sendall(b"r")
                else:
                    _recv_exact(conn, sync)
                start = time.perf_counter()
                if rank == 0:
                    for _ in range(count):
                        conn.sendall(buf)
                    _recv_exact(conn, sync)
                else:
                    for _ in range(count):
                        _recv_exact(conn, buf)
                    conn.sendall(b"a")
                if trial:
                    seconds.append(time.perf_counter() - start)
            out[str(nbytes)] = seconds
    return {"seconds": out}


def gpu_model(spec: dict[str, Any]) -> dict[str, Any]:
    from bench import gpu

    return gpu.party(spec)


def transformer(spec: dict[str, Any]) -> dict[str, Any]:
    from bench import transformers
    from bench.sessions import open_session

    with open_session(spec) as session:
        return transformers.party(spec, session)


def scaling(spec: dict[str, Any]) -> dict[str, Any]:
    from bench import scaling as scaling_bench
    from bench.sessions import open_session

    with open_session(spec) as session:
        return scaling_bench.party(spec, session)


class _GlooSession:
    """What bench/scaling.py's party reads of a session, on stock CrypTen's communicator."""

    def __init__(self) -> None:
        import crypten.communicator as comm

        self.rank = comm.get().get_rank()
        self.world_size = comm.get().get_world_size()

    def communication_stats(self) -> dict[str, int]:
        import crypten.communicator as comm

        stats = comm.get().get_communication_stats()
        return {"rounds": int(stats["rounds"]), "bytes": int(stats["bytes"])}


def _scaling_gloo_party(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from bench import scaling as scaling_bench
    from mpcml.runtime import compat

    compat.stock()
    torch.set_num_threads(TORCH_THREADS)
    return scaling_bench.party(spec, _GlooSession())


def scaling_gloo(spec: dict[str, Any]) -> dict[str, Any]:
    """bench/scaling.py's epoch on stock CrypTen: gloo, its TFP provider, its launcher."""
    return _gloo_launch(_scaling_gloo_party, spec["world_size"], spec)


def psi(spec: dict[str, Any]) -> dict[str, Any]:
    """One party of bench/psi.py: mpcml's PSI over the session's data plane."""
    import time

    from bench import psi as psi_bench
    from bench.sessions import open_session, peak_rss
    from mpcml.party.inputs import CommChannel
    from mpcml.psi.protocol import intersect

    with open_session(spec) as session:
        mine = [i.encode() for i in psi_bench.ids(spec["rank"], spec["n"])]
        ranks = list(range(spec["world_size"]))
        before = sum(session.traffic.sent)
        began = time.perf_counter()
        found = intersect(mine, spec["rank"], ranks, CommChannel())
        seconds = time.perf_counter() - began
        sent = sum(session.traffic.sent) - before
    return {"seconds": seconds, "bytes": sent, "shared": found.size, "peak_rss": peak_rss()}


ROLES = {
    "psi": psi,
    "grpc-mpc": grpc_mpc,
    "gloo-mpc": gloo_mpc,
    "grpc-tput": grpc_tput,
    "gloo-tput": gloo_tput,
    "tcp-tput": tcp_tput,
    "grpc-bare-tput": grpc_bare_tput,
    "gpu-model": gpu_model,
    "transformer": transformer,
    "scaling": scaling,
    "scaling-gloo": scaling_gloo,
}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    out = Path(spec["out"])
    try:
        result = ROLES[spec["role"]](spec)
    except BaseException as exc:  # reported to the driver, which prints it
        out.write_text(
            json.dumps(
                {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
            )
        )
        return 1
    out.write_text(json.dumps({"ok": True, "result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
