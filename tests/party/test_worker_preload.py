"""Job workers fork from a server that imported `WORKER_PRELOAD`: it must not touch CUDA.

A process forked from one that initialised CUDA cannot use CUDA (docs/architecture.md), so a GPU
party's workers depend on the imports leaving CUDA alone. Checked on every machine by making
each entry point into CUDA record its caller while the modules are imported in a fresh
interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from multiprocessing.connection import Connection

from mpcml.party.pool import WORKER_PRELOAD, worker_context

_PROBE = """
import importlib, json, sys
import torch
calls = []
def recorder(name):
    def call(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"torch.cuda.{name} called while importing the worker preload")
    return call
for name in ("_lazy_init", "init", "is_available", "device_count", "current_device",
             "set_device", "get_device_name", "get_device_properties", "manual_seed",
             "manual_seed_all"):
    setattr(torch.cuda, name, recorder(name))
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps({"calls": calls, "initialized": torch.cuda.is_initialized()}))
"""


def test_importing_the_worker_preload_never_touches_cuda() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, *WORKER_PRELOAD],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout.splitlines()[-1])
    assert result == {"calls": [], "initialized": False}, result


def _loaded(conn: Connection) -> None:
    conn.send({name: name in sys.modules for name in ("crypten", "torch._dynamo")})


def test_workers_start_from_the_fork_server_with_crypten_and_torch_warm() -> None:
    ctx = worker_context()
    assert ctx.get_start_method() == "forkserver"
    parent, child = ctx.Pipe()
    worker = ctx.Process(target=_loaded, args=(child,))
    worker.start()
    try:
        assert parent.poll(120), "the worker never reported"
        assert parent.recv() == {"crypten": True, "torch._dynamo": True}
    finally:
        worker.join(30)
