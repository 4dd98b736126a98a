"""The rooms of docs/architecture.md hold: no upward or sideways import, no cycle, and the
coordinator and the package root load without torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mpcml"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([a-z_]+)`\s*\|")


def layers() -> dict[str, int]:
    """Room -> layer, from the table in docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rooms = {m.group(2): int(m.group(1)) for m in map(ROW.match, text.splitlines()) if m}
    assert len(rooms) >= 10, "docs/architecture.md lists no rooms"
    return rooms


def room(module: str) -> str:
    """The room of `mpcml.x.y` is `x`; the package root is ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every mpcml import in the file, at any depth (also in functions)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mpcml"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "mpcml":  # from mpcml import x: x is a room
                for alias in node.names:
                    yield node.lineno, f"mpcml.{alias.name}"
            elif node.module.startswith("mpcml."):
                yield node.lineno, node.module


def edges() -> list[tuple[str, str, str]]:
    """(room, imported room, where) for every import between two rooms."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = room(module_name(path))
        if not source:
            continue  # the package root re-exports; it is outside the table
        for line, target in imports(path):
            imported = room(target)
            if imported and imported != source:
                out.append((source, imported, f"{path.relative_to(REPO)}:{line} imports {target}"))
    return out


def test_every_room_is_in_the_table() -> None:
    rooms = layers()
    found = {room(module_name(p)) for p in PACKAGE.rglob("*.py")} - {""}
    assert found <= set(rooms), f"rooms missing from docs/architecture.md: {found - set(rooms)}"


def test_no_room_imports_upward_or_sideways() -> None:
    rooms = layers()
    wrong = [
        f"{where} ({source} is layer {rooms[source]}, {target} is layer {rooms[target]})"
        for source, target, where in edges()
        if rooms[target] >= rooms[source]
    ]
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def test_no_cycle_between_rooms() -> None:
    graph: dict[str, set[str]] = {}
    for source, target, _ in edges():
        graph.setdefault(source, set()).add(target)
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            assert cycle is None, f"import cycle between rooms: {' -> '.join(cycle)}"


def test_the_layer_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The walker sees an import inside a function, so the checks above can fail."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mpcml.cli import main\n")
    assert [m for _, m in imports(probe)] == ["mpcml.cli"]


def test_the_coordinator_and_the_package_root_load_without_torch() -> None:
    code = (
        "import sys, mpcml, mpcml.coordinator.server, mpcml.coordinator.service; "
        "loaded = [m for m in ('torch', 'crypten') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
