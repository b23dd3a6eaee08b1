"""The consume and backfill commands set the collector's policy for a long-running consumer; importing the package
does not (an application embedding the service keeps its own)."""

from __future__ import annotations

import gc
import subprocess
import sys

from tracejudge.consumer._gc import THRESHOLDS, collect_less


def test_collect_less_sets_the_consumer_thresholds() -> None:
    before = gc.get_threshold()  # a command run in this process earlier (a backfill test) may have set them already
    try:
        gc.set_threshold(700, 10, 10)  # CPython's default
        collect_less()
        assert gc.get_threshold() == THRESHOLDS
        assert THRESHOLDS[0] > 700
    finally:
        gc.set_threshold(*before)


def test_importing_the_consumer_leaves_the_collector_alone() -> None:
    code = (
        "import gc; before = gc.get_threshold(); "
        "import tracejudge.consumer.cli.consume, tracejudge.consumer.cli.backfill, tracejudge.consumer.service; "
        "assert gc.get_threshold() == before, gc.get_threshold()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_commands_call_it() -> None:
    from tracejudge.consumer.cli import backfill, consume

    assert "collect_less" in consume.run_consume.__code__.co_names
    assert "collect_less" in backfill.run_backfill.__code__.co_names
