"""The layering is enforced, not hoped for: shared base <- tracer <- metrics <- consumer, and no import cycle anywhere.

`lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]) on the tree in every `make test` (the
`import-contracts` check of tests/run_suite.py, beside pytest); grimp, the graph library under it, finds any cycle
between modules, imports inside functions included. Both are run here against a copy of the packages with planted
violations, so a checker that silently checks nothing fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tracejudge._shared", "tracejudge.tracer", "tracejudge.metrics", "tracejudge.consumer")
SOURCES = {  # directory -> package ([tool.setuptools.package-dir])
    "shared": "tracejudge._shared",
    "tracer": "tracejudge.tracer",
    "metrics": "tracejudge.metrics",
    "consumer": "tracejudge.consumer",
}


def module_cycles() -> list[list[str]]:
    """Every import cycle between tracejudge's modules, each as its shortest loop starting at its smallest module."""
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    cycles: set[tuple[str, ...]] = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                loop = (importer, *back[:-1])
                start = loop.index(min(loop))
                cycles.add(loop[start:] + loop[:start])
    return [list(cycle) for cycle in sorted(cycles)]


def lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_only_the_kafka_seam_imports_kafka_python() -> None:
    """Directly, anywhere in the consumer, imports inside functions included; and the contract that `lint-imports`
    checks names every module of the consumer but the seam, so a new module is covered too."""
    graph = grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    outside = sorted(
        m
        for m in graph.find_modules_that_directly_import("kafka")
        if m.startswith("tracejudge.consumer") and not m.startswith("tracejudge.consumer.kafka")
    )
    assert outside == []

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (seam,) = [c for c in contracts if c["name"].startswith("Only the Kafka seam")]
    children = {m for m in graph.find_children("tracejudge.consumer") if m != "tracejudge.consumer.kafka"}
    assert children == set(seam["source_modules"])


def test_no_import_cycle_anywhere() -> None:
    assert module_cycles() == []


def test_planted_violations_are_caught(tmp_path: Path) -> None:
    """A copy of the packages with an upward import, a cycle and a private import, all inside functions."""
    for directory, package in SOURCES.items():
        shutil.copytree(
            ROOT / directory, tmp_path.joinpath(*package.split(".")), ignore=shutil.ignore_patterns("__pycache__")
        )
    planted = {
        "_shared/_planted.py": "def f() -> None:\n    from tracejudge.tracer import setup  # noqa: F401\n",
        "tracer/_planted.py": "def f() -> None:\n    from tracejudge.consumer import cli  # noqa: F401\n",
        "metrics/cycle_a.py": "from . import cycle_b  # noqa: F401\n",
        "metrics/cycle_b.py": "def f() -> None:\n    from . import cycle_a  # noqa: F401\n",
        "consumer/_planted.py": "def f() -> None:\n    from tracejudge.metrics import _backends  # noqa: F401\n",
        "consumer/planted_command.py": (
            "def f() -> None:\n    from tracejudge.consumer.cli import options  # noqa: F401\n"
        ),
        "consumer/conversation/planted_kafka.py": "def f() -> None:\n    import kafka  # noqa: F401\n",
        "consumer/emit/planted_pool.py": (
            "def f() -> None:\n    from tracejudge.consumer.judging import pool  # noqa: F401\n"
        ),
        "consumer/kafka/planted_runtime.py": (
            "def f() -> None:\n    from tracejudge.consumer.streams import task  # noqa: F401\n"
        ),
        "consumer/streams/planted_up.py": (
            "def f() -> None:\n    from tracejudge.consumer import service  # noqa: F401\n"
        ),
    }
    for path, text in planted.items():
        (tmp_path / "tracejudge" / path).write_text(text)
    with (tmp_path / "tracejudge/consumer/streams/task.py").open("a") as task:  # the stream thread's bottom reaching up
        task.write("\n\ndef _planted() -> None:\n    from . import assembler  # noqa: F401\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the copy shadows the editable install

    completed = lint_imports(tmp_path, env)
    report = completed.stdout + completed.stderr
    assert completed.returncode != 0, report
    assert "Contracts: 0 kept, 11 broken." in report, report
    assert "tracejudge.consumer.conversation.planted_kafka -> kafka" in report
    assert "tracejudge.consumer.streams.planted_up -> tracejudge.consumer.service" in report
    assert "tracejudge.consumer.kafka.planted_runtime -> " in report  # the seam reaching into the runtime
    assert "tracejudge.consumer.streams.task -> tracejudge.consumer.streams.assembler" in report
    assert "tracejudge._shared._planted -> tracejudge.tracer.setup" in report
    assert "tracejudge.consumer.emit.planted_pool -> tracejudge.consumer.judging.pool" in report
    assert "tracejudge.tracer._planted -> tracejudge.consumer.cli" in report
    assert "tracejudge.consumer.planted_command -> tracejudge.consumer.cli.options" in report
    assert "tracejudge.consumer._planted -> tracejudge.metrics._backends" in report
    assert "No cycles are allowed in tracejudge.metrics." in report and ".cycle_b -> .cycle_a" in report

    script = "import json; from tests.test_layers import module_cycles; print(json.dumps(module_cycles()))"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    found = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr
    assert ["tracejudge.metrics.cycle_a", "tracejudge.metrics.cycle_b"] in json.loads(found.stdout)
