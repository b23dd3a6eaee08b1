"""Scale-out: N replicas of `tracejudge consume --role all` (real processes, one consumer group) over one topic of
PARTITIONS partitions, for each keying of bench/consumer_ingest.py (conversation, trace, the Collector firehose), N
from 1 to `max_replicas` (default: the machine's cores; at most PARTITIONS). The records (built ahead) are written
once the group has formed, one partition set per replica, so no rebalance and no restore of moved state (a cost of
scaling out, not of running) falls in the window (`replicas_run`): from the first record read to the last
conversation's outcome (`tracejudge_sessions_total`, sample rate 0: sampled out, no judge call, summed over the
replicas) for CPU, to the last record read for the rate.

Figures are CPU seconds per 1,000 records as well as records/s: wall-clock rates move from host to host (and on a
shared host from minute to minute), CPU time per record moves less. Each replica's CPU is its own
`process_cpu_seconds_total` (from its /metrics; /proc where the endpoint lacks it), read at each end of the window;
the broker's (Tansu) is read from /proc beside it over the same window.

Each N runs `rounds` times per `--producer-client` (kafka-python's, and librdkafka's where confluent-kafka is
installed), the two alternating, each N's efficiency and CPU against one replica of the same producer."""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._stats import machine
from bench.consumer_ingest import END_GRACE_S, FIREHOSE_SHARE, KEYINGS, TURNS_PER_CONVERSATION, build, send_all
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port

PARTITIONS = 16
ROUNDS = 2  # each (N, producer), its best kept
CONVERSATIONS = 16_000  # a keying's (a tenth for the firehose, ten records a turn): windows of seconds, not tenths
PRODUCER_CLIENTS = ("kafka-python", "librdkafka")
TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# Only the series read (prometheus_client's `name[]` filter): a full exposition every 50 ms would charge the replica
# the bench's own polling (each collects every family of a registry of ~100).
# The process collector is read once at each end of the window, unfiltered: prometheus_client's filter leaves out a
# collector that does not describe itself.
SCRAPED = "&".join(f"name[]={name}" for name in ("tracejudge_records_total", "tracejudge_sessions_total"))


