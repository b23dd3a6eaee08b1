"""`make test`: the checks that are not tests beside pytest, the tests in two phases, and where the time went.

    python -m tests.run_suite [--workers N] [PYTEST ARGS ...]

- The checks (ruff, ruff format, mypy, the import contracts) run in one background thread beside the first phase,
  one after another (two cores: one for them, the rest for the tests' I/O waits); each ends in one line, `check NAME:
  ok` or `check NAME: FAILED` with its output above it and the command that reproduces it.
- Phase one: every test not marked `serial`, on pytest-xdist workers (each with its own broker: the `broker` fixture
  is session-scoped, and a worker is a session), scheduled by file so a module's shared consumer joins its group once.
- Phase two: the `serial` tests, one at a time and alone on the machine (timing-sensitive reliability tests, the
  fresh-clone quickstart on its fixed ports).
- Each phase prints its slowest tests (`--durations`); `.test-reports/durations.txt` (out of git) lists every test's
  time, slowest first, and each file's. The last line is the whole run's count: `suite: N passed, N failed, N skipped`.

Extra arguments go to both phases (a path runs that folder alone; `-k`, `-x` ...). Exit status: 0 only when both
phases and every check passed (a phase that selects no test counts as passed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / ".test-reports"
NO_TESTS_COLLECTED = 5  # pytest's exit status when a selection holds no test
DEFAULT_WORKERS = 3  # two cores; most test time is spent waiting on brokers, processes and group joins

CHECKS: dict[str, tuple[list[str], str]] = {
    "ruff": ([sys.executable, "-m", "ruff", "check", "."], "ruff check . (ruff check --fix . fixes most)"),
    "format": ([sys.executable, "-m", "ruff", "format", "--check", "."], "ruff format ."),
    "mypy": ([sys.executable, "-m", "mypy", "--no-error-summary"], "mypy"),
    "import-contracts": (
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            "--no-logo",
        ],
        "lint-imports (the contracts are [tool.importlinter] in pyproject.toml)",
    ),
}


@dataclass
class CheckResult:
    name: str
    ok: bool
    seconds: float
    output: str
    fix: str


@dataclass
class Checks:
    """The checks that are not tests, one after another in a thread beside the first phase."""

    results: list[CheckResult] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> Checks:
        self.thread = threading.Thread(target=self._run, name="checks", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        for name, (command, fix) in CHECKS.items():
            started = time.monotonic()
            try:
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
                ok, output = done.returncode == 0, done.stdout + done.stderr
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, output = False, repr(exc)
            self.results.append(CheckResult(name, ok, time.monotonic() - started, output, fix))

    def report(self) -> bool:
        assert self.thread is not None
        self.thread.join()
        for result in self.results:
            if not result.ok:
                print(f"\n----- {result.name} -----\n{result.output.rstrip()}")
        for result in self.results:
            verdict = "ok" if result.ok else f"FAILED (run `{result.fix}` for the list)"
            print(f"check {result.name}: {verdict} in {result.seconds:.1f} s")
        return all(result.ok for result in self.results)


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped


def read_junit(path: Path) -> tuple[Counts, dict[str, float]]:
    """Counts and each test's time (setup, call and teardown) from a JUnit XML report; a test that failed in its call
    and again in its teardown has two entries there and counts once."""
    outcomes: dict[str, str] = {}
    durations: dict[str, float] = {}
    if path.exists():
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            module = (case.get("classname") or "").replace(".", "/")
            name = f"{module}.py::{case.get('name')}"
            durations[name] = durations.get(name, 0.0) + float(case.get("time") or 0.0)
            tags = {child.tag for child in case}
            outcome = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
            if outcomes.get(name) != "failed":
                outcomes[name] = outcome
    values = list(outcomes.values())
    return Counts(values.count("passed"), values.count("failed"), values.count("skipped")), durations


def run_phase(name: str, selection: list[str], extra: list[str]) -> tuple[int, Counts, dict[str, float], float]:
    report = REPORTS / f"{name}.xml"
    report.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *selection,
        "--durations=20",
        "--durations-min=1",
        f"--junitxml={report}",
    ]
    print(f"\n===== phase {name}: {' '.join(command[3:] + extra)}", flush=True)
    started = time.monotonic()
    status = subprocess.call([*command, *extra], cwd=ROOT)
    seconds = time.monotonic() - started
    counts, durations = read_junit(report)
    if status == NO_TESTS_COLLECTED:
        status = 0
    return status, counts, durations, seconds


def write_durations(durations: dict[str, float], phases: dict[str, float]) -> Path:
    REPORTS.mkdir(exist_ok=True)
    path = REPORTS / "durations.txt"
    by_file: dict[str, float] = defaultdict(float)
    for test, seconds in durations.items():
        by_file[test.split("::", 1)[0]] += seconds
    lines = ["# tests/run_suite.py: each phase's wall time, then every file and every test, slowest first (s)"]
    lines += [f"phase {name:>9} {seconds:9.1f}" for name, seconds in phases.items()]
    lines += ["", "# files"]
    lines += [f"{seconds:9.1f}  {name}" for name, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])]
    lines += ["", "# tests"]
    lines += [f"{seconds:9.2f}  {name}" for name, seconds in sorted(durations.items(), key=lambda kv: -kv[1])]
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workers",
        default=os.environ.get("TRACEJUDGE_TEST_WORKERS", str(DEFAULT_WORKERS)),
        help=f"pytest-xdist workers for phase one (default {DEFAULT_WORKERS}, or $TRACEJUDGE_TEST_WORKERS; 0: none)",
    )
    parser.add_argument("--no-checks", action="store_true", help="skip ruff, mypy and the import contracts")
    options, extra = parser.parse_known_args(argv)
    REPORTS.mkdir(exist_ok=True)
    started = time.monotonic()

    checks = None if options.no_checks else Checks().start()
    parallel = ["-m", "not serial"]
    if options.workers != "0":
        parallel += ["-n", options.workers, "--dist", "loadfile"]
    statuses, total, durations, phases = [], Counts(), {}, {}
    for name, selection in (("parallel", parallel), ("serial", ["-m", "serial", "-p", "no:xdist"])):
        status, counts, phase_durations, seconds = run_phase(name, selection, extra)
        statuses.append(status)
        total.add(counts)
        durations.update(phase_durations)
        phases[name] = seconds
        if status != 0 and counts.failed == 0:  # a phase that broke before its tests ran (a usage error, a crash)
            total.failed += 1
    phases["total"] = time.monotonic() - started
    report = write_durations(durations, phases)
    print()
    checks_ok = True if checks is None else checks.report()
    if checks is not None:
        ran = len(checks.results)
        total.failed += sum(not result.ok for result in checks.results) + (len(CHECKS) - ran)
        if ran != len(CHECKS):
            checks_ok = False
            print(f"checks: only {ran} of {len(CHECKS)} ran (the checks thread failed)")
    print(f"durations of every test: {report.relative_to(ROOT)}; wall time {phases['total']:.0f} s")
    print(f"suite: {total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return 0 if checks_ok and not any(statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
