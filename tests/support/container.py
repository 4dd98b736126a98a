"""Run one command as a compose service would see it, inside its own mount namespace.

`python -m tests.support.container --bind SRC:DST[:ro] ... --hosts FILE -- ARGV...` is started
under `unshare --mount --propagation private` (and `ip netns exec NS`) by tests.support.compose:
a tmpfs over /srv holds the container paths (nothing is created on the host), each volume is
bind-mounted at its target, the service names resolve through the given hosts file, and then
ARGV replaces this process, in the image's working directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

ROOT = "/srv"
"""Every container path of docker/compose.yml lies under it (the image's /srv/mpcml)."""
WORKDIR = "/srv/mpcml"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main() -> None:
    """Mount, then exec the command."""
    p = argparse.ArgumentParser()
    p.add_argument("--bind", action="append", default=[], help="SRC:DST[:ro]")
    p.add_argument("--hosts", required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args()
    _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", ROOT)
    Path(WORKDIR).mkdir(parents=True, exist_ok=True)
    for spec in args.bind:
        src, dst, *mode = spec.split(":")
        if Path(src).is_dir():
            Path(dst).mkdir(parents=True, exist_ok=True)
        else:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            Path(dst).touch()
        _mount("--bind", src, dst)
        if mode == ["ro"]:
            _mount("-o", "remount,bind,ro", dst)
    _mount("--bind", args.hosts, "/etc/hosts")
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    os.chdir(WORKDIR)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
