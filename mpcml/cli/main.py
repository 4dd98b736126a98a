"""`mpcml`: one entry point for every role (docs/architecture.md)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

import mpcml
from mpcml import logs
from mpcml.cli import audit, doctor, health, jobs, tune
from mpcml.cli.exits import EXIT_BAD_INPUT
from mpcml.security import certs

DESCRIPTION = (
    "Secure multi-party machine learning: each organisation runs a party daemon, a coordinator "
    "runs jobs as numbered rounds, and the parties train and run models on secret-shared data "
    "over gRPC with mutual TLS. Start with `mpcml demo`; README.md has the rest."
)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


INSECURE_BANNER = (
    "WARNING: --insecure: plaintext gRPC with no authentication. Anyone on the network can read "
    "and forge every message. For debugging only."
)


def _daemon_start(args: argparse.Namespace) -> None:
    """What every daemon does before it loads its config: the insecure banner, the log level."""
    logs.level_name(args.log_level)  # a bad level or format fails before anything starts
    json_logs = logs.format_name(args.log_format) == "json"
    if args.insecure:
        os.environ["MPCML_INSECURE"] = "true"
        banner = logs.json_line(args.command, "warning", INSECURE_BANNER)
        print(banner if json_logs else INSECURE_BANNER, file=sys.stderr, flush=True)


def _coordinator(args: argparse.Namespace) -> int:
    from mpcml.coordinator.server import CoordinatorConfig, serve

    _daemon_start(args)
    config = CoordinatorConfig.load(args.config)
    logs.configure("coordinator", args.log_level, args.log_format)
    serve(config, _stop_on_signals())
    return 0


def _dealer(args: argparse.Namespace) -> int:
    from mpcml.dealer.server import DealerConfig, serve

    _daemon_start(args)
    config = DealerConfig.load(args.config)
    logs.configure("dealer", args.log_level, args.log_format)
    serve(config, _stop_on_signals())
    return 0


def _party(args: argparse.Namespace) -> int:
    from mpcml.party.config import PartyConfig
    from mpcml.party.daemon import PartyDaemon

    _daemon_start(args)
    config = PartyConfig.load(args.config)
    logs.configure(config.name, args.log_level, args.log_format)
    logs.bind(party=config.name)
    daemon = PartyDaemon(config)
    stop = _stop_on_signals()

    def relay() -> None:
        stop.wait()
        daemon.stopping.set()

    threading.Thread(target=relay, daemon=True).start()
    daemon.run()
    return 0


def _certs(args: argparse.Namespace) -> int:
    if args.certs_command == "init":
        issued = certs.init_ca(args.out)
        print(f"wrote {issued.cert} and {issued.key}")
    elif args.certs_command == "show":
        print(certs.describe(args.file))
    elif args.certs_command == "setup":
        identities = []
        for spec in args.identity:
            name, _, role = spec.partition(":")
            if not name or role not in certs.ROLES:
                raise ValueError(
                    f"--identity {spec!r}: expected NAME:ROLE, ROLE one of {', '.join(certs.ROLES)}"
                )
            identities.append((name, role))
        owner = None
        if args.owner:
            uid, _, gid = args.owner.partition(":")
            if not uid.isdigit() or not (gid or uid).isdigit():
                raise ValueError(f"--owner {args.owner!r}: expected UID:GID, numbers")
            owner = (int(uid), int(gid or uid))
        written = certs.setup(args.out, identities, tuple(args.san or ()), owner)
        print(f"wrote {len(written)} files under {args.out}" if written else "nothing to do")
    elif args.certs_command == "issue":
        issued = certs.issue(
            args.ca,
            args.name,
            role=args.role,
            sans=tuple(args.san or ()),
            out=args.out or args.ca,
            days=args.days,
        )
        print(f"wrote {issued.cert} and {issued.key}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from mpcml.demo.run import main as demo_main

    return demo_main(json_output=args.json, workdir=args.workdir, epochs=args.epochs)


def _bench(args: argparse.Namespace) -> int:
    """bench/report.py of the source checkout this package runs from."""
    import subprocess

    report = Path(mpcml.__file__).resolve().parents[1] / "bench" / "report.py"
    if not report.is_file():
        print(
            f"error: `mpcml bench` runs the benchmarks of a source checkout of mpcml, and "
            f"{report} is not there: clone the repository and run `make bench`",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    command = [sys.executable, str(report), *(["--quick"] if args.quick else [])]
    return subprocess.call([*command, *(["--only", *args.only] if args.only else [])])


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    p = argparse.ArgumentParser(prog="mpcml", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"mpcml {mpcml.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    daemons = [
        ("coordinator", "run the coordinator", "coordinator.toml", _coordinator),
        ("party", "run a party daemon", "parties/<name>/party.toml", _party),
        ("dealer", "run the dealer: correlated randomness for the parties", "dealer.toml", _dealer),
    ]
    for name, help, config, run in daemons:
        c = sub.add_parser(name, help=help)
        c.add_argument("--config", required=True, help=config)
        c.add_argument("--insecure", action="store_true", help="plaintext, for debugging only")
        c.add_argument(
            "--log-level",
            choices=logs.LEVELS,
            default=None,
            help=f"default: ${logs.ENV}, else info (job workers log at the same level)",
        )
        c.add_argument(
            "--log-format",
            choices=logs.FORMATS,
            default=None,
            help=f"default: ${logs.FORMAT_ENV}, else text; json: one JSON object per line",
        )
        c.set_defaults(run=run)

    c = sub.add_parser("certs", help="a small CA: make the certificates every channel uses")
    cs = c.add_subparsers(dest="certs_command", required=True)
    ci = cs.add_parser("init", help="make a CA (DIR/ca.pem, DIR/ca.key)")
    ci.add_argument("--out", required=True)
    ci = cs.add_parser("issue", help="issue DIR/NAME.pem and DIR/NAME.key")
    ci.add_argument("--ca", required=True, help="the CA's folder")
    ci.add_argument("--name", required=True)
    ci.add_argument("--role", choices=certs.ROLES, default="party")
    ci.add_argument("--san", action="append", help="a DNS name or IP address (repeatable)")
    ci.add_argument("--out", help="folder to write to (default: the CA's)")
    ci.add_argument("--days", type=int, default=825)
    ci = cs.add_parser("show", help="name, role, SANs and expiry of a certificate")
    ci.add_argument("file")
    ci = cs.add_parser(
        "setup", help="a CA and one folder per holder, DIR/NAME/ (keeps what exists)"
    )
    ci.add_argument("--out", required=True)
    ci.add_argument("--identity", action="append", required=True, help="NAME:ROLE (repeatable)")
    ci.add_argument("--san", action="append", help="added to every certificate (repeatable)")
    ci.add_argument("--owner", help="UID:GID to own each holder's folder (a container's user)")
    c.set_defaults(run=_certs)

    jobs.add_parsers(sub)
    audit.add_parser(sub)
    health.add_parser(sub)
    doctor.add_parser(sub)
    tune.add_parser(sub)

    c = sub.add_parser("demo", help="the whole system on loopback: train, infer, private model")
    c.add_argument("--json", action="store_true", help="end with the results as one JSON line")
    c.add_argument("--workdir", type=Path, help="keep certificates, state and logs here")
    c.add_argument("--epochs", type=int, default=None, help="training epochs (default 10)")
    c.set_defaults(run=_demo)

    c = sub.add_parser(
        "bench", help="every benchmark, written to bench/REPORT.md (a source checkout's)"
    )
    c.add_argument("--quick", action="store_true", help="the smallest workloads (~10 minutes)")
    c.add_argument("--only", nargs="*", help="suites whose name starts with one of these")
    c.set_defaults(run=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = parser().parse_args(argv)
    if args.command == "job":
        return jobs.main(args)
    try:
        return int(args.run(args))
    except (ValueError, OSError) as exc:  # a bad config, an address in use
        print(_error_line(args, f"error: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT


def _error_line(args: argparse.Namespace, text: str) -> str:
    """`text`, as a JSON line for a daemon that logs JSON (its log stays parseable)."""
    try:
        json_logs = hasattr(args, "log_format") and logs.format_name(args.log_format) == "json"
    except ValueError:  # the bad format is what `text` reports
        json_logs = False
    return logs.json_line(args.command, "error", text) if json_logs else text


if __name__ == "__main__":
    sys.exit(main())
