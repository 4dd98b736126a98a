"""Regenerates `mpcml/proto/v1` from `protos/mpcml/v1/*.proto` (`make proto`).

protoc writes imports as `from mpcml.v1 import x_pb2` (the proto package path); they are rewritten
to `mpcml.proto.v1` so that the generated modules live inside the `mpcml` package.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "mpcml" / "v1"
OUT_DIR = Path(__file__).resolve().parent / "v1"
_IMPORT = re.compile(r"^from mpcml\.v1 import ", re.MULTILINE)


def protoc(*outputs: str) -> None:
    """Run protoc over every .proto of `protos/mpcml/v1` with the given output options."""
    from grpc_tools import protoc as tool

    include = Path(tool.__file__).parent / "_proto"
    protos = sorted(PROTO_DIR.glob("*.proto"))
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", *outputs, *(str(p) for p in protos)]
    if tool.main(args) != 0:
        raise SystemExit("protoc failed")


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto into `out_dir`; returns the files written."""
    with tempfile.TemporaryDirectory() as tmp:
        protoc(f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}")
        written = []
        out_dir.mkdir(parents=True, exist_ok=True)
        for produced in sorted((Path(tmp) / "mpcml" / "v1").iterdir()):
            text = _IMPORT.sub("from mpcml.proto.v1 import ", produced.read_text())
            target = out_dir / produced.name
            target.write_text(text)
            written.append(target)
    return written


def main() -> None:
    """Entry point of `make proto`."""
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
