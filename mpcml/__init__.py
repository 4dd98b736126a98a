"""mpcml: secure multi-party machine learning with CrypTen over a gRPC data plane with mutual TLS.

The public names load lazily, so that `import mpcml` (the CLI, `make proto`) does not import
torch and CrypTen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpcml.runtime import compat as _compat

__version__ = "0.1.0"

_compat.install()

_EXPORTS = {
    "Client": "mpcml.api.client",
    "ClientError": "mpcml.api.client",
    "Job": "mpcml.api.job",
    "JobError": "mpcml.api.client",
    "Session": "mpcml.runtime.crypten_session",
    "session": "mpcml.runtime.crypten_session",
    "TLSFiles": "mpcml.transport.tls",
    "TransportError": "mpcml.transport.errors",
    "tune": "mpcml.api.tune",
}

if TYPE_CHECKING:
    from mpcml.api.client import Client, ClientError, JobError
    from mpcml.api.job import Job
    from mpcml.api.tune import tune
    from mpcml.runtime.crypten_session import Session, session
    from mpcml.transport.errors import TransportError
    from mpcml.transport.tls import TLSFiles

__all__ = [
    "Client",
    "ClientError",
    "Job",
    "JobError",
    "Session",
    "TLSFiles",
    "TransportError",
    "__version__",
    "session",
    "tune",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mpcml' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
