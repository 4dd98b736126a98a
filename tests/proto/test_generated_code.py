"""The committed generated code is what `make proto` produces from protos/."""

from __future__ import annotations

from pathlib import Path

from mpcml.proto import generate


def test_regenerating_the_protobuf_code_changes_nothing(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written, "no .proto files found"
    committed = {
        p.name
        for p in generate.OUT_DIR.iterdir()
        if p.name != "__init__.py" and p.suffix in (".py", ".pyi")
    }
    assert {p.name for p in written} == committed
    for path in written:
        stale = (generate.OUT_DIR / path.name).read_text() != path.read_text()
        assert not stale, f"mpcml/proto/v1/{path.name} is stale: run `make proto` and commit"
