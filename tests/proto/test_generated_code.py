"""The committed generated code and API reference are what `make proto` produces from protos/."""

from __future__ import annotations

from pathlib import Path

from mpcml.proto import docs, generate


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


def test_regenerating_the_api_reference_changes_nothing(tmp_path: Path) -> None:
    written = docs.write(tmp_path / "api.md")
    stale = not docs.DOCS_FILE.exists() or docs.DOCS_FILE.read_text() != written.read_text()
    assert not stale, "docs/api.md is stale: run `make proto` and commit"


def test_every_service_rpc_message_field_and_enum_value_has_a_comment() -> None:
    missing = docs.undocumented(docs.descriptors())
    assert not missing, "the published protos need a comment on:\n" + "\n".join(missing)