def _scrape(port: int, every: bool = False) -> dict[str, float]:
    """The few series the bench reads from one replica's /metrics (`every`: the whole exposition, for its CPU)."""
    out = {"records": 0.0, "done": 0.0, "cpu": 0.0, "up": 0.0}
    query = "" if every else f"?{SCRAPED}"
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=2).read().decode()
    except OSError:
        return out
    out["up"] = 1.0
    for line in text.splitlines():
        if line.startswith("tracejudge_records_total{"):
            out["records"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("tracejudge_sessions_total{") and 'outcome="sampled_out"' in line:
            out["done"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("process_cpu_seconds_total "):
            out["cpu"] = float(line.rsplit(" ", 1)[1])
    return out


def _scrape_up(port: int) -> dict[str, float]:
    """The whole exposition (its CPU and counters) at an end of the window: a failed scrape would read as zeros."""
    for _ in range(50):
        scraped = _scrape(port, every=True)
        if scraped["up"]:
            return scraped
        time.sleep(0.1)
    raise RuntimeError(f"the replica on port {port} did not answer its /metrics")


def sampling(pid: int, raw: Path) -> subprocess.Popen[bytes]:
    """py-spy recording one process until SIGINT (the `bench` extra): 200 Hz, raw stacks, only the thread holding the
    GIL (running Python), so a thread waiting for it (after a socket write, say) is not charged. Blocking: py-spy
    pauses the process for each sample. With `--nonblocking` it reads a running process and drops every sample it
    cannot read whole: 143-146 of about 500 in a 2.5 s Quix Streams round (with or without `--gil`), 528 blocking."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed (pip install -e '.[bench]')")
    command = [spy, "record", "--pid", str(pid), "-r", "200", "-t", "--gil", "-f", "raw", "-o", str(raw)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cpu(scraped: dict[str, float], pid: int) -> float:
    """The replica's own `process_cpu_seconds_total` (its registry holds a process collector), else, for a build
    whose /metrics lacks it, its CPU from /proc."""
    return scraped["cpu"] or _proc_cpu_s(pid)


_MOVES = re.compile(r"tracejudge\.consumer\.streams: partitions (assigned|revoked|lost): \[([\d, ]*)\]")


def _owned(log: Path) -> set[int]:
    """The input partitions a replica owns now, replayed from its stream thread's assigned/revoked/lost log lines
    (Tansu cannot answer kafka-python's DescribeGroups: it sends an ACL operation the client rejects)."""
    mine: set[int] = set()
    for kind, numbers in _MOVES.findall(log.read_text(errors="replace")):
        partitions = {int(n) for n in numbers.split(",") if n.strip()}
        mine = mine | partitions if kind == "assigned" else mine - partitions
    return mine


def _moves(log: Path) -> int:
    """How many partition moves (assigned, revoked, lost) a replica has logged so far."""
    return len(_MOVES.findall(log.read_text(errors="replace")))


def _formed(logs: list[Path]) -> bool:
    """Every replica owns partitions and together they own each once: the group formed, no rebalance in flight."""
    owned = [_owned(log) for log in logs]
    return all(owned) and sum(len(o) for o in owned) == PARTITIONS and len(set().union(*owned)) == PARTITIONS


def replicas_run(
    bootstrap: str,
    broker_pid: int,
    topic: str,
    conversations: int,
    records: int,
    n: int,
    profile: Path | None = None,
    fill: Callable[[], object] | None = None,
    producer_client: str = "kafka-python",
) -> dict[str, Any]:
    """N replicas from their first record to every conversation's outcome (the rate to the last record read).
    `profile`: py-spy's raw samples of the first replica over that window, written there. `fill`: the topic is empty
    and `fill` writes its records once the group has formed, so the window holds no rebalance (else the replicas join
    while the first reads). `producer_client`: the replicas' `--producer-client`."""
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
                "--producer-client",
                producer_client,
            ],
            stdout=subprocess.DEVNULL,
            stderr=(logs / f"{port}.log").open("wb"),
            stdin=subprocess.DEVNULL,
        )
        for port in ports
    ]
    sampler: subprocess.Popen[bytes] | None = None
    filling: threading.Thread | None = None
    failed: list[BaseException] = []  # the fill's error, raised here

    def filled() -> None:
        try:
            assert fill is not None
            fill()
        except BaseException as exc:
            failed.append(exc)

    log_files = [logs / f"{port}.log" for port in ports]
    try:
        if fill is not None:
            deadline = time.monotonic() + 300
            while not _formed(log_files):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{n} replicas: the group did not form")
                time.sleep(0.1)  # polled: the replicas' own log lines
            filling = threading.Thread(target=filled, name="bench-fill")
            filling.start()
        # The window: from the first record read to the last conversation's outcome, so every record's work is in it
        # (a trace-keyed record's events are applied after the record itself was read, from the repartition topic:
        # a window ending at the last record read left a fifth of their CPU out); the rate is to the last record
        # read (the seconds after it, the last conversations' end grace and idle time, are the same at any N and
        # would weigh more the faster N replicas read). The fill (librdkafka) writes several times faster than the
        # replicas read, so they read a backlog, not the writer's pace.
        first: float | None = None
        start: list[dict[str, float]] = []
        start_cpu: list[float] = []
        start_moves: list[int] = []
        broker_start = 0.0
        read_at: float | None = None
        deadline = time.monotonic() + 600
        while True:
            if failed:
                raise RuntimeError(f"{n} replicas: the fill failed: {failed[0]!r}") from failed[0]
            scraped = [_scrape(port) for port in ports]
            read, done = sum(s["records"] for s in scraped), sum(s["done"] for s in scraped)
            if first is None and read > 0:
                if profile is not None:  # over the measured window only (the attach takes a few ms of it)
                    sampler = sampling(procs[0].pid, profile)
                first, broker_start = time.perf_counter(), _proc_cpu_s(broker_pid)
                start = [_scrape_up(port) for port in ports]
                start_cpu = [_cpu(s, p.pid) for s, p in zip(start, procs, strict=True)]
                start_moves = [_moves(log) for log in log_files]
            if first is not None and read_at is None and read >= records:
                read_at = time.perf_counter()
            if first is not None and done >= conversations:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{n} replicas: {done:.0f} of {conversations} done")
            if first is None or read_at is not None:  # the tail to the last outcome: short, and it ends in steps
                time.sleep(0.005 if first is None else 0.02)
            else:
                time.sleep(_pause(read, records, first, time.perf_counter()))
        assert first is not None
        to_outcomes = time.perf_counter() - first
        broker_cpu = _proc_cpu_s(broker_pid) - broker_start
        end = [_scrape_up(port) for port in ports]
        end_cpu = [_cpu(s, p.pid) for s, p in zip(end, procs, strict=True)]
        rebalances = sum(_moves(log) for log in log_files) - sum(start_moves)
        elapsed = (read_at or time.perf_counter()) - first
        owned = [len(_owned(log)) for log in log_files]  # before a stop revokes them
    finally:
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)
            sampler = None
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if filling is not None:
            filling.join(120)
    shutil.rmtree(logs, ignore_errors=True)
    per_replica: list[dict[str, Any]] = []
    for s0, s1, c0, c1 in zip(start, end, start_cpu, end_cpu, strict=True):
        read = s1["records"] - s0["records"]
        per_replica.append(
            {
                "records": read,
                "records_per_s": read / elapsed,
                "cpu_s": c1 - c0,
                "cpu_s_per_1000_records": 1000 * (c1 - c0) / read if read else None,
            }
        )
    cpu = sum(r["cpu_s"] for r in per_replica)
    window = sum(r["records"] for r in per_replica)
    return {
        "replicas": n,
        "seconds": elapsed,
        "records_in_window": window,
        "seconds_to_outcomes": to_outcomes,
        "partition_moves_in_window": rebalances,  # a rebalance mid-window: `run` prefers a round without
        "records_per_s": window / elapsed,
        "records_per_s_to_outcomes": window / to_outcomes,
        "per_replica": per_replica,
        "partitions_owned": owned,
        "cpu_s_per_1000_records": 1000 * cpu / window,
        "broker_cpu_s_per_1000_records": 1000 * broker_cpu / window,
    }


