"""Scale-out: N replicas of `tracejudge consume --role all` (real processes, one consumer group) over one pre-filled
topic of PARTITIONS partitions, for each keying of bench/consumer_ingest.py (conversation, trace, the Collector
firehose), N from 1 to `max_replicas` (default: the machine's cores).

Figures are CPU seconds per 1,000 records as well as records/s: wall-clock rates move from host to host (and on a
shared host from minute to minute), CPU time per record moves less. Each replica's CPU is its own
`process_cpu_seconds_total` (from its /metrics; /proc where the endpoint lacks it), sampled at its first record and
at the barrier; the broker's (Tansu) is read from /proc beside it over the same window. The barrier is every
conversation's outcome (`tracejudge_sessions_total`, sample rate 0: sampled out, no judge call), summed
over the replicas."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.consumer_ingest import END_GRACE_S, FIREHOSE_SHARE, KEYINGS, TURNS_PER_CONVERSATION, produce
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port

PARTITIONS = 16
TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _scrape(port: int) -> dict[str, float]:
    """The few series the bench reads from one replica's /metrics."""
    out = {"records": 0.0, "done": 0.0, "cpu": 0.0}
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("tracejudge_records_total{"):
            out["records"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("tracejudge_sessions_total{") and 'outcome="sampled_out"' in line:
            out["done"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("process_cpu_seconds_total "):
            out["cpu"] = float(line.rsplit(" ", 1)[1])
    return out


def _cpu(scraped: dict[str, float], pid: int) -> float:
    """The replica's own `process_cpu_seconds_total` where its /metrics has it, else its CPU from /proc: `tracejudge
    consume` serves its own registry, which (as of this bench) holds no process collector."""
    return scraped["cpu"] or _proc_cpu_s(pid)


def _owned(log: Path, topic: str) -> int | None:
    """Input partitions the replica owned at the end: its last "partitions assigned" log line (Tansu cannot answer
    kafka-python's DescribeGroups: it sends an ACL operation the client rejects)."""
    text = log.read_text(errors="replace").splitlines()
    lines = [line for line in text if "partitions assigned:" in line and "judge-queue" not in line]
    if not lines:
        return None
    listed = lines[-1].split("partitions assigned:", 1)[1]
    if "partition=" in listed:
        return len(re.findall(rf"{re.escape(topic)}'?, partition=\d+", listed))
    return len(re.findall(r"\d+", listed.split("(", 1)[0]))


def replicas_run(
    bootstrap: str, broker_pid: int, topic: str, conversations: int, records: int, n: int
) -> dict[str, Any]:
    """N replicas from their first record to every conversation's outcome."""
    group = f"scale-{uuid.uuid4().hex[:6]}"
    ports = [free_port() for _ in range(n)]
    logs = Path(tempfile.mkdtemp(prefix="scale-out-"))
    procs = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "tracejudge"),
                "consume",
                "--bootstrap-servers",
                bootstrap,
                "--topic",
                topic,
                "--group-id",
                group,
                "--start-from",
                "earliest",
                "--role",
                "all",
                "--sample-rate",
                "0",
                "--session-idle-timeout",
                "600",
                "--end-grace",
                str(END_GRACE_S),
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(port),
                "--no-judge-check",
                "--no-results",
                "--kafka-config",
                "session_timeout_ms=6000",
                "--kafka-config",
                "heartbeat_interval_ms=1000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(logs / f"{port}.log").open("wb"),
            stdin=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        first: float | None = None
        start_cpu: list[float] = []
        broker_start = 0.0
        deadline = time.monotonic() + 600
        while True:
            scraped = [_scrape(port) for port in ports]
            if first is None and sum(s["records"] for s in scraped) > 0:
                first, broker_start = time.perf_counter(), _proc_cpu_s(broker_pid)
                start_cpu = [_cpu(s, p.pid) for s, p in zip(scraped, procs, strict=True)]
            if first is not None and sum(s["done"] for s in scraped) >= conversations:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{n} replicas: {sum(s['done'] for s in scraped):.0f} of {conversations} done")
            time.sleep(0.005 if first is None else 0.05)
        assert first is not None
        elapsed = time.perf_counter() - first
        broker_cpu = _proc_cpu_s(broker_pid) - broker_start
        end_cpu = [_cpu(s, p.pid) for s, p in zip(scraped, procs, strict=True)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    owned = [_owned(logs / f"{port}.log", topic) for port in ports]
    shutil.rmtree(logs, ignore_errors=True)
    per_replica: list[dict[str, Any]] = [
        {
            "records": s["records"],
            "records_per_s": s["records"] / elapsed,
            "cpu_s": c1 - c0,
            "cpu_s_per_1000_records": 1000 * (c1 - c0) / s["records"] if s["records"] else None,
        }
        for s, c0, c1 in zip(scraped, start_cpu, end_cpu, strict=True)
    ]
    cpu = sum(r["cpu_s"] for r in per_replica)
    return {
        "replicas": n,
        "seconds": elapsed,
        "records_per_s": records / elapsed,
        "per_replica": per_replica,
        "partitions_owned": owned,
        "cpu_s_per_1000_records": 1000 * cpu / records,
        "broker_cpu_s_per_1000_records": 1000 * broker_cpu / records,
    }


def run(conversations: int = 4_000, max_replicas: int | None = None) -> dict[str, Any]:
    max_replicas = max_replicas or os.cpu_count() or 1
    out: dict[str, Any] = {
        "conversations": conversations,
        "turns_per_conversation": TURNS_PER_CONVERSATION,
        "partitions": PARTITIONS,
        "max_replicas": max_replicas,
        "inputs": {},
    }
    with EmbeddedBroker() as broker:
        assert broker._process is not None
        pid = broker._process.pid
        for keyed_by in KEYINGS:
            count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
            topic = f"scale-{keyed_by}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            records = produce(broker.bootstrap_servers, topic, count, keyed_by)
            runs = [
                replicas_run(broker.bootstrap_servers, pid, topic, count, records, n)
                for n in range(1, max_replicas + 1)
            ]
            one = runs[0]
            for row in runs:
                row["efficiency"] = row["records_per_s"] / (row["replicas"] * one["records_per_s"])
                row["cpu_vs_one_replica"] = row["cpu_s_per_1000_records"] / one["cpu_s_per_1000_records"]
            out["inputs"][keyed_by] = {"conversations": count, "records": records, "runs": runs}
    return out


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for keyed_by, row in result["inputs"].items():
        for r in row["runs"]:
            rows.append(
                (
                    f"scale-out, {keyed_by}-keyed",
                    f"{r['replicas']} replica(s), partitions {'/'.join(str(p) for p in r['partitions_owned'])}",
                    f"{r['records_per_s']:.0f} records/s, {r['cpu_s_per_1000_records']:.3f} CPU s/1k records "
                    f"(broker {r['broker_cpu_s_per_1000_records']:.3f})",
                    f"efficiency {r['efficiency']:.2f}, CPU {r['cpu_vs_one_replica']:.2f}x one replica",
                )
            )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_out")
    parser.add_argument("--conversations", type=int, default=4_000)
    parser.add_argument("--max-replicas", "--replicas", type=int, default=None, help="default: the machine's cores")
    return parser.parse_args(argv)


if __name__ == "__main__":
    import json

    args = parse_args()
    print(json.dumps(run(args.conversations, args.max_replicas), indent=2))
