"""`mpcml audit show|verify`: a party's audit log, for its operator and for an auditor."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mpcml.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from mpcml.party import audit

_FIXED = ("seq", "at", "kind", "job", "prev", "hash")


def add_parser(sub: Any) -> None:
    """`mpcml audit ...`."""
    c = sub.add_parser("audit", help="a party's audit log: show it, verify its hash chain")
    cs = c.add_subparsers(dest="audit_command", required=True)
    for name, help in (
        ("show", "the entries, oldest first, then the head to keep (SEQ:HASH)"),
        ("verify", "check the hash chain; exit 1 naming the first entry that does not follow"),
    ):
        p = cs.add_parser(name, help=help)
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--config", type=Path, help="the party's party.toml (its state_dir)")
        where.add_argument("--log", type=Path, help="an audit log file (audit.jsonl)")
        if name == "show":
            p.add_argument(
                "--format",
                choices=("table", "json"),
                default="table",
                help="json: the entries as JSON lines, as stored (an export)",
            )
            p.add_argument("--job", help="only this job's entries")
        else:
            p.add_argument("--head", help="SEQ:HASH kept from an earlier `show`: must be there")
    c.set_defaults(run=run)


def _path(args: argparse.Namespace) -> Path:
    if args.log is not None:
        return Path(args.log)
    from mpcml.party.config import PartyConfig

    return PartyConfig.load(args.config).state_dir / audit.FILE


def _line(entry: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(entry.get("at", 0))))
    rest = " ".join(
        f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(entry.items()) if k not in _FIXED
    )
    kind, job = entry.get("kind", "?"), entry.get("job") or "-"
    return f"{entry.get('seq', '?'):>5}  {when}  {kind:<15} {job:<32}  {rest}"


def run(args: argparse.Namespace) -> int:
    """Show or verify; a log that does not verify exits 1 naming the entry."""
    try:
        path = _path(args)
        if not path.exists():
            print(
                f"error: no audit log at {path}: the party has recorded nothing yet",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        if args.audit_command == "verify":
            head = audit.verify(path, audit.Head.parse(args.head) if args.head else None)
            print(f"ok: {head.seq} entries chain from the first to the head {head}")
            return EXIT_OK
        if args.format == "json":
            for _, entry in audit.entries(path):
                if not args.job or entry.get("job") == args.job:
                    print(json.dumps(entry, sort_keys=True))
            return EXIT_OK
        print(f"{'seq':>5}  {'at (UTC)':<19}  {'kind':<15} {'job':<32}  details")
        for _, entry in audit.entries(path):
            if not args.job or entry.get("job") == args.job:
                print(_line(entry))
        try:
            head = audit.verify(path)
            print(f"head: {head} (verified; keep it to check this log later: verify --head)")
        except audit.AuditError as exc:
            print(f"DOES NOT VERIFY: {exc}")
            return EXIT_FAILED
        return EXIT_OK
    except audit.AuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
