"""A stream-processing peer on the same job: Quix Streams (librdkafka, RocksDB state, changelog topics) running the
same per-record function (`read_events`) into keyed state with a changelog, one outcome per completed conversation
to an output topic, beside one `tracejudge consume --role all` replica (bench/scale_out.py) on the same records, the
same broker and the same machine. Conversation-keyed records: the state key is the record key, as in our exporter.

Both are clocked from their first record and charged CPU over their window: Quix's ends with the checkpoint after its
last outcome (its state's changelog and its offsets written, every COMMIT_INTERVAL_S as ours commits), ours when the
last conversation's outcome is counted. Quix runs in this process (`time.process_time`, nothing else runs here
meanwhile), ours is its own process."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.consumer_ingest import MAX_RECORD_BYTES, produce
from bench.scale_out import PARTITIONS, _proc_cpu_s, replicas_run
from tracejudge.consumer.conversation.reading import read_events
from tracejudge.consumer.embedded_broker import EmbeddedBroker

QUIX = "Quix Streams (read_events → keyed state + changelog → outcome topic)"
OURS = "tracejudge consume --role all (1 replica, sample rate 0)"
COMMIT_INTERVAL_S = 2.0  # `consume`'s --commit-interval default
OURS_RDK = "the same, --producer-client librdkafka (the internal topics written by librdkafka)"


def _create_topic(bootstrap: str, topic: str) -> None:
    """With its retention set: Quix Streams reads `retention.ms` from the input topic's config to size its changelog
    and repartition topics, and Tansu returns only the configs a topic was created with."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        configs = {"retention.ms": "-1", "retention.bytes": "-1"}
        admin.create_topics([NewTopic(topic, PARTITIONS, 1, topic_configs=configs)])
    finally:
        admin.close()


def _confluent_version() -> str:
    """The confluent-kafka that both Quix Streams and our librdkafka producer ran on (Quix pins its range)."""
    import confluent_kafka

    from tracejudge.consumer.kafka.rdkafka import confluent_kafka_version

    return f"{confluent_kafka_version()} (librdkafka {confluent_kafka.libversion()[0]})"


def quix_run(
    bootstrap: str, broker_pid: int, topic: str, conversations: int, records: int, profile: Path | None = None
) -> dict[str, Any]:
    """From its first record to the end of the checkpoint after its last outcome: Quix Streams writes its state's
    changelog, flushes its producer and commits offsets at a checkpoint (every `commit_interval` s, ours' 2 s, and
    once forced as it stops), so a window that ended at the last outcome would leave the state's writes out.
    `profile`: py-spy's raw samples of this process over the measured window, written there."""
    from quixstreams import Application
    from quixstreams.checkpointing.checkpoint import Checkpoint

    from bench.scale_out import sampling

    sampler: Any = None

    clock: dict[str, float] = {}
    completed = 0
    with tempfile.TemporaryDirectory(prefix="quix-state-") as state_dir:
        app = Application(
            broker_address=bootstrap,
            consumer_group=f"quix-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="earliest",
            state_dir=Path(state_dir),
            use_changelog_topics=True,
            commit_interval=COMMIT_INTERVAL_S,
        )
        source = app.topic(topic, key_deserializer="bytes", value_deserializer="bytes")
        outcomes = app.topic(f"{topic}-quix-outcomes", value_serializer="json")

        def assemble(value: bytes, state: Any) -> dict[str, Any] | None:
            nonlocal completed
            nonlocal sampler
            if not clock:
                if profile is not None:
                    sampler = sampling(os.getpid(), profile)
                clock.update(wall=time.perf_counter(), cpu=time.process_time(), broker=_proc_cpu_s(broker_pid))
            events, _ = read_events(value, max_bytes=MAX_RECORD_BYTES)
            outcome = None
            for event in events:
                turns = state.get("turns", [])
                if event.turn is not None:  # what a judge needs of the turn, as our table keeps it
                    turn = event.turn
                    turns.append([turn.index, turn.span_id, turn.start_ns, turn.input, turn.output, turn.is_error])
                if event.ended:
                    state.delete("turns")
                    outcome = {"conversation": event.conversation_id, "turns": len(turns), "outcome": "sampled_out"}
                    completed += 1
                    if completed >= conversations:
                        app.stop()  # then the forced checkpoint (`committed`)
                else:
                    state.set("turns", turns)
            return outcome

        sdf = app.dataframe(source)
        sdf = sdf.apply(assemble, stateful=True).filter(lambda v: v is not None)
        sdf.to_topic(outcomes)
        checkpoints = 0
        commit = Checkpoint.commit

        def committed(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal checkpoints
            result = commit(self, *args, **kwargs)
            if clock:
                checkpoints += 1
            if completed >= conversations and "wall_end" not in clock:  # the checkpoint holding the last outcome
                clock.update(
                    wall_end=time.perf_counter(), cpu_end=time.process_time(), broker_end=_proc_cpu_s(broker_pid)
                )
                if sampler is not None:
                    sampler.send_signal(signal.SIGINT)
            return result

        Checkpoint.commit = committed  # type: ignore[method-assign]
        try:
            app.run()
        finally:
            Checkpoint.commit = commit  # type: ignore[method-assign]
    if sampler is not None:
        sampler.wait(60)
    seconds = clock["wall_end"] - clock["wall"]
    return {
        "seconds": seconds,
        "records_per_s": records / seconds,
        "cpu_s_per_1000_records": 1000 * (clock["cpu_end"] - clock["cpu"]) / records,
        "broker_cpu_s_per_1000_records": 1000 * (clock["broker_end"] - clock["broker"]) / records,
        "checkpoints": checkpoints,
    }


def profiled(conversations: int = 12_000, raw: Path | None = None) -> dict[str, Any]:
    """One more round of each under py-spy (its samples cost both the same sampling, so only the shares count):
    the busy samples of each by area and the functions with the most self time (bench/profile_ingest.areas).
    librdkafka's own threads are native code, which py-spy does not sample: Quix's Kafka client shows only where
    Python calls into it."""
    from bench.profile_ingest import areas

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="peer-profile-") as scratch:
        assert broker._process is not None
        pid, bootstrap = broker._process.pid, broker.bootstrap_servers
        topic = f"peer-profile-{uuid.uuid4().hex[:6]}"
        _create_topic(bootstrap, topic)
        records = produce(bootstrap, topic, conversations, "conversation")
        theirs, ours = Path(scratch) / "quix.txt", Path(scratch) / "ours.txt"
        quix_run(bootstrap, pid, topic, conversations, records, profile=theirs)
        replicas_run(bootstrap, pid, topic, conversations, records, 1, profile=ours)
        if raw is not None:  # py-spy's raw stacks kept, for a flame graph or another tally
            raw.mkdir(parents=True, exist_ok=True)
            shutil.copy(theirs, raw / theirs.name)
            shutil.copy(ours, raw / ours.name)
        return {QUIX: areas(theirs.read_text()), OURS: areas(ours.read_text())}


