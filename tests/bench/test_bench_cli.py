"""The benches import and their command lines parse (no bench is run: they are timed, never asserted in a test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_bench_cli_offers_scale_and_rejects_an_unknown_bench() -> None:
    helped = _bench("--help")
    assert helped.returncode == 0
    assert "scale" in helped.stdout and "mypyc" in helped.stdout and "--max-replicas" in helped.stdout
    wrong = _bench("--only", "nope")
    assert wrong.returncode == 2
    assert "unknown bench: nope" in wrong.stderr


def test_scale_out_parses_its_flags_and_tabulates_a_result() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import scale_out

    assert scale_out.parse_args(["--replicas", "4"]).max_replicas == 4
    assert scale_out.parse_args([]).max_replicas is None
    assert scale_out.parse_args([]).producer_client is None  # both, where confluent-kafka is installed
    assert scale_out.parse_args(["--producer-client", "librdkafka"]).producer_client == ["librdkafka"]
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
    [rdkafka] = scale_out.table_rows({"inputs": {"conversation": {"runs": [{**run, "producer_client": "librdkafka"}]}}})
    assert rdkafka[1] == "2 replica(s), partitions 8/8, librdkafka producer"


def test_the_compiled_path_bench_copies_the_package_as_installed(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import compiled_path

    copy = compiled_path.copy_package(tmp_path)
    for module in compiled_path.COMPILED:  # each module it compiles is where mypyc will look for it
        assert (copy / module).is_file(), module
    assert not list(copy.rglob("__pycache__"))
    compiled_path.check_loaded(copy, compiled=False)  # a process with the copy ahead imports the copy's sources
    with pytest.raises(RuntimeError, match="not the compiled copy"):  # ...and the check tells a pure copy from a build
        compiled_path.check_loaded(copy, compiled=True)
    empty = tmp_path / "empty"  # nothing there: the process imports the editable install, which is not the copy
    empty.mkdir()
    with pytest.raises(RuntimeError, match="not the pure copy"):
        compiled_path.check_loaded(empty, compiled=False)


def _runs(cpu: list[float]) -> list[dict[str, float]]:
    return [{"records_per_s": 1.0, "cpu_s_per_1000_records": value} for value in cpu]


@pytest.mark.parametrize(("compiled_cpu", "adopt"), [(0.074, True), (0.0755, False)])
def test_the_compiled_path_is_adopted_only_at_one_and_a_half_times_the_median(compiled_cpu: float, adopt: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import compiled_path

    result = compiled_path.summarize(
        {
            "read_events_us": {
                "pure Python": [{"turn record": v} for v in (19.0, 30.0, 18.0)],
                "mypyc": [{"turn record": v} for v in (16.0, 1.0, 17.0)],
            },
            "consume": {
                "conversation": {
                    "runs": {
                        "pure Python": _runs([0.111, 0.5, 0.109]),  # median 0.111: one slow round moves nothing
                        "mypyc": _runs([compiled_cpu, compiled_cpu, 0.001]),
                    }
                }
            },
        }
    )
    assert result["adopt"] is adopt
    first, second = compiled_path.table_rows(result)
    assert first[1] == "pure Python 19.0 µs, mypyc 16.0 µs" and first[2] == "1.19x"
    assert second[1] == f"CPU s/1k records (median): pure Python 0.111, mypyc {compiled_cpu:.3f}"
    assert second[3] == f"adopted only at >= 1.5x: {'yes' if adopt else 'no'}"
