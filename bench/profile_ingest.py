"""Where `consume --role all` spends its time: one ingest run (bench/consumer_ingest.py's inputs) sampled by py-spy
(the `bench` extra), every thread, and the samples summed per thread and per stage of the stream thread.

    python -m bench.profile_ingest [--keying conversation|trace|firehose] [--conversations N]

py-spy attaches to this process for the consumer's run only (not the producing before it); a thread's samples whose
innermost frame waits (select, a condition, a sleep) are idle and left out of its busy share. Stage shares are
inclusive (a stage's callees count in it) and of the stream thread's busy samples. Written to bench/profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.consumer_ingest import FIREHOSE_SHARE, KEYINGS, PARTITIONS, bare_loop, produce, tracejudge_consumer
from tracejudge.consumer._gc import collect_less
from tracejudge.consumer.embedded_broker import EmbeddedBroker

OUT = Path(__file__).resolve().parent / "profile.json"
STREAM_THREAD = "bench-consumer"  # consumer_ingest runs ConsumerService.run on a thread of this name
IDLE = re.compile(
    r"^(\w*Selector\.select|select|poll|Condition\.wait|Event\.wait|wait|sleep|Thread\.join|acquire|Consumer\.poll)\b"
)
# The stream thread's stages, by the function that is each one's entry (file names keep them apart from namesakes).
STAGES = {
    "read_events (decode and extraction)": "read_events (consumer/conversation/reading.py",
    "kafka-python poll (fetch, record parsing)": "KafkaConsumer.poll (kafka/consumer/group.py",
    "sends to internal topics (kafka-python producer)": "RecordCollector.send (consumer/streams/record_collector.py",
    "commit (changelog, local store, offsets)": "Assembler.commit (consumer/streams/assembler.py",
    "table apply": "ConversationTable.apply (consumer/conversation/table.py",
    "dispatch (completions to the judge queue)": "Processor.dispatch (consumer/streams/processor.py",
    "routed events read back": "Processor.repartitioned (consumer/streams/processor.py",
    "stream clock (idle, watermarks)": "StreamClock.advance (consumer/streams/clock.py",
}


def _thread(frame: str) -> str:
    name = frame.split(":", 1)[1].strip() if ":" in frame else frame
    return re.sub(r"-\d+$", "", name)


def tally(raw: str) -> dict[str, Any]:
    """py-spy's raw output (`thread;frame;...;frame count` per line) summed per thread and per stream-thread stage."""
    busy: Counter[str] = Counter()
    total: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread, samples = _thread(frames[0]), int(count)
        total[thread] += samples
        if len(frames) > 1 and IDLE.match(frames[-1]):
            continue
        busy[thread] += samples
        if thread == STREAM_THREAD:
            for stage, entry in STAGES.items():
                if any(frame.startswith(entry) for frame in frames):
                    stages[stage] += samples
    stream = busy[STREAM_THREAD] or 1
    all_busy = sum(busy.values()) or 1
    return {
        "threads": {
            name: {"busy_samples": busy[name], "samples": total[name], "share_of_busy": busy[name] / all_busy}
            for name in sorted(total, key=lambda n: -busy[n])
            if busy[name]
        },
        "stream_thread_stages": {stage: stages[stage] / stream for stage in STAGES},
    }


# Where a busy sample's innermost Python frame lies: the same areas for ours and for a peer (bench/peer_quix.py), so
# the two profiles line up. First match wins; a frame is `function (path:line)`.
AREAS = (
    ("Kafka client: kafka-python (pure Python fetch, parse, produce)", ("(kafka/",)),
    ("Kafka client: Quix's wrapper of confluent-kafka (librdkafka)", ("(confluent_kafka/", "(quixstreams/kafka/")),
    ("read_events: OTLP decode (protobuf, JSON)", ("(google/protobuf/", "(opentelemetry/proto/", "consumer/decode.py")),
    ("read_events: span reading (adapters, reading.py)", ("(consumer/adapters/", "(consumer/conversation/reading.py")),
    ("state: our table and its encoding", ("(consumer/conversation/", "(msgspec/")),
    ("state: Quix Streams state (RocksDB, serialisation)", ("(quixstreams/state/", "(rocksdict/")),
    ("runtime: our stream thread (processor, collector, commits, clock)", ("(consumer/streams/", "(consumer/offsets")),
    ("runtime: our judge side (worker, emit)", ("(consumer/judging/", "(consumer/emit/", "(consumer/exchanges")),
    ("runtime: Quix Streams (dataframe, processing, checkpoints)", ("(quixstreams/",)),
    ("the job's own function (bench)", ("(bench/",)),
    ("metrics (prometheus_client)", ("(prometheus_client/",)),
    ("logging", ("(logging/",)),
    ("Python's stdlib (selectors, sockets, json, threading)", ("(selectors.py", "(socket", "(json/", "(threading.py")),
)


def areas(raw: str, top: int = 15) -> dict[str, Any]:
    """py-spy raw samples by the area of their innermost frame (busy samples only, every thread), and the functions
    with the most self time."""
    by_area: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    busy = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        if len(frames) < 2 or IDLE.match(leaf):
            continue
        samples = int(count)
        busy += samples
        area = next((name for name, parts in AREAS if any(part in leaf for part in parts)), "other")
        by_area[area] += samples
        functions[re.sub(r":\d+\)$", ")", leaf)] += samples
    return {
        "busy_samples": busy,
        "areas": {name: n / (busy or 1) for name, n in by_area.most_common()},
        "self_time": {name: n / (busy or 1) for name, n in functions.most_common(top)},
    }


def run(keying: str, conversations: int) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed (pip install -e '.[bench]')")
    collect_less()
    count = conversations // FIREHOSE_SHARE if keying == "firehose" else conversations
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        bootstrap = broker.bootstrap_servers
        topic = f"profile-{keying}-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        records = produce(bootstrap, topic, count, keying)
        bare = bare_loop(bootstrap, topic, records)
        raw = Path(scratch) / "raw.txt"
        # Blocking: `--nonblocking` drops the samples it cannot read whole (scale_out.sampling).
        sampler = subprocess.Popen(
            [spy, "record", "--pid", str(os.getpid()), "-r", "200", "-t", "-f", "raw", "-o", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaching; the consumer's own start (joining its group) takes longer than this
        reads: tuple[int, list[float]] = (records, [])
        elapsed = tracejudge_consumer(bootstrap, topic, count, "all", reads=reads)
        sampler.send_signal(signal.SIGINT)
        sampler.wait(60)
        profile = tally(raw.read_text())
    return {
        "keying": keying,
        "records": records,
        "bare_records_per_s": records / bare,
        "all_records_per_s": records / elapsed,
        "read_records_per_s": records / reads[1][0],
        **profile,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_ingest")
    parser.add_argument("--keying", choices=KEYINGS, default="conversation")
    parser.add_argument("--conversations", type=int, default=10_000)
    args = parser.parse_args()
    result = run(args.keying, args.conversations)
    profiles = json.loads(OUT.read_text()) if OUT.exists() else {}
    profiles[args.keying] = result
    OUT.write_text(json.dumps(profiles, indent=2) + "\n")
    rates = f"consume --role all {result['all_records_per_s']:.0f}/s, bare loop {result['bare_records_per_s']:.0f}/s"
    print(f"{args.keying}: {result['records']} records, {rates}")
    for name, row in result["threads"].items():
        print(f"  thread {name}: {row['share_of_busy']:.0%} of busy samples")
    for stage, share in result["stream_thread_stages"].items():
        print(f"  stream thread, {stage}: {share:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
