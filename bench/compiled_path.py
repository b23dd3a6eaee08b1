"""What compiling the record's path with mypyc buys, from the same source (issue 46): `python -m bench --only mypyc`.

The package is copied out of the checkout as installed (pyproject's package-dir), the record-path modules that mypyc
compiles *correctly* are compiled there in place, and that copy is put ahead on PYTHONPATH of the measured
processes; nothing is built in the repository. Measured side by side, alternating: `read_events` per record (CPU µs,
best of `rounds`) and one replica of `consume --role all` (bench/scale_out.py's steady-state run: CPU seconds per
1,000 records and records/s), conversation-keyed and the Collector firehose.

Left out of the compiled set, each for a reason found in trying (docs/benchmarks.md): the conversation table (its
state class is decoded by msgspec, which reads a compiled dataclass's annotations, and mypyc rewrites a union such as
`str | None` as `type`: a restore from the changelog then fails), `adapters/_base.py`, `conversation/codec.py` and
`streams/records.py` (msgspec-decoded classes, the same failure)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

from bench.consumer_ingest import FIREHOSE_SHARE, build, send_all
from bench.scale_out import PARTITIONS, replicas_run
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
COMPILED = (
    "tracejudge/consumer/conversation/reading.py",
    "tracejudge/consumer/adapters/_kinds.py",
    "tracejudge/consumer/adapters/_text.py",
    "tracejudge/consumer/adapters/genai.py",
    "tracejudge/consumer/streams/processor.py",
)
BAR = 1.5  # the gain on `consume --role all` that would pay for a compiled build (wheels per platform, two code paths)


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
    """mypyc compiles `COMPILED` in the copy, in place; the build's seconds. One line and exit 69 without mypyc or a C
    compiler (a build without them runs the pure-Python package, as every install does)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise SystemExit("mypyc bench: no C compiler on PATH (cc/gcc)")
    (dest / "mypy.ini").write_text("[mypy]\npython_version = 3.11\nignore_missing_imports = True\n")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", *COMPILED], cwd=dest, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"mypyc bench: the build failed ({tail[0]}); is mypy installed (pip install -e '.[dev]')?")
    return time.monotonic() - start


def _env(path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return env


def read_events_us(path: Path | None, rounds: int) -> dict[str, float]:
    """`read_events` CPU µs per record (bench/consumer_ingest.per_record_us) in a process of its own, `path` ahead."""
    code = (
        "import json, tracejudge.consumer.conversation.reading as r\n"
        "from bench.consumer_ingest import per_record_us\n"
        f"us = {{k: v['read_events'] for k, v in per_record_us({rounds}).items()}}\n"
        "print(json.dumps({'module': r.__file__, **us}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(path), capture_output=True, text=True, check=True
    )
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    compiled = str(out.pop("module")).endswith(".so")
    if compiled != (path is not None):  # the measured process must have run what its label says
        raise RuntimeError(f"read_events came from {'a compiled' if compiled else 'the pure'} module")
    return out


def run(conversations: int = 6_000, rounds: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mypyc-") as tmp:
        built = copy_package(Path(tmp))
        build_s = compile_copy(built)
        variants: dict[str, Path | None] = {"pure Python": None, "mypyc": built}
        out: dict[str, Any] = {
            "compiled": list(COMPILED),
            "build_s": round(build_s, 1),
            "read_events_us": {name: [] for name in variants},
            "consume": {},
        }
        for _ in range(rounds):
            for name, path in variants.items():
                out["read_events_us"][name].append(read_events_us(path, rounds=5))
        saved = os.environ.get("PYTHONPATH")
        try:
            with EmbeddedBroker() as broker:
                assert broker._process is not None
                for keyed_by in ("conversation", "firehose"):
                    count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
                    records = build(count, keyed_by)
                    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
                    for _ in range(rounds):
                        for name, path in variants.items():  # alternating: the host's drift falls on both
                            os.environ.pop("PYTHONPATH", None)  # the replicas inherit it: the copy ahead, or none
                            if path is not None:
                                os.environ["PYTHONPATH"] = str(path)
                            topic = f"mypyc-{keyed_by}-{uuid.uuid4().hex[:6]}"
                            broker.create_topic(topic, PARTITIONS)
                            fill = functools.partial(send_all, broker.bootstrap_servers, topic, records)
                            row = replicas_run(
                                broker.bootstrap_servers, broker._process.pid, topic, count, len(records), 1, fill=fill
                            )
                            runs[name].append(
                                {
                                    "records_per_s": row["records_per_s"],
                                    "cpu_s_per_1000_records": row["cpu_s_per_1000_records"],
                                }
                            )
                    out["consume"][keyed_by] = {"records": len(records), "runs": runs}
        finally:
            os.environ.pop("PYTHONPATH", None)
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
    for row in out["consume"].values():
        best = {name: min(r["cpu_s_per_1000_records"] for r in runs) for name, runs in row["runs"].items()}
        row["gain_by_cpu"] = best["pure Python"] / best["mypyc"]
    best_turn = {name: min(r["turn record"] for r in rows) for name, rows in out["read_events_us"].items()}
    out["read_events_gain_turn_record"] = best_turn["pure Python"] / best_turn["mypyc"]
    out["adopt"] = out["consume"]["conversation"]["gain_by_cpu"] >= BAR
    return out


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = [
        (
            "mypyc, read_events (turn record)",
            ", ".join(
                f"{name} {min(r['turn record'] for r in runs):.1f} µs"
                for name, runs in result["read_events_us"].items()
            ),
            f"{result['read_events_gain_turn_record']:.2f}x",
            "",
        )
    ]
    for keyed_by, row in result["consume"].items():
        figures = ", ".join(
            f"{name} {min(r['cpu_s_per_1000_records'] for r in runs):.3f}" for name, runs in row["runs"].items()
        )
        rows.append(
            (
                f"mypyc, consume --role all, {keyed_by}",
                f"CPU s/1k records: {figures}",
                f"{row['gain_by_cpu']:.2f}x",
                f"adopted only at >= {BAR}x: {'yes' if result['adopt'] else 'no'}",
            )
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