def _pause(progress: float, total: float, since: float, now: float) -> float:
    """How long the bench waits, while the replicas read, before scraping again: a quarter of the reading time left
    at the rate so far, between 20 ms and 0.5 s, so the last record read is still seen within 20 ms. Each scrape costs
    the replica a request (a thread, the WSGI app, the collection): every 20 ms through the window it was about 5 % of
    a replica's CPU (45 of 832 samples in py-spy's profile), twice as much per record at two replicas, where each reads
    half as fast. From the last record read to the last outcome (end grace, outcomes released in steps) the bench
    scrapes every 20 ms again."""
    if progress <= 0 or now <= since:
        return 0.02
    left = (total - progress) / (progress / (now - since))
    return max(0.02, min(0.5, left / 4))


def fill_fast(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> int:
    """The records written through librdkafka where confluent-kafka is installed (a keyed record placed by murmur2,
    as kafka-python and the Java client place it): kafka-python's producer, pure Python in this process on the same
    cores, writes slower than two replicas read, so the topic would never hold a backlog to read."""
    try:
        from confluent_kafka import Producer
    except ImportError:
        return send_all(bootstrap, topic, records)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 21,
        }
    )
    errors: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(error)

    for key, value in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:  # the queue full: let librdkafka send
                producer.poll(0.05)
    if producer.flush(120) > 0 or errors:
        raise RuntimeError(f"the fill of {topic} did not finish: {len(errors)} failed, e.g. {errors[:1]}")
    return len(records)


def available_producers() -> tuple[str, ...]:
    """kafka-python's producer, and librdkafka's where confluent-kafka is installed (the `librdkafka` extra)."""
    try:
        from tracejudge.consumer.kafka.rdkafka import confluent_kafka_version

        text = confluent_kafka_version()
    except ImportError:
        return PRODUCER_CLIENTS[:1]
    version = tuple(int(part) for part in re.findall(r"\d+", text)[:3])
    return PRODUCER_CLIENTS if version >= (2, 13, 2) else PRODUCER_CLIENTS[:1]  # the `librdkafka` extra's floor


