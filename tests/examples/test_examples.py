"""The examples run for real against Tansu, and the collector config is a real OTel Collector config shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.pipeline import read_records, spans_of
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, broker: EmbeddedBroker, topic: str, **env: str) -> None:
    environment = {
        **os.environ,
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "PYTHONPATH": str(ROOT),
        "TRACEJUDGE_TOPIC": topic,
        **env,
    }
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)], env=environment, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


def test_sync_support_agent(broker: EmbeddedBroker, topic: str) -> None:
    run_example("support_agent.py", broker, topic, EXAMPLE_CHATS="3", EXAMPLE_PAUSE_S="0")
    spans = [s for r in read_records(broker.bootstrap_servers, topic, expected=3) for s in spans_of(r)]
    names = [s.name for s in spans]
    assert names.count("invoke_agent support-bot") == 5 and names.count("end_conversation") == 3


def test_async_streaming_agent(broker: EmbeddedBroker, topic: str) -> None:
    run_example("streaming_agent.py", broker, topic)
    spans = [s for r in read_records(broker.bootstrap_servers, topic, expected=1) for s in spans_of(r)]
    turns = [s for s in spans if s.name == "invoke_agent streaming-bot"]
    assert len(turns) == 2
    outputs = [kv.value.string_value for s in turns for kv in s.attributes if kv.key == "gen_ai.output.messages"]
    assert any("streamed answer" in o for o in outputs)


def test_collector_config_shape() -> None:
    config = yaml.safe_load((ROOT / "examples" / "otel-collector-to-kafka.yaml").read_text())
    exporter = config["exporters"]["kafka"]
    assert exporter["traces"]["encoding"] == "otlp_proto" and exporter["traces"]["topic"] == "otlp_spans"
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["kafka"]
