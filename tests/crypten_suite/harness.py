"""Run CrypTen's own test classes over `mpcml.session` instead of torch.distributed/gloo.

CrypTen ships its tests in its wheel as a top-level package named `test` (which the standard
library's `test` shadows), each test class a `MultiProcessTestCase` whose parties call
`crypten.init()` on gloo. Here each party is a process of ours (forked as the party daemon forks
its job workers) that runs a whole class's tests one after the other, each in a fresh
`mpcml.session` (mutual TLS, certificates for party0..partyN, fresh loopback ports), with the
provider a suite names forced after the class's `setUp`, and writes one report per test. The
parent counts a test whose report is missing from any party (the party died or hung) as a
failure, and starts the parties again from the next test. CrypTen's modules are imported from
the wheel, never copied.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
import traceback
import unittest
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.parties import dealer_process, make_pki

STALL_S = 240.0
"""A test that gives no report for this long on some party counts as hung."""
STARTUP_S = 60.0
"""The least a party may take to report its first test: its start-up (imports, session) is
not a stall, however short `stall_s`."""


@dataclass(frozen=True)
class Suite:
    """One CrypTen test class at a party count, on a provider."""

    module: str
    """`test.test_mpc` for CrypTen's own modules (the wheel's `test` package)."""
    cls: str
    world_size: int
    provider: str
    """"TFP" (CrypTen's insecure trusted first party) or "dealer" (`mpcml dealer`)."""
    heavy: bool = True
    """Whether `make test-crypten` runs this suite's slow tests too (`suites.SLOW`)."""
    ci: bool = True
    """Whether `make test` (CI) runs this suite's quick tests; `make test-crypten` always does."""

    @property
    def id(self) -> str:
        module = self.module.rpartition(".")[2].removeprefix("test_")
        return f"{module}.{self.cls}-{self.world_size}p-{self.provider.lower()}"


def crypten_test_package() -> Path:
    """Where CrypTen's wheel put its `test` package."""
    spec = importlib.util.find_spec("crypten")
    if spec is None or spec.origin is None:
        raise RuntimeError("CrypTen is not installed")
    package = Path(spec.origin).parent.parent / "test"
    if not (package / "multiprocess_test_case.py").exists():
        raise RuntimeError(f"CrypTen's wheel has no test package at {package}")
    return package


def load_module(name: str) -> ModuleType:
    """Import `name`; `test.*` resolves to CrypTen's test package, not the standard library's."""
    if name == "test" or name.startswith("test."):
        package = crypten_test_package()
        current = sys.modules.get("test")
        if current is None or Path(getattr(current, "__file__", "") or "").parent != package:
            for key in [k for k in sys.modules if k == "test" or k.startswith("test.")]:
                del sys.modules[key]
            spec = importlib.util.spec_from_file_location(
                "test", package / "__init__.py", submodule_search_locations=[str(package)]
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["test"] = module
            spec.loader.exec_module(module)
    return importlib.import_module(name)


def class_tests(suite: Suite) -> list[str]:
    """The class's tests, in the order unittest runs them."""
    cls = getattr(load_module(suite.module), suite.cls)
    return list(unittest.TestLoader().getTestCaseNames(cls))


@dataclass
class RunSpec:
    """What one party process runs: plain data, so that it crosses to the process."""

    suite: Suite
    rank: int
    tests: list[str]
    tls: dict[str, str]
    out: str
    dealer: str | None = None


def _provider_name(suite: Suite) -> str:
    if suite.provider == "TFP":
        return "TFP"
    from mpcml.runtime.provider import NAME

    return NAME


def _run_test(spec: RunSpec, index: int, name: str) -> dict[str, Any]:
    from crypten.config import cfg

    import mpcml
    from mpcml.runtime.provider import DealerEndpoint

    cls = getattr(load_module(spec.suite.module), spec.suite.cls)
    saved = copy.deepcopy(cfg.config)
    started = time.monotonic()
    report: dict[str, Any] = {"test": name, "rank": spec.rank}
    try:
        with mpcml.session(
            rank=spec.rank,
            world_size=spec.suite.world_size,
            peers=_await_peers(Path(spec.out), index),
            tls=mpcml.TLSFiles(**spec.tls),
            session_id=f"{spec.suite.id}-{index}",
            dealer=DealerEndpoint(spec.dealer) if spec.dealer else None,
        ):
            case = cls(name)
            case.rank = spec.rank
            case.setUp()  # CrypTen's own: its crypten.init() finds the session's CrypTen live
            # What the suite says, whatever the class's setUp chose (as CrypTen's Test3PC does).
            case.world_size = spec.suite.world_size
            cfg.mpc.provider = _provider_name(spec.suite)
            getattr(case, name)()
        report["status"] = "passed"
    except unittest.SkipTest as exc:
        report.update(status="skipped", detail=str(exc))
    except BaseException as exc:
        report.update(
            status="failed", error=f"{type(exc).__name__}: {exc}", detail=traceback.format_exc()
        )
    finally:
        cfg.set_config(saved)
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _peers_file(out: Path, index: int) -> Path:
    return out.parent / f"{out.name.rpartition('-rank')[0]}-peers{index}.json"


def _await_peers(out: Path, index: int) -> list[str]:
    """The addresses of test `index`'s session, once the parent chose them: ports picked just
    before a test, not minutes ahead, so that nothing else on the machine takes them first."""
    path = _peers_file(out, index)
    while not path.exists():
        time.sleep(0.02)
    peers: list[str] = json.loads(path.read_text())
    return peers


def _offer_peers(outs: list[Path], index: int, world_size: int) -> None:
    from mpcml.transport.address import free_ports

    path = _peers_file(outs[0], index)
    if not path.exists():
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps([f"127.0.0.1:{p}" for p in free_ports(world_size)]))
        staged.replace(path)


def _party_main(spec: RunSpec) -> None:
    out = Path(spec.out)
    # CrypTen's tests log and print freely: into this party's own file, not the test's output.
    log = out.with_suffix(".log").open("ab")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    with out.with_suffix(".jsonl").open("a") as reports:
        for index, name in enumerate(spec.tests):
            reports.write(json.dumps(_run_test(spec, index, name)) + "\n")
            reports.flush()


@dataclass
class Outcome:
    """One CrypTen test's result over every party."""

    status: str
    """passed, skipped or failed."""
    detail: str = ""
    reports: list[dict[str, Any]] = field(default_factory=list)


def _combine(name: str, reports: dict[int, dict[str, Any]], world_size: int) -> Outcome:
    missing = [r for r in range(world_size) if r not in reports]
    listed = [reports[r] for r in sorted(reports)]
    if missing:
        return Outcome(
            "failed",
            f"{name}: no report from rank(s) {missing}: the party process died or hung",
            listed,
        )
    statuses = {report["status"] for report in listed}
    if statuses == {"passed"}:
        return Outcome("passed", "", listed)
    if statuses == {"skipped"}:
        return Outcome("skipped", str(listed[0].get("detail", "")), listed)
    # A party's own error first, not a peer's notice that it aborted.
    failed = [r for r in listed if r["status"] == "failed"]
    own = [r for r in failed if not r["error"].startswith("PeerFailedError")] or failed or listed
    lines = [f"rank {r['rank']}: {r['status']} {r.get('error', '')}" for r in listed]
    return Outcome("failed", "\n".join(lines) + "\n\n" + str(own[0].get("detail", "")), listed)


def _read_reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def run_suite(
    tmp: Path, suite: Suite, tests: list[str] | None = None, stall_s: float = STALL_S
) -> dict[str, Outcome]:
    """Run `tests` (default: all the class's) of `suite`; every test gets an outcome. A test on
    which some party gives no report for `stall_s` counts as hung."""
    from mpcml.party.pool import worker_context

    tests = list(tests if tests is not None else class_tests(suite))
    names = [f"party{i}" for i in range(suite.world_size)]
    pki = make_pki(tmp / "pki", names)
    outcomes: dict[str, Outcome] = {}
    ctx = worker_context()
    with _dealer(tmp, suite) as dealer:
        start, attempt = 0, 0
        while start < len(tests):
            batch = tests[start:]
            outs = [tmp / f"attempt{attempt}-rank{r}" for r in range(suite.world_size)]
            procs = []
            for rank in range(suite.world_size):
                spec = RunSpec(suite, rank, batch, pki[names[rank]], str(outs[rank]), dealer)
                proc = ctx.Process(target=_party_main, args=(spec,), daemon=True)
                proc.start()
                procs.append(proc)
            try:
                done = _watch(procs, outs, len(batch), stall_s)
            finally:
                for proc in procs:
                    if proc.is_alive():
                        proc.kill()
                    proc.join(10)
            per_test: dict[int, dict[int, dict[str, Any]]] = {}
            for rank, out in enumerate(outs):
                for i, report in enumerate(_read_reports(out.with_suffix(".jsonl"))):
                    per_test.setdefault(i, {})[rank] = report
            # Where done < len(batch), a party died or hung in batch[done]: start after it.
            for i in range(min(done + 1, len(batch))):
                outcomes[batch[i]] = _combine(batch[i], per_test.get(i, {}), suite.world_size)
            start += done + 1
            attempt += 1
    return outcomes


def _watch(procs: list[Any], outs: list[Path], count: int, stall_s: float) -> int:
    """Wait until every party reported every test, or one died or stalled; returns how many
    tests every party reported."""
    last, last_change = -1, time.monotonic()
    while True:
        counts = [len(_read_reports(out.with_suffix(".jsonl"))) for out in outs]
        done = min(counts)
        if done == count:
            return done
        _offer_peers(outs, done, len(outs))
        if sum(counts) != last:
            last, last_change = sum(counts), time.monotonic()
        dead = [p for p, n in zip(procs, counts, strict=True) if n < count and not p.is_alive()]
        limit = stall_s if sum(counts) else max(stall_s, STARTUP_S)
        if dead or time.monotonic() - last_change > limit:
            time.sleep(0.5)  # a peer of a dead party may still be writing its last report
            return min(len(_read_reports(out.with_suffix(".jsonl"))) for out in outs)
        time.sleep(0.2)


def _dealer(tmp: Path, suite: Suite) -> Any:
    if suite.provider == "TFP":
        return contextlib.nullcontext()
    return dealer_process(tmp, tmp / "pki", log_level="info")


def main(argv: list[str]) -> int:
    """`python -m tests.crypten_suite.harness test.test_mpc TestTFP 2 dealer [test,test]`: one
    suite's outcomes and seconds, slowest last, for exploring outside pytest."""
    import tempfile

    module, cls, world_size, provider = argv[:4]
    suite = Suite(module, cls, int(world_size), provider)
    tests = argv[4].split(",") if len(argv) > 4 else None
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_suite(Path(tmp), suite, tests)
    seconds = {
        n: max((r.get("seconds", 0.0) for r in o.reports), default=0.0) for n, o in outcomes.items()
    }
    for name in sorted(outcomes, key=lambda n: seconds[n]):
        outcome = outcomes[name]
        print(f"{outcome.status:8} {seconds[name]:8.2f}s {name}")
        if outcome.status == "failed":
            print("    " + outcome.detail.strip().splitlines()[-1][:300])
    counts = {
        s: sum(o.status == s for o in outcomes.values()) for s in ("passed", "skipped", "failed")
    }
    print(f"{suite.id}: {len(outcomes)} run, {counts} in {time.monotonic() - started:.0f} s")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
