"""`party.toml`: who the party is, where it listens, and its private catalogue.

```toml
name = "alice"
data_address = "127.0.0.1:7101"   # where the other parties reach this party's job worker
coordinator = "127.0.0.1:7000"
dealer = "127.0.0.1:7200"          # correlated randomness (mpcml dealer)
device = "cpu"                     # or "cuda:0"
cuda_emulation = false             # tests only: a cuda device's code, its data on the CPU
max_concurrent_jobs = 1            # workers at once; slot s listens on data_address's port + s
metrics_address = "127.0.0.1:9102" # optional: Prometheus metrics (mpcml/party/metrics.py)
health_address = "0.0.0.0:7190"    # optional: grpc.health.v1, SERVING while attached
torch_threads = 0                  # torch threads per job worker (0: one per core)
network = ""                       # benchmarks only: emulate "delay=20ms,bandwidth=352mbit"
[tls]
ca = "certs/ca.pem"
cert = "certs/alice.pem"
key = "certs/alice.key"
[datasets.bc-train]
path = "data/bc_train.csv"         # CSV with a header row, or .npz
id_column = "id"
[datasets.reviews]                 # token ids (rows x sequence) for a transformer
path = "data/reviews.npz"
array = "input_ids"
mask = "attention_mask"            # optional: 0/1 per token, 1 everywhere without it
[models.digits-mlp]
path = "models/digits_mlp.pt"      # a torch state_dict, read with weights_only=True
[policy]                           # see mpcml/party/policy.py
submitters = ["analyst"]
[policy.limits]                    # what one job may cost (mpcml/party/limits.py)
max_job_memory_mib = 8192
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpcml import config as cfg
from mpcml import metrics
from mpcml.console.server import ConsoleSettings
from mpcml.console.server import settings as console_settings
from mpcml.party.limits import Limits
from mpcml.party.policy import Policy
from mpcml.runtime import devices
from mpcml.transport.address import Address, parse
from mpcml.transport.shaping import Shaping, ShapingError
from mpcml.transport.tls import TLSFiles


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset of the catalogue."""

    name: str
    path: Path
    id_column: str = ""
    array: str = "x"
    """For .npz files: the array holding the rows."""
    mask: str = ""
    """For .npz token datasets: the array holding the attention mask (0/1 per token)."""


@dataclass(frozen=True)
class PartyConfig:
    """A party daemon's settings; plain values, so a forked worker gets a copy."""

    name: str
    data_address: str
    listen: str
    coordinator: str
    coordinator_name: str
    device: str
    tls: TLSFiles | None
    state_dir: Path
    results_dir: Path
    heartbeat_s: float
    datasets: dict[str, DatasetEntry] = field(default_factory=dict)
    models: dict[str, Path] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)
    dealer: str = ""
    """HOST:PORT of the dealer; jobs that use it fail without one."""
    dealer_name: str = "dealer"
    max_concurrent_jobs: int = 1
    """Jobs this party runs at once; the coordinator queues further ones."""
    metrics_address: str = ""
    """HOST:PORT of the daemon's Prometheus endpoint; empty: none."""
    health_address: str = ""
    """Where to serve `grpc.health.v1` and reflection (none when empty)."""
    torch_threads: int = 0
    cuda_emulation: bool = False
    """Run a `cuda` device's code with its data on the CPU (runtime/devices.py): for checking
    the GPU path on machines without one, never for speed."""
    """Threads each job worker's torch uses (0: torch's default, one per core). Parties that
    share a machine with each other want 1, or their workers contend for the cores."""
    console: ConsoleSettings | None = None
    """The organisation's web console, when `console_address` is set."""
    limits: Limits = field(default_factory=lambda: Limits.defaults(1))
    """What one job may cost this party (`[policy.limits]`, mpcml/party/limits.py)."""
    network: str = ""
    """An emulated network on the job workers' inbound streams (`delay=20ms,bandwidth=352mbit`,
    mpcml/transport/shaping.py), for benchmarks on one machine; empty: none."""

    @classmethod
    def load(cls, path: str | Path) -> PartyConfig:
        """Read the file (and `MPCML_*` overrides); paths are relative to the file."""
        data, base = cfg.load(path)
        name = str(cfg.need(data, "name", base))
        data_address = str(cfg.need(data, "data_address", base))
        datasets = {
            key: _dataset(key, entry, base) for key, entry in dict(data.get("datasets", {})).items()
        }
        models = {
            key: cfg.resolve(base, str(cfg.need(entry, "path", base)))
            for key, entry in dict(data.get("models", {})).items()
        }
        tls = cfg.tls_files(data, base)
        concurrent = cfg.positive_int(data, "max_concurrent_jobs", 1, base)
        return cls(
            name=name,
            data_address=data_address,
            listen=str(data.get("listen", data_address)),
            coordinator=str(cfg.need(data, "coordinator", base)),
            coordinator_name=str(data.get("coordinator_name", "coordinator")),
            device=_device(str(data.get("device", "cpu")), name, base),
            tls=tls,
            state_dir=cfg.resolve(base, str(data.get("state_dir", "state"))),
            results_dir=cfg.resolve(base, str(data.get("results_dir", "results"))),
            heartbeat_s=float(data.get("heartbeat_s", 2.0)),
            datasets=datasets,
            models=models,
            policy=Policy.from_table(data.get("policy")),
            dealer=str(data.get("dealer", "")),
            dealer_name=str(data.get("dealer_name", "dealer")),
            max_concurrent_jobs=concurrent,
            limits=Limits.from_table(
                dict(data.get("policy") or {}).get("limits"), concurrent, base
            ),
            metrics_address=metrics.address(data, base),
            health_address=str(data.get("health_address", "")),
            torch_threads=cfg.positive_int(data, "torch_threads", 0, base, minimum=0),
            cuda_emulation=cfg.flag(data, "cuda_emulation", base),
            network=_network(str(data.get("network", "")), base),
            console=console_settings(data, base, tls),
        )

    def public_health_address(self) -> str:
        """Where others reach the health endpoint.

        `data_address`'s host with `health_address`'s port: the latter is often a wildcard.
        """
        if not self.health_address:
            return ""
        host = parse(self.data_address, "data_address").host
        return str(Address(host, parse(self.health_address, "health_address").port))

    def job_state(self, job_id: str) -> Path:
        """Where this party keeps its shares of a job's state."""
        return self.state_dir / "jobs" / job_id

    def job_results(self, job_id: str) -> Path:
        """Where this party writes the outputs revealed to it."""
        return self.results_dir / job_id


def _device(device: str, party: str, base: Path) -> str:
    """The syntax only: whether CUDA is there is for the job worker to find (runtime/devices)."""
    try:
        return devices.check(device, party)
    except devices.DeviceError as exc:
        raise cfg.ConfigError(f"{exc}, in the config in {base}") from None


def _dataset(name: str, entry: Any, base: Path) -> DatasetEntry:
    if not isinstance(entry, dict):
        raise cfg.ConfigError(f"datasets.{name} in {base} must be a table with a `path`")
    return DatasetEntry(
        name=name,
        path=cfg.resolve(base, str(cfg.need(entry, "path", base))),
        id_column=str(entry.get("id_column", "")),
        array=str(entry.get("array", "x")),
        mask=str(entry.get("mask", "")),
    )


def _network(text: str, base: Path) -> str:
    try:
        return str(Shaping.parse(text)) if text.strip() else ""
    except ShapingError as exc:
        raise cfg.ConfigError(f"{exc}, in the config in {base}") from None
