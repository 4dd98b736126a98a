"""`mpcml` entry point. Sub-commands arrive with the daemons (issue 3) and the CA tool (issue 4)."""

from __future__ import annotations

import argparse
import sys

import mpcml


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="mpcml", description=mpcml.__doc__)
    parser.add_argument("--version", action="version", version=f"mpcml {mpcml.__version__}")
    parser.parse_args(argv)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
