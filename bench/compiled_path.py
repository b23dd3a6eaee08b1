"""What compiling the record's path with mypyc buys, from the same source (issue 46): `python -m bench --only mypyc`.

Two copies of the package are made from the checkout as installed (pyproject's package-dir), one left as it is and
one with the record-path modules that mypyc compiles *correctly* compiled in place; each is put ahead on PYTHONPATH of
the processes it is measured in, and a process with the same environment is checked to import every module of
`COMPILED` from that copy (compiled, or not). Nothing is built in the repository. Measured side by side, the order
rotating each round (bench/_stats.alternate): `read_events` per record (CPU µs, best of five in each process) and one
replica of `consume --role all` (bench/scale_out.py's steady-state run: CPU seconds per 1,000 records),
conversation-keyed and the Collector firehose; the figures are medians.

Left out of the compiled set, each for what trying it showed (docs/benchmarks.md): the conversation table (its state
class is decoded by msgspec, which reads a compiled dataclass's annotations, and mypyc rewrites a union such as
`str | None` as `type`: a restore from the changelog then fails), `adapters/_base.py`, `conversation/codec.py` and
`streams/records.py` (msgspec-decoded classes, the same failure), `adapters/_frameworks.py` (mypyc 2.4.1 stops with
an internal `AssertionError: Any`) and `conversation/textless.py` (a compiled class cannot be subclassed by
interpreted code, and a test subclasses `TextlessSpans`)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

from bench._stats import alternate
from bench.consumer_ingest import FIREHOSE_SHARE, build, send_all
from bench.scale_out import PARTITIONS, replicas_run
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
COMPILED = (
    "tracejudge/consumer/decode.py",
    "tracejudge/consumer/adapters/__init__.py",
    "tracejudge/consumer/adapters/_conventions.py",
    "tracejudge/consumer/adapters/_kinds.py",
    "tracejudge/consumer/adapters/_text.py",
    "tracejudge/consumer/adapters/genai.py",
    "tracejudge/consumer/conversation/reading.py",
    "tracejudge/consumer/streams/processor.py",
)
BAR = 1.5  # the gain on `consume --role all` that would pay for a compiled build (wheels per platform, two code paths)
PURE, MYPYC = "pure Python", "mypyc"


class Skipped(Exception):
    """The compiled copy could not be built here: the bench says why and keeps an earlier run's figures."""


def copy_package(dest: Path) -> Path:
    """The package as installed, in `dest/tracejudge` (pyproject's `[tool.setuptools.package-dir]`)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = dest / "tracejudge"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, folder in mapping.items():
        shutil.copytree(ROOT / folder, dest / name.replace(".", "/"), ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def compile_copy(dest: Path) -> float:
    """mypyc compiles `COMPILED` in the copy, in place; the build's seconds. `Skipped` without a C compiler or mypyc,
    or when a module is left without its extension."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise Skipped("no C compiler on PATH (cc/gcc)")
    (dest / "mypy.ini").write_text("[mypy]\npython_version = 3.11\nignore_missing_imports = True\n")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", *COMPILED], cwd=dest, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower()]
        raise Skipped(
            f"mypyc failed ({(errors or ['exit status ' + str(done.returncode)])[0]}); mypy is in the test extra"
        )
    for module in COMPILED:
        if not list((dest / module).parent.glob(Path(module).stem + ".cpython-*.so")):
            raise Skipped(f"mypyc left {module} without its extension")
    return time.monotonic() - start


