"""Three organisations train a logistic regression together with `mpcml.session`.

The data is scikit-learn's bundled breast-cancer set (569 patients, 30 features). alice holds
the first 15 feature columns, bob the other 15, carol the diagnosis labels. Each party is its
own OS process; they secret-share their columns and train under MPC (CrypTen), talking to each
other only over gRPC with mutual TLS. Only the trained weights are revealed. The same training
in plaintext PyTorch runs beside it for comparison.

Run it with `.venv/bin/python examples/session_demo.py` (this is what `make demo` runs until
the party daemons and the coordinator arrive).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mpcml  # before crypten: mpcml's shims let crypten import on current torch
from mpcml.security import certs

PARTIES = ["alice", "bob", "carol"]
EPOCHS = int(os.environ.get("MPCML_DEMO_EPOCHS", "3"))
BATCH = 64
LR = 1.0


def load() -> tuple[Any, Any]:
    """Standardised features and labels (each party standardises its own columns)."""
    import torch
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    return x, torch.tensor(data.target, dtype=torch.float32)


def plaintext() -> tuple[list[float], list[float]]:
    """The same training in plaintext PyTorch: the accuracy after each epoch, the weights."""
    import torch

    x, y = load()
    model = torch.nn.Linear(30, 1)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    accuracy = []
    for _ in range(EPOCHS):
        for i in range(0, len(x), BATCH):
            loss = torch.nn.functional.binary_cross_entropy(
                model(x[i : i + BATCH]).sigmoid().squeeze(1), y[i : i + BATCH]
            )
            opt.zero_grad()
            torch.autograd.backward(loss)
            opt.step()
        with torch.no_grad():
            accuracy.append(float(((model(x).squeeze(1) > 0).float() == y).float().mean()))
    return accuracy, model.weight.detach().reshape(-1).tolist()


def party(rank: int, peers: list[str], pki: Path, out: Path) -> None:
    """One organisation: shares its own columns, trains, learns the revealed weights."""
    import crypten
    import torch

    x, y = load()
    mine = {0: x[:, :15], 1: x[:, 15:], 2: y}[rank]  # all this party holds
    tls = mpcml.TLSFiles(
        ca=pki / "ca.pem", cert=pki / f"{PARTIES[rank]}.pem", key=pki / f"{PARTIES[rank]}.key"
    )
    with mpcml.session(rank=rank, world_size=3, peers=peers, tls=tls, peer_names=PARTIES):
        shapes = {0: (569, 15), 1: (569, 15), 2: (569,)}
        shares = [
            crypten.cryptensor(mine if r == rank else torch.empty(shapes[r]), src=r)
            for r in range(3)
        ]
        features = crypten.cat([shares[0], shares[1]], dim=1)
        labels = shares[2]
        plain = torch.nn.Linear(30, 1)
        torch.nn.init.zeros_(plain.weight)
        torch.nn.init.zeros_(plain.bias)
        model = crypten.nn.from_pytorch(plain, torch.empty(1, 30)).encrypt(src=2)
        model.train()
        loss_fn = crypten.nn.BCELoss()
        log = []
        for epoch in range(EPOCHS):
            started = time.monotonic()
            for i in range(0, 569, BATCH):
                out_ = model(features[i : i + BATCH]).sigmoid().squeeze(1)
                loss = loss_fn(out_, labels[i : i + BATCH])
                model.zero_grad()
                loss.backward()
                model.update_parameters(LR)
            correct = ((model(features).squeeze(1) > 0) == labels).sum()
            accuracy = correct.get_plain_text().item() / 569  # revealed: the agreed output
            log.append(
                {"epoch": epoch + 1, "accuracy": accuracy, "seconds": time.monotonic() - started}
            )
        weights = {
            k.split(".")[0]: p.get_plain_text().reshape(-1).tolist()
            for k, p in model.named_parameters()
        }
    out.write_text(json.dumps({"log": log, "weights": weights}))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main() -> int:
    """Start the three parties, wait for them, print what they learned."""
    with tempfile.TemporaryDirectory(prefix="mpcml-demo-") as tmp_name:
        tmp = Path(tmp_name)
        certs.init_ca(tmp)
        for name in PARTIES:
            certs.issue(tmp, name, sans=("127.0.0.1", "localhost"))
        peers = [f"127.0.0.1:{p}" for p in _free_ports(3)]
        print(f"alice, bob and carol listen on {', '.join(peers)} (gRPC, mutual TLS)")
        print(f"training {EPOCHS} epochs under MPC; each epoch takes a few seconds ...", flush=True)
        ctx = mp.get_context("spawn")
        outs = [tmp / f"{name}.json" for name in PARTIES]
        procs = [ctx.Process(target=party, args=(r, peers, tmp, outs[r])) for r in range(3)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(600)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
        if any(p.exitcode != 0 or not o.exists() for p, o in zip(procs, outs, strict=True)):
            print("a party failed; see its error above", file=sys.stderr)
            return 1
        results = [json.loads(o.read_text()) for o in outs]
    reference, plain_weights = plaintext()
    print(f"\n{'epoch':>5}  {'secure accuracy':>15}  {'plaintext accuracy':>18}  {'seconds':>7}")
    for row, plain_acc in zip(results[0]["log"], reference, strict=True):
        print(
            f"{row['epoch']:>5}  {row['accuracy']:>15.3f}  {plain_acc:>18.3f}  "
            f"{row['seconds']:>7.1f}"
        )
    same = all(r["weights"] == results[0]["weights"] for r in results)
    print(f"\nevery party learned the same revealed weights: {same}")
    print("first weights, secure:   ", [round(w, 3) for w in results[0]["weights"]["weight"][:5]])
    print("first weights, plaintext:", [round(w, 3) for w in plain_weights[:5]])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
