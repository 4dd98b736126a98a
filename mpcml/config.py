"""Daemon configuration: a TOML file, with `MPCML_*` environment variables over it.

`MPCML_DATA_ADDRESS=...` overrides the key `data_address`, `MPCML_TLS_CA=...` the key `ca` of
the `[tls]` table. Relative paths are relative to the config file, so a profile folder can move.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpcml.errors import MpcmlError
from mpcml.transport.tls import TLSFiles


class ConfigError(MpcmlError, ValueError):
    """A config file is missing, malformed, or lacks a value; the message names the file."""


def read_toml(path: Path, what: str, error: type[MpcmlError] = ConfigError) -> dict[str, Any]:
    """A TOML file as a dict; `error` names `what` it is when it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {str(path)!r} is not valid TOML: {exc}") from None


def load(path: str | Path, env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], Path]:
    """The config as a dict, with environment overrides applied, and the folder it lives in."""
    path = Path(path)
    data = read_toml(path, "the config")
    env = os.environ if env is None else env
    for name, value in env.items():
        if not name.startswith("MPCML_") or not value:
            continue
        key = name[len("MPCML_") :].lower()
        table, _, sub = key.partition("_")
        if isinstance(data.get(table), dict) and sub:
            data[table][sub] = value
        else:
            data[key] = value
    return data, path.resolve().parent


def need(data: Mapping[str, Any], key: str, where: Path) -> Any:
    """A required value, or a ConfigError naming the key."""
    if key not in data or data[key] in ("", None):
        raise ConfigError(f"the config in {where} needs `{key}`")
    return data[key]


def resolve(base: Path, value: str | Path) -> Path:
    """A path from the config, relative to the config's folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def tls_files(data: Mapping[str, Any], base: Path) -> TLSFiles | None:
    """The `[tls]` table's files, or None when `insecure = true`."""
    if flag(data, "insecure", base):
        return None
    table = data.get("tls")
    if not isinstance(table, dict):
        raise ConfigError(f"the config in {base} needs a [tls] table (ca, cert, key)")
    return TLSFiles(*(resolve(base, need(table, k, base)) for k in ("ca", "cert", "key")))


def flag(data: Mapping[str, Any], key: str, where: Path) -> bool:
    """An optional true/false setting (false by default), or a ConfigError naming it."""
    value = str(data.get(key, "false")).lower()
    if value not in ("true", "1", "yes", "false", "0", "no", ""):
        raise ConfigError(f"`{key}` in the config in {where} must be true or false, got {value!r}")
    return value in ("true", "1", "yes")


def positive_int(
    data: Mapping[str, Any], key: str, default: int, where: Path, minimum: int = 1
) -> int:
    """An optional whole-number setting of at least `minimum`, or a ConfigError naming it."""
    value = data.get(key, default)
    try:
        number = int(str(value).replace("_", ""))
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ConfigError(
            f"`{key}` in the config in {where} must be a whole number >= {minimum}, got {value!r}"
        )
    return number
