"""The README's lists (config keys, job-file keys, CLI commands) name everything the code
has, so they cannot drift from it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ = re.compile(
    r'(?:data\.get|cfg\.need|need|positive_int|flag|_names)\(\s*data,?\s*"([a-z_]+)"|data\.get\("([a-z_]+)"'
)


def _keys(*sources: str) -> set[str]:
    keys: set[str] = set()
    for source in sources:
        text = (REPO / source).read_text()
        keys |= {a or b for a, b in READ.findall(text)}
    return keys


def _paragraph(start: str) -> str:
    text = (REPO / "README.md").read_text()
    at = text.index(start)
    return text[at : text.index("\n\n", at)]


SHARED = {"tls", "insecure", "metrics_address", "console_address", "console_users"}
"""Keys every daemon's config reads through shared helpers (mpcml/config.py, metrics, console)."""


def test_the_party_config_keys_are_all_in_the_readme() -> None:
    from mpcml.party.limits import _KEYS as LIMITS

    keys = _keys("mpcml/party/config.py") | SHARED | LIMITS
    listed = set(re.findall(r"`\[?([a-z_]+)", _paragraph("A party's config")))
    assert keys - {"insecure"} <= listed, f"missing from the README: {sorted(keys - listed)}"


def test_the_coordinator_config_keys_are_all_in_the_readme() -> None:
    keys = _keys("mpcml/coordinator/server.py") | SHARED | {"parties", "admins"}
    listed = set(re.findall(r"`\[?([a-z_]+)", _paragraph("The coordinator's config")))
    assert keys - {"insecure"} <= listed, f"missing from the README: {sorted(keys - listed)}"


def test_the_job_file_table_names_every_key_of_the_schema() -> None:
    import json

    schema = json.loads((REPO / "mpcml" / "api" / "jobfile.schema.json").read_text())
    keys = set(schema["properties"])
    for table in schema["properties"].values():
        keys |= set(table.get("properties", {})) if isinstance(table, dict) else set()
    text = (REPO / "README.md").read_text()
    section = text[text.index("## The job file") : text.index("### Transformers")]
    listed = set(re.findall(r"`\[?([a-z_]+)", section))
    assert keys <= listed, f"missing from the README's job-file table: {sorted(keys - listed)}"


def test_the_readme_names_every_cli_command() -> None:
    import argparse

    from mpcml.cli.main import parser

    def commands(p: argparse.ArgumentParser, prefix: str) -> set[str]:
        found: set[str] = set()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.add(f"{prefix} {name}")
                    found |= commands(sub, f"{prefix} {name}")
        return found

    text = " ".join((REPO / "README.md").read_text().split())  # lines wrap inside commands
    missing = sorted(c for c in commands(parser(), "mpcml") if c not in text)
    assert not missing, f"commands the README does not name: {missing}"
