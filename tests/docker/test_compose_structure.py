"""The compose files hold together: commands the CLI knows, files that exist, healthchecks and
volumes on every service, and each holder's certificates mounted only where they belong."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mpcml.api.jobfile import load as load_job
from mpcml.cli.main import parser
from mpcml.coordinator.server import CoordinatorConfig
from tests.support.compose import COMPOSE_FILE, REPO, load

DOCKER = COMPOSE_FILE.parent
COMPOSE = load()
SERVICES: dict[str, Any] = COMPOSE["services"]
PARTIES = [n for n, s in SERVICES.items() if s["command"][:2] == ["mpcml", "party"]]


def _volumes(service: dict[str, Any]) -> dict[str, str]:
    """Target path -> source (a named volume, or a path relative to docker/)."""
    out = {}
    for volume in service.get("volumes", []):
        # Compose substitutes `${VAR:?message}` before it reads the mount.
        source, target, *_ = re.sub(r"\$\{[^}]*\}", "$VAR", str(volume)).split(":")
        out[target] = source
    return out


def _host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """Where a bind-mounted container path comes from, or None for a named volume."""
    for target, source in _volumes(service).items():
        if container_path == target or container_path.startswith(target + "/"):
            if not source.startswith((".", "/")):
                return None
            return (DOCKER / source / container_path[len(target) :].lstrip("/")).resolve()
    raise AssertionError(f"{container_path} is on no volume of the service")


def _commands(service: dict[str, Any]) -> list[list[str]]:
    test = [str(t) for t in service["healthcheck"]["test"]]
    return [[str(a) for a in service["command"]], test[1:]]


def _identities() -> dict[str, str]:
    """Name -> role of every certificate the certs service issues."""
    argv = [str(a) for a in SERVICES["certs"]["command"]]
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--identity"]
    return dict(p.split(":") for p in pairs)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck_a_volume_and_a_restart_policy(name: str) -> None:
    service = SERVICES[name]
    assert service["healthcheck"]["test"][0] == "CMD", service["healthcheck"]
    assert service.get("volumes"), f"{name} has no volume"
    assert service.get("restart") in ("no", "unless-stopped", "always", "on-failure")
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_command_exists_in_the_cli(name: str) -> None:
    for argv in _commands(SERVICES[name]):
        assert argv[0] == "mpcml", argv
        try:
            parser().parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{name}: `{' '.join(argv)}` is not a valid mpcml command ({exc})")


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_referenced_file_exists(name: str) -> None:
    service = SERVICES[name]
    for source in _volumes(service).values():
        if source.startswith((".", "/")):
            assert (DOCKER / source).resolve().exists(), f"{name}: {source} does not exist"
        else:
            assert source in COMPOSE["volumes"], f"{name}: volume {source} is not declared"
    argv = [str(a) for a in service["command"]]
    if "--config" in argv:
        config = _host_path(service, argv[argv.index("--config") + 1])
        assert config is not None and config.is_file(), f"{name}: no config {config}"
        tomllib.loads(config.read_text())


def test_each_holder_mounts_only_its_own_certificates() -> None:
    certs = _volumes(SERVICES["certs"])
    issued = _identities()
    for name, service in SERVICES.items():
        if name == "certs":
            continue
        assert name in issued, f"the certs service issues no certificate for {name}"
        mine = certs[f"/srv/mpcml/out/{name}"]
        mounted = _volumes(service)
        assert mounted["/srv/mpcml/certs"] == mine, f"{name} mounts {mounted['/srv/mpcml/certs']}"
        others = {v for t, v in certs.items() if t != f"/srv/mpcml/out/{name}"}
        assert not others & set(mounted.values()), f"{name} mounts another holder's keys"
    assert issued["analyst"] == "client"


def test_parties_are_in_the_roster_and_reach_each_other_by_service_name() -> None:
    coordinator = SERVICES["coordinator"]
    config = _host_path(coordinator, "/srv/mpcml/config/coordinator.toml")
    assert config is not None
    roster = tomllib.loads(config.read_text())["parties"]
    assert sorted(roster) == sorted(PARTIES)
    for party in PARTIES:
        env = SERVICES[party]["environment"]
        assert env["MPCML_DATA_ADDRESS"].split(":")[0] == party
        assert env["MPCML_TLS_CERT"] == f"/srv/mpcml/certs/{party}.pem"
        assert env["MPCML_COORDINATOR"].split(":")[0] == "coordinator"
        profile = _host_path(SERVICES[party], "/srv/mpcml/party/party.toml")
        assert profile is not None and tomllib.loads(profile.read_text())["name"] == party


def test_the_gpu_overlay_only_changes_known_parties() -> None:
    overlay = load(DOCKER / "compose.gpu.yml")
    for name, service in overlay["services"].items():
        assert name in PARTIES, f"compose.gpu.yml changes {name}, not a party"
        assert service["environment"]["MPCML_DEVICE"].startswith("cuda")
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_the_multi_host_overlay_publishes_each_service_and_takes_addresses_from_outside() -> None:
    overlay = load(DOCKER / "compose.multihost.yml")
    assert set(overlay["services"]) == set(SERVICES) - {"certs"}
    for name, service in overlay["services"].items():
        assert service.get("ports") or SERVICES[name].get("ports"), f"{name} publishes no port"
        certs = _volumes(service)["/srv/mpcml/certs"]
        assert certs == "$VAR", f"{name}: certificates must come from the host: {certs}"
        for key, value in (service.get("environment") or {}).items():
            assert str(value).startswith("${"), f"{name}: {key} is not taken from outside"


def test_the_postgres_overlay_moves_only_the_coordinators_store_to_a_healthy_postgres(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overlay = load(DOCKER / "compose.postgres.yml")
    assert set(overlay["services"]) == {"postgres", "coordinator"}
    postgres, coordinator = overlay["services"]["postgres"], overlay["services"]["coordinator"]
    assert re.fullmatch(r"postgres:\d+[-.\w]*", postgres["image"]), postgres["image"]
    assert _volumes(postgres) == {"/var/lib/postgresql/data": "postgres-data"}
    assert "postgres-data" in overlay["volumes"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert coordinator["depends_on"]["postgres"]["condition"] == "service_healthy"
    env = coordinator["environment"]
    user, _, rest = env["MPCML_STORE"].removeprefix("postgresql://").partition("@")
    assert ":" not in user, "the password belongs in PGPASSWORD, not in the URL"
    assert rest == f"postgres:5432/{postgres['environment']['POSTGRES_DB']}"
    assert user == postgres["environment"]["POSTGRES_USER"]
    password = postgres["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${MPCML_POSTGRES_PASSWORD:?") and env["PGPASSWORD"] == password
    extras = re.search(r'"\.\[([a-z,]+)\]"', (DOCKER / "Dockerfile").read_text())
    assert extras and "postgres" in extras.group(1).split(","), "the image lacks psycopg"
    monkeypatch.setenv("MPCML_STORE", env["MPCML_STORE"])  # over docker/coordinator.toml's
    assert CoordinatorConfig.load(DOCKER / "coordinator.toml").store == env["MPCML_STORE"]


def test_the_documented_job_file_loads() -> None:
    job, _ = load_job(DOCKER / "examples" / "train.toml")
    assert set(job.spec.parties or [b.party for b in job.spec.features]) <= set(PARTIES)
    assert (REPO / "docker" / "README.md").is_file()


def test_every_daemon_exposes_its_console_to_its_own_operators_certificate() -> None:
    services = load(DOCKER / "compose.yml")["services"]
    identities = dict(arg.split(":", 1) for arg in services["certs"]["command"] if ":" in str(arg))
    for name in ("coordinator", "alice", "bob", "carol"):
        env = services[name]["environment"]
        assert env["MPCML_CONSOLE_ADDRESS"] == "0.0.0.0:8443", name
        user = env["MPCML_CONSOLE_USERS"]
        assert identities.get(user) == "client", (name, user)
        published = [p for p in services[name]["ports"] if p.endswith(":8443")]
        assert len(published) == 1 and "MPCML_PUBLISH_ADDRESS:-127.0.0.1" in published[0], name