def run(
    conversations: int = CONVERSATIONS,
    max_replicas: int | None = None,
    producer_clients: tuple[str, ...] | None = None,
    rounds: int = ROUNDS,
) -> dict[str, Any]:
    """Each (N, producer) `rounds` times, the producers' order rotating from round to round; each keeps its round
    with the least CPU per record (a shared host's noise only adds CPU) among those without a rebalance in the
    window, and its efficiency from its fastest round; all rounds' figures beside them."""
    max_replicas = min(max_replicas or os.cpu_count() or 1, PARTITIONS)  # a replica owns whole partitions
    producer_clients = producer_clients or available_producers()
    out: dict[str, Any] = {
        "machine": machine(),
        "conversations": conversations,
        "turns_per_conversation": TURNS_PER_CONVERSATION,
        "partitions": PARTITIONS,
        "max_replicas": max_replicas,
        "producer_clients": list(producer_clients),
        "rounds": rounds,
        "inputs": {},
    }
    with EmbeddedBroker() as broker:
        assert broker._process is not None
        pid = broker._process.pid
        for keyed_by in KEYINGS:
            count = conversations // FIREHOSE_SHARE if keyed_by == "firehose" else conversations
            built = build(count, keyed_by)
            records = len(built)
            runs = []
            for n in range(1, max_replicas + 1):  # each on a topic of its own, filled once its group formed
                tried: dict[str, list[dict[str, Any]]] = {client: [] for client in producer_clients}
                order = list(producer_clients)
                for _ in range(rounds):
                    for client in order:  # alternating: a host that drifts moves both alike
                        topic = f"scale-{keyed_by}-{n}-{uuid.uuid4().hex[:6]}"
                        broker.create_topic(topic, PARTITIONS)
                        bootstrap = broker.bootstrap_servers
                        fill = functools.partial(fill_fast, bootstrap, topic, built)
                        tried[client].append(
                            replicas_run(bootstrap, pid, topic, count, records, n, fill=fill, producer_client=client)
                        )
                    order = order[1:] + order[:1]
                for client, rows in tried.items():
                    steady = [r for r in rows if not r["partition_moves_in_window"]] or rows  # no rebalance in it
                    best = min(steady, key=lambda r: r["cpu_s_per_1000_records"])
                    runs.append(
                        {
                            **best,
                            "producer_client": client,
                            "best_records_per_s": max(r["records_per_s"] for r in steady),
                            "rounds_cpu_s_per_1000_records": [r["cpu_s_per_1000_records"] for r in rows],
                            "rounds_records_per_s": [r["records_per_s"] for r in rows],
                        }
                    )
            for row in runs:
                one = next(r for r in runs if r["replicas"] == 1 and r["producer_client"] == row["producer_client"])
                # each from its own best round: the fastest round of N against the fastest of one replica
                row["efficiency"] = row["best_records_per_s"] / (row["replicas"] * one["best_records_per_s"])
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
                    f"{r['replicas']} replica(s), partitions {'/'.join(str(p) for p in r['partitions_owned'])}"
                    + ("" if r.get("producer_client", "kafka-python") == "kafka-python" else ", librdkafka producer"),
                    f"{r['records_per_s']:.0f} records/s, {r['cpu_s_per_1000_records']:.3f} CPU s/1k records "
                    f"(broker {r['broker_cpu_s_per_1000_records']:.3f})",
                    f"efficiency {r['efficiency']:.2f}, CPU {r['cpu_vs_one_replica']:.2f}x one replica",
                )
            )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_out")
    parser.add_argument("--conversations", type=int, default=CONVERSATIONS)
    parser.add_argument("--max-replicas", "--replicas", type=int, default=None, help="default: the machine's cores")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each (N, producer); the best is kept")
    parser.add_argument(
        "--producer-client",
        choices=PRODUCER_CLIENTS,
        action="append",
        help="the replicas' --producer-client (repeat for both; default: both where confluent-kafka is installed)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    import json

    args = parse_args()
    clients = tuple(args.producer_client) if args.producer_client else None
    print(json.dumps(run(args.conversations, args.max_replicas, clients, args.rounds), indent=2))
