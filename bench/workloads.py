"""The MPC workloads the transport benchmark times, identical whatever carries the messages.

Every party draws the plaintext inputs from the same fixed seeds, so a gRPC run and a gloo run
compute on exactly the same tensors; CrypTen's own randomness (the shares) differs run to run,
as it must. Encryption happens outside the timed region: only the computation is timed, between
two barriers, so that every party has finished when the clock stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mpcml  # noqa: F401  (first: its import hook lets crypten load on current torch)
from mpcml.runtime import compat

compat.apply()

import crypten  # noqa: E402  (after the shims)
import crypten.communicator as comm  # noqa: E402
import torch  # noqa: E402

SEED = 20240601
LOGREG_BATCH = 32
LOGREG_LR = 0.5


def dataset() -> tuple[torch.Tensor, torch.Tensor, str]:
    """Features (569x30, standardised), 0/1 labels and where they come from."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    y = torch.tensor(bunch.target, dtype=torch.float32)
    x = (x - x.mean(dim=0)) / x.std(dim=0)
    return x, y.reshape(-1, 1), "scikit-learn breast-cancer 569x30"


def _inputs(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(*shape, generator=g) for shape in shapes]


def _matmul() -> tuple[Callable[[], Any], Callable[[Any], float]]:
    a, b = _inputs((256, 256), (256, 256))
    x, y = crypten.cryptensor(a, src=0), crypten.cryptensor(b, src=1)
    return (lambda: x.matmul(y)), (lambda out: _err(out, a @ b))


def _relu() -> tuple[Callable[[], Any], Callable[[Any], float]]:
    (a,) = _inputs((100_000,))
    x = crypten.cryptensor(a, src=0)
    return (lambda: x.relu()), (lambda out: _err(out, a.relu()))


def _softmax() -> tuple[Callable[[], Any], Callable[[Any], float]]:
    (a,) = _inputs((128, 128))
    x = crypten.cryptensor(a, src=0)
    return (lambda: x.softmax(dim=1)), (lambda out: _err(out, a.softmax(dim=1)))


def _logreg() -> tuple[Callable[[], Any], Callable[[Any], float]]:
    features, labels, _ = dataset()
    torch.manual_seed(SEED)  # crypten.nn.Linear draws its initial weights from torch's RNG
    model = crypten.nn.Linear(30, 1)
    model.encrypt(src=0)
    model.train()
    x = crypten.cryptensor(features, src=0)
    y = crypten.cryptensor(labels, src=0)
    loss_fn = crypten.nn.BCELoss()

    def epoch() -> Any:
        loss = None
        for start in range(0, features.shape[0], LOGREG_BATCH):
            stop = start + LOGREG_BATCH
            out = model(x[start:stop]).sigmoid()
            loss = loss_fn(out, y[start:stop])
            model.zero_grad()
            loss.backward()
            model.update_parameters(LOGREG_LR)
        return loss

    def check(loss: Any) -> float:
        # A loss that is finite and below log(2) after an epoch means the training ran.
        value = float(loss.get_plain_text())
        return 0.0 if 0.0 <= value < 0.69 else float("inf")

    return epoch, check


_PREPARE: dict[str, Callable[[], tuple[Callable[[], Any], Callable[[Any], float]]]] = {
    "matmul": _matmul,
    "relu": _relu,
    "softmax": _softmax,
    "logreg": _logreg,
}


def _unchecked(out: Any) -> float:
    return float("nan")


def _err(out: Any, expected: torch.Tensor) -> float:
    # The share of elements more than 0.05 off. Not the largest error: CrypTen's 3-party
    # truncation is off by about 1.0 on a few elements in 10^4 on any transport (seen on gloo).
    return float(((out.get_plain_text() - expected).abs() > 0.05).float().mean())


def _traffic(c: Any) -> dict[str, int]:
    """Bytes so far on CrypTen's data plane, and what this party took from mpcml's dealer."""
    from mpcml.runtime.provider import DealerProvider

    client = DealerProvider.client
    return {
        "bytes": int(c.get_communication_stats()["bytes"]),
        "dealer_tuples": client.tuples if client is not None else 0,
        "dealer_bytes": client.wire_bytes if client is not None else 0,
    }


def run(names: list[str], reps: int, warmup: int) -> dict[str, Any]:
    """Time each workload `reps` times after `warmup` untimed runs; call inside a session.

    Returns this party's seconds per repetition, per workload the share of wrong elements
    against plaintext PyTorch (decrypting is untimed and happens once, after the last one) and
    its traffic per repetition (`_traffic`, encryption and decryption included).
    """
    c = comm.get()
    crypten.cfg.communicator.verbose = True  # count bytes (on gloo and gRPC alike)
    times: dict[str, list[float]] = {}
    errors: dict[str, float] = {}
    traffic: dict[str, dict[str, float]] = {}
    for name in names:
        times[name] = []
        before = _traffic(c)
        out: Any = None
        check: Callable[[Any], float] = _unchecked
        for i in range(warmup + reps):
            # Fresh inputs (and a fresh model) for every repetition: each one does the same work.
            compute, check = _PREPARE[name]()
            c.barrier()
            start = time.perf_counter()
            out = compute()
            c.barrier()
            seconds = time.perf_counter() - start
            if i >= warmup:
                times[name].append(seconds)
        errors[name] = check(out)
        after = _traffic(c)
        traffic[name] = {k: (after[k] - before[k]) / (warmup + reps) for k in after}
    return {"times": times, "errors": errors, "traffic": traffic, "dataset": dataset()[2]}
