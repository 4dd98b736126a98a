"""A party's config: the worker's torch threads, checked when the daemon reads it."""

from __future__ import annotations

import pytest

from mpcml.config import ConfigError
from mpcml.demo.cluster import PARTIES_DIR
from mpcml.party.config import PartyConfig

ALICE = PARTIES_DIR / "alice" / "party.toml"


def test_torch_threads_default_to_torchs_own() -> None:
    assert PartyConfig.load(ALICE).torch_threads == 0


def test_torch_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCML_TORCH_THREADS", "2")
    assert PartyConfig.load(ALICE).torch_threads == 2


@pytest.mark.parametrize("value", ["-1", "many"])
def test_bad_torch_threads_name_the_key(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MPCML_TORCH_THREADS", value)
    with pytest.raises(ConfigError, match=r"torch_threads.*>= 0"):
        PartyConfig.load(ALICE)


@pytest.mark.parametrize("value", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_devices_read_as_written(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # Syntax only: whether the GPU exists is for the job worker to find, not the daemon.
    monkeypatch.setenv("MPCML_DEVICE", value)
    assert PartyConfig.load(ALICE).device == value


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:-1", "CUDA:0", "cuda:01", "cuda0"])
def test_bad_devices_name_the_party_and_the_file(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("MPCML_DEVICE", value)
    with pytest.raises(ConfigError, match=rf"party 'alice': device '{value}' is not .*alice"):
        PartyConfig.load(ALICE)


def test_an_emulated_network_is_read_and_a_bad_one_shows_the_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert PartyConfig.load(ALICE).network == ""
    monkeypatch.setenv("MPCML_NETWORK", "rtt=40ms,bandwidth=352mbit")
    assert PartyConfig.load(ALICE).network == "delay=20ms,bandwidth=352mbit"
    monkeypatch.setenv("MPCML_NETWORK", "delay=20")
    with pytest.raises(ConfigError, match=r"delay=20ms.*in the config in"):
        PartyConfig.load(ALICE)
