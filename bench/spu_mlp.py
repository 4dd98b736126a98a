"""SecretFlow's SPU training the bench's Tanh MLP: the peer beside stock CrypTen in bench/train.py.

Runs in an environment of its own (SPU pins numpy < 2 and jax 0.4.34; `make bench` makes it in
`.venv-spu`); imports nothing of mpcml. bench/train.py writes the rows, labels and initial
weights it trains mpcml and CrypTen on to an .npz and runs, in that environment:

- `share SPEC`: every input secret-shared for SPU's 3-party ABY3 protocol (64-bit ring), one file
  per party (sharing is not timed, as in the other rows);
- `party SPEC RANK`: one of the three parties, a process of its own linked to the others over
  loopback by SPU's brpc link (no TLS: SPU's default), running the jax training step the
  compiler made of the same model, loss and optimiser (softmax cross-entropy by jax.grad, SGD
  with momentum), batch after batch; it writes its seconds per epoch and its shares of the
  final weights;
- `reveal SPEC`: the final weights put together, and the test accuracy they give.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PARTIES = 3
WEIGHTS = ("w1", "b1", "w2", "b2")


def _config() -> Any:
    import spu.libspu as libspu

    return libspu.RuntimeConfig(protocol=libspu.ProtocolKind.ABY3, field=libspu.FieldType.FM64)


def _step(lr: float, momentum: float) -> Any:
    import jax
    import jax.numpy as jnp

    def loss(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, y: Any) -> Any:
        z = jnp.tanh(x @ w1.T + b1) @ w2.T + b2
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(z), axis=1))

    def step(*args: Any) -> Any:
        weights, velocity, (x, y) = args[:4], args[4:8], args[8:]
        grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*weights, x, y)
        moved = [momentum * v + g for v, g in zip(velocity, grads, strict=True)]
        return (*[w - lr * v for w, v in zip(weights, moved, strict=True)], *moved)

    return step


def _batches(data: Any, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    x, y = data["x_train"].astype(np.float32), data["y_train"].astype(np.int64)
    onehot = np.eye(10, dtype=np.float32)[y]
    return [(x[s : s + batch], onehot[s : s + batch]) for s in range(0, len(x), batch)]


def _write(path: Path, shares: dict[str, Any]) -> None:
    blob = {
        k: {"meta": s.meta.hex(), "chunks": [c.hex() for c in s.share_chunks]}
        for k, s in shares.items()
    }
    path.write_text(json.dumps(blob))


def _read(path: Path) -> dict[str, Any]:
    import spu.libspu as libspu

    out = {}
    for k, v in json.loads(path.read_text()).items():
        share = libspu.Share()
        share.meta = bytes.fromhex(v["meta"])
        share.share_chunks = [bytes.fromhex(c) for c in v["chunks"]]
        out[k] = share
    return out


def share(spec: dict[str, Any]) -> None:
    import spu
    import spu.libspu as libspu

    data = np.load(spec["data"])
    io = spu.Io(PARTIES, _config())
    values: dict[str, np.ndarray] = {k: data[k].astype(np.float32) for k in WEIGHTS}
    values.update({f"v_{k}": np.zeros_like(values[k]) for k in WEIGHTS})
    for i, (x, y) in enumerate(_batches(data, spec["batch"])):
        values[f"x{i}"], values[f"y{i}"] = x, y
    per_party: list[dict[str, Any]] = [{} for _ in range(PARTIES)]
    for name, value in values.items():
        for rank, s in enumerate(io.make_shares(value, libspu.Visibility.VIS_SECRET)):
            per_party[rank][name] = s
    for rank in range(PARTIES):
        _write(Path(spec["dir"]) / f"shares{rank}.json", per_party[rank])


def party(spec: dict[str, Any], rank: int) -> None:
    import spu
    import spu.libspu as libspu
    from spu.utils import frontend

    data = np.load(spec["data"])
    batches = _batches(data, spec["batch"])
    desc = libspu.link.Desc()
    desc.recv_timeout_ms = 600_000
    for i, port in enumerate(spec["ports"]):
        desc.add_party(f"party{i}", f"127.0.0.1:{port}")
    link = libspu.link.create_brpc(desc, rank)
    runtime = spu.Runtime(link, _config())
    for name, value in _read(Path(spec["dir"]) / f"shares{rank}.json").items():
        runtime.set_var(name, value)
    state = [*WEIGHTS, *(f"v_{k}" for k in WEIGHTS)]
    step = _step(spec["lr"], spec["momentum"])
    executables: dict[int, Any] = {}
    seconds = []
    for _ in range(spec["epochs"]):
        began = time.perf_counter()
        for i, (x, y) in enumerate(batches):
            rows = x.shape[0]
            if rows not in executables:
                examples = [data[k].astype(np.float32) for k in WEIGHTS] * 2 + [x, y]
                names = [*state, "x", "y"]
                executables[rows], _ = frontend.compile(
                    frontend.Kind.JAX,
                    step,
                    examples,
                    {},
                    names,
                    [libspu.Visibility.VIS_SECRET] * len(names),
                    lambda outs: [f"out{j}" for j in range(len(outs))],
                )
            runtime.set_var("x", runtime.get_var(f"x{i}"))
            runtime.set_var("y", runtime.get_var(f"y{i}"))
            runtime.run(executables[rows])
            for j, name in enumerate(state):
                runtime.set_var(name, runtime.get_var(f"out{j}"))
        seconds.append(time.perf_counter() - began)
    _write(Path(spec["dir"]) / f"final{rank}.json", {k: runtime.get_var(k) for k in WEIGHTS})
    Path(spec["dir"], f"seconds{rank}.json").write_text(json.dumps(seconds))


def reveal(spec: dict[str, Any]) -> None:
    import spu

    io = spu.Io(PARTIES, _config())
    shares = [_read(Path(spec["dir"]) / f"final{rank}.json") for rank in range(PARTIES)]
    w = {k: io.reconstruct([s[k] for s in shares]) for k in WEIGHTS}
    data = np.load(spec["data"])
    z = np.tanh(data["x_test"] @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]
    seconds = [
        json.loads(Path(spec["dir"], f"seconds{r}.json").read_text()) for r in range(PARTIES)
    ]
    result = {
        "epoch_seconds": [max(col) for col in zip(*seconds, strict=True)],
        "accuracy": float((z.argmax(1) == data["y_test"]).mean()),
    }
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    role, spec_file = sys.argv[1], sys.argv[2]
    settings = json.loads(Path(spec_file).read_text())
    if role == "share":
        share(settings)
    elif role == "party":
        party(settings, int(sys.argv[3]))
    else:
        reveal(settings)