def _python(path: Path, code: str) -> str:
    """The last line `code` prints, run with `path` ahead on PYTHONPATH (its stderr in the error if it fails)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(path)},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"a measured process failed: {done.stderr.strip()[-500:] or 'no output'}")
    return lines[-1]


def check_loaded(path: Path, compiled: bool) -> None:
    """Every module of `COMPILED` is imported from the copy at `path`, as an extension iff `compiled`: a process that
    imported the editable install, or the pure module, would measure the wrong thing."""
    names = [module.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for module in COMPILED]
    code = f"import importlib, json; print(json.dumps([importlib.import_module(n).__file__ for n in {names!r}]))"
    for name, file in zip(names, json.loads(_python(path, code)), strict=True):
        if not str(file).startswith(str(path)) or str(file).endswith(".so") != compiled:
            raise RuntimeError(f"{name} came from {file}, not the {'compiled' if compiled else 'pure'} copy")


def read_events_us(path: Path) -> dict[str, float]:
    """`read_events` CPU µs per record (bench/consumer_ingest.per_record_us, best of five) in a process of its own."""
    code = (
        "import json\nfrom bench.consumer_ingest import per_record_us\n"
        "print(json.dumps({k: v['read_events'] for k, v in per_record_us(5).items()}))"
    )
    out: dict[str, float] = json.loads(_python(path, code))
    return out


def consume_once(
    path: Path,
    compiled: bool,
    broker: EmbeddedBroker,
    keyed_by: str,
    conversations: int,
    records: list[Any],
    runs: list[dict[str, float]],
) -> float:
    """One replica's steady-state run (bench/scale_out.replicas_run) with the copy at `path` ahead on its
    PYTHONPATH (it inherits the bench's environment), appended to `runs`; its CPU seconds per 1,000 records."""
    check_loaded(path, compiled)
    assert broker._process is not None
    os.environ["PYTHONPATH"] = str(path)
    topic = f"mypyc-{keyed_by}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, PARTITIONS)
    fill = functools.partial(send_all, broker.bootstrap_servers, topic, records)
    row = replicas_run(broker.bootstrap_servers, broker._process.pid, topic, conversations, len(records), 1, fill=fill)
    runs.append({"records_per_s": row["records_per_s"], "cpu_s_per_1000_records": row["cpu_s_per_1000_records"]})
    return float(row["cpu_s_per_1000_records"])


def medians(runs: dict[str, list[dict[str, float]]], figure: str) -> dict[str, float]:
    """Each variant's median of `figure` over its runs."""
    return {name: statistics.median(run[figure] for run in rows) for name, rows in runs.items()}


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    """Medians, the gains (pure / compiled) and the decision, from the runs."""
    for row in out["consume"].values():
        median = row["median_cpu_s_per_1000_records"] = medians(row["runs"], "cpu_s_per_1000_records")
        row["gain_by_cpu"] = median[PURE] / median[MYPYC]
    turn = medians(out["read_events_us"], "turn record")
    out["read_events_gain_turn_record"] = turn[PURE] / turn[MYPYC]
    out["adopt"] = out["consume"]["conversation"]["gain_by_cpu"] >= BAR
    return out


def run(conversations: int = 6_000, rounds: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mypyc-") as tmp:
        try:
            variants = {PURE: copy_package(Path(tmp, "pure")), MYPYC: copy_package(Path(tmp, "mypyc"))}
            build_s = compile_copy(variants[MYPYC])
            for name, path in variants.items():
                check_loaded(path, compiled=name == MYPYC)
        except (Skipped, RuntimeError) as exc:  # a build that does not import is no build either
            return {"skipped": f"mypyc: {exc}"}
        out: dict[str, Any] = {"compiled": list(COMPILED), "build_s": round(build_s, 1), "rounds": rounds}
        reads: dict[str, list[dict[str, float]]] = {name: [] for name in variants}

        def read_once(name: str) -> float:
            reads[name].append(read_events_us(variants[name]))
            return reads[name][-1]["turn record"]

        alternate({name: functools.partial(read_once, name) for name in variants}, rounds)
        out["read_events_us"] = reads
        out["consume"] = {}
        saved = os.environ.get("PYTHONPATH")
        try:
            with EmbeddedBroker() as broker:
                for keyed_by in ("conversation", "firehose"):
                    count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
                    records = build(count, keyed_by)
                    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}

                    consume = {
                        name: functools.partial(
                            consume_once, path, name == MYPYC, broker, keyed_by, count, records, runs[name]
                        )
                        for name, path in variants.items()
                    }
                    alternate(consume, rounds)
                    out["consume"][keyed_by] = {"records": len(records), "runs": runs}
        finally:
            os.environ.pop("PYTHONPATH", None)
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
    return summarize(out)


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    turn = medians(result["read_events_us"], "turn record")
    rows = [
        (
            "mypyc, read_events (turn record)",
            ", ".join(f"{name} {us:.1f} µs" for name, us in turn.items()),
            f"{result['read_events_gain_turn_record']:.2f}x",
            "",
        )
    ]
    for keyed_by, row in result["consume"].items():
        median = medians(row["runs"], "cpu_s_per_1000_records")
        figures = ", ".join(f"{name} {cpu:.3f}" for name, cpu in median.items())
        rows.append(
            (
                f"mypyc, consume --role all, {keyed_by}",
                f"CPU s/1k records (median): {figures}",
                f"{row['gain_by_cpu']:.2f}x",
                f"adopted only at >= {BAR}x: {'yes' if result['adopt'] else 'no'}",
            )
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