def run(conversations: int = 16_000, rounds: int = 2) -> dict[str, Any]:
    try:
        import quixstreams  # noqa: F401
    except ImportError:  # not in the bench extra: it pins pydantic < 2.14 and pydantic-settings < 2.16
        return {"skipped": "quixstreams is not installed (pip install quixstreams, best in a venv of its own)"}
    out: dict[str, Any] = {"conversations": conversations, "partitions": PARTITIONS, "keyed_by": "conversation"}
    with EmbeddedBroker() as broker:
        assert broker._process is not None
        pid, bootstrap = broker._process.pid, broker.bootstrap_servers
        topic = f"peer-conversation-{uuid.uuid4().hex[:6]}"
        _create_topic(bootstrap, topic)
        records = produce(bootstrap, topic, conversations, "conversation")

        def ours(client: str) -> dict[str, Any]:
            row = replicas_run(bootstrap, pid, topic, conversations, records, 1, producer_client=client)
            return {**row, "records_per_s": row["records_per_s_to_outcomes"]}  # to the job's end, as Quix's

        runs: dict[str, Callable[[], dict[str, Any]]] = {
            QUIX: lambda: quix_run(bootstrap, pid, topic, conversations, records),
            OURS: lambda: ours("kafka-python"),
            OURS_RDK: lambda: ours("librdkafka"),
        }
        figures: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
        order = list(runs)
        for _ in range(rounds):  # the order rotating, so a shared host's busy minute and a fuller broker fall on each
            for name in order:
                figures[name].append(runs[name]())
            order = order[1:] + order[:1]
    out["records"] = records
    out["confluent_kafka"] = _confluent_version()
    best = {name: min(runs, key=lambda r: r["cpu_s_per_1000_records"]) for name, runs in figures.items()}
    out["runs"] = figures
    out["best"] = best
    out["ours_vs_quix_cpu"] = best[QUIX]["cpu_s_per_1000_records"] / best[OURS]["cpu_s_per_1000_records"]
    out["ours_vs_quix_rate"] = best[OURS]["records_per_s"] / best[QUIX]["records_per_s"]
    out["ours_librdkafka_vs_quix_cpu"] = best[QUIX]["cpu_s_per_1000_records"] / best[OURS_RDK]["cpu_s_per_1000_records"]
    out["ours_librdkafka_vs_quix_rate"] = best[OURS_RDK]["records_per_s"] / best[QUIX]["records_per_s"]
    return out


if __name__ == "__main__":
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.peer_quix")
    parser.add_argument("--conversations", type=int, default=16_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="one round of each under py-spy: where each spends")
    parser.add_argument("--raw", type=Path, default=None, metavar="DIR", help="with --profile: keep py-spy's stacks")
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.profile:
        print(json.dumps(profiled(args.conversations, args.raw), indent=2))
    else:
        print(json.dumps(run(args.conversations, args.rounds), indent=2))
