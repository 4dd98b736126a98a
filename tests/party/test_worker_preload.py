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
from typing import Any

import pytest
import torch

from mpcml.party.pool import WORKER_PRELOAD, worker_context

NO_CUDA = "no CUDA device on this machine: a worker's own CUDA use is checked only where one is"
DAEMON = ["mpcml.party.daemon", "mpcml.party.pool", "mpcml.party.config"]
"""What the party daemon process imports: it starts the fork server and must not touch CUDA."""

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


@pytest.mark.parametrize("modules", [WORKER_PRELOAD, DAEMON], ids=["fork-server", "daemon"])
def test_importing_the_worker_preload_never_touches_cuda(modules: list[str]) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, *modules],
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


def _cuda_state(conn: Connection, use: bool) -> None:
    """A job worker's view: did it inherit CUDA state, and (with `use`) can it compute there."""
    state: dict[str, Any] = {
        "initialized": torch.cuda.is_initialized(),  # type: ignore[no-untyped-call]
        # True in a child of a process that had initialised CUDA: such a child cannot use it.
        "bad_fork": torch.cuda._is_in_bad_fork(),
    }
    if use:
        from mpcml.runtime import blocks

        x = torch.randint(-(2**63), 2**63 - 1, (4, 600))
        y = torch.randint(-(2**63), 2**63 - 1, (600, 3))
        state["exact_on_cuda"] = torch.equal(blocks.matmul(x, y, device="cuda").cpu(), x @ y)
    conn.send(state)


def _worker_state(use: bool) -> dict[str, Any]:
    ctx = worker_context()
    parent, child = ctx.Pipe()
    worker = ctx.Process(target=_cuda_state, args=(child, use))
    worker.start()
    try:
        assert parent.poll(120), "the worker never reported"
        state: dict[str, Any] = parent.recv()
        return state
    finally:
        worker.join(30)


def test_a_job_worker_inherits_no_cuda_context_from_the_fork_server() -> None:
    assert _worker_state(use=False) == {"initialized": False, "bad_fork": False}


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_job_workers_one_after_another_compute_on_cuda() -> None:
    # The first worker initialises CUDA; the fork server, which never did, forks the second.
    for _ in range(2):
        state = _worker_state(use=True)
        assert state == {"initialized": False, "bad_fork": False, "exact_on_cuda": True}
