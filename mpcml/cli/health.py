"""`mpcml health ADDRESS`: ask a daemon's `grpc.health.v1` service, for container healthchecks.

Exit 0 when the daemon answers SERVING; 1 when it answers anything else or cannot be reached in
time, with one line saying which.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mpcml.cli.exits import EXIT_FAILED, EXIT_OK
from mpcml.transport.serving import channel
from mpcml.transport.tls import TLSFiles


def add_parser(sub: Any) -> None:
    """The `health` command."""
    env = os.environ.get
    p = sub.add_parser("health", help="is a daemon SERVING? (grpc.health.v1; exit 0 if so)")
    p.add_argument("address", help="HOST:PORT of the daemon")
    p.add_argument("--server-name", required=True, help="the name its certificate carries")
    p.add_argument("--service", default="", help="one service's status (default: the daemon's)")
    p.add_argument("--ca", default=env("MPCML_CA"), help="CA certificate (env MPCML_CA)")
    p.add_argument(
        "--cert", default=env("MPCML_CERT"), help="a certificate of this CA (env MPCML_CERT)"
    )
    p.add_argument("--key", default=env("MPCML_KEY"), help="its key (env MPCML_KEY)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument("--insecure", action="store_true", help="plaintext, for debugging only")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check once; print the answer."""
    tls = None
    if not args.insecure:
        missing = [f"--{k}" for k in ("ca", "cert", "key") if not getattr(args, k)]
        if missing:
            raise ValueError(f"give {', '.join(missing)} (or MPCML_CA, MPCML_CERT, MPCML_KEY)")
        tls = TLSFiles(args.ca, args.cert, args.key)
    what = f"{args.server_name} at {args.address}" + (f" ({args.service})" if args.service else "")
    with channel(args.address, tls, args.server_name) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"{what}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return EXIT_FAILED
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{what}: {status}")
    return EXIT_OK if reply.status == health_pb2.HealthCheckResponse.SERVING else EXIT_FAILED
