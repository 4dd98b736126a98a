# Every target installs what it needs first; `make install` is quick once done.
PYTHON ?= python3
VENV ?= .venv
# What installs offline on the CPU machines; the code itself supports torch 2.11-2.14.
TORCH_SPEC ?= torch==2.13.0
CRYPTEN_SPEC ?= crypten==0.4.1
# torchvision's model zoo, for bench/models.py and the zoo tests. PyPI's wheel is a CUDA build
# whose compiled ops cannot load beside the CPU torch, and a torchvision on the path breaks
# transformers' import: it goes in a folder of its own that only bench/zoo.py puts on the path.
TORCHVISION_SPEC ?= torchvision==0.28.0
ZOO := $(VENV)/zoo
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mpcml-installed
# SecretFlow's SPU, the peer bench/train.py puts beside stock CrypTen: it pins numpy < 2 and
# jax 0.4.34, so it lives in an environment of its own, never the project's.
SPU_VENV := .venv-spu
SPU_SPEC ?= spu==0.9.5
SPU_STAMP := $(SPU_VENV)/.installed
# OpenMined's PSI, the peer bench/psi.py puts beside mpcml's: it pins protobuf 6.
PSI_VENV := .venv-psi
PSI_SPEC ?= openmined-psi==2.0.6
PSI_STAMP := $(PSI_VENV)/.installed

# The web console's browser tests (tests/system/test_console.py) drive Debian's chromium through
# Playwright. `make test` installs it where it can (root with apt-get); elsewhere those tests
# skip, saying so.
CHROMIUM ?= /usr/bin/chromium

.PHONY: install test coverage test-fast test-crypten lint format proto bench demo clean browser

install: $(STAMP)

# CrypTen's metadata pulls the dead `sklearn` package: it is installed alone, with --no-deps;
# the packages it really imports come with mpcml's own dependencies.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-deps "$(CRYPTEN_SPEC)"
	$(PY) -m pip install -q --no-warn-conflicts -e ".[dev]"
	$(PY) -m pip install -q --no-deps --upgrade --target $(ZOO) "$(TORCHVISION_SPEC)"
	touch $(STAMP)

# The whole suite. Of CrypTen's own tests it runs the quick ones (tests/crypten_suite/suites.py);
# `make test-crypten` runs them all.
test: install browser
	$(PY) -m pytest -q -m "not crypten_full and not bench_smoke"

browser:
	@test -x $(CHROMIUM) || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
	  || apt-get install -y -q chromium >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
	  || true
	@test -x $(CHROMIUM) \
	  || echo "no $(CHROMIUM): the console's browser tests will skip (apt-get install chromium)"

# The whole suite with the coverage of the test process (daemons' and workers' own lines are not
# counted: they run in processes of their own). Tracing costs about 45 s on the fast tier alone,
# which put CI over its 20-minute budget: CI runs `make test`.
coverage: install
	$(PY) -m pytest -q -m "not crypten_full and not bench_smoke" --cov --cov-report=term:skip-covered

# CrypTen's own test suites over mpcml.session, every test of every suite (tests/crypten_suite).
test-crypten: install
	$(PY) -m pytest -q -m crypten tests/crypten_suite

# The fast tier: no daemons, no party sessions (the `system` marker); under 3 minutes.
test-fast: install
	$(PY) -m pytest -q -m "not system"

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

proto: install
	$(PY) -m mpcml.proto.generate
	$(PY) -m mpcml.proto.docs

$(SPU_STAMP):
	test -x $(SPU_VENV)/bin/python || $(PYTHON) -m venv $(SPU_VENV)
	$(SPU_VENV)/bin/python -m pip install -q "$(SPU_SPEC)"
	touch $(SPU_STAMP)

$(PSI_STAMP):
	test -x $(PSI_VENV)/bin/python || $(PYTHON) -m venv $(PSI_VENV)
	$(PSI_VENV)/bin/python -m pip install -q "$(PSI_SPEC)"
	touch $(PSI_STAMP)

# Every benchmark, written to bench/REPORT.md with plots and bench/results.json (bench/report.py);
# QUICK=1: the smallest workloads, on loopback and an emulated WAN, in about 10 minutes.
bench: install $(SPU_STAMP) $(PSI_STAMP)
	$(PY) -m pytest -q -m bench_smoke tests/test_bench_report.py
	$(PY) bench/report.py $(if $(QUICK),--quick)

# The main job: a fresh CA, the coordinator and three party daemons on loopback, secure training
# and inference (`mpcml demo --help`; DEMO_ARGS="--json" for the JSON report).
demo: install
	$(VENV)/bin/mpcml demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) $(SPU_VENV) $(PSI_VENV) .pytest_cache .mypy_cache .ruff_cache
