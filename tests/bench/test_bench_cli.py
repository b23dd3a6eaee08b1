"""The benches import and their command lines parse (no bench is run: they are timed, never asserted in a test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_bench_cli_offers_scale_and_rejects_an_unknown_bench() -> None:
    helped = _bench("--help")
    assert helped.returncode == 0
    assert "scale" in helped.stdout and "--max-replicas" in helped.stdout
    wrong = _bench("--only", "nope")
    assert wrong.returncode == 2
    assert "unknown bench: nope" in wrong.stderr


def test_scale_out_parses_its_flags_and_tabulates_a_result() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import scale_out

    assert scale_out.parse_args(["--replicas", "4"]).max_replicas == 4
    assert scale_out.parse_args([]).max_replicas is None
    run = {
        "replicas": 2,
        "records_per_s": 900.0,
        "partitions_owned": [8, 8],
        "cpu_s_per_1000_records": 0.2,
        "broker_cpu_s_per_1000_records": 0.05,
        "efficiency": 0.9,
        "cpu_vs_one_replica": 1.05,
    }
    [row] = scale_out.table_rows({"inputs": {"conversation": {"runs": [run]}}})
    assert row[1] == "2 replica(s), partitions 8/8"
    assert "0.200 CPU s/1k records (broker 0.050)" in row[2]
    assert row[3] == "efficiency 0.90, CPU 1.05x one replica"
