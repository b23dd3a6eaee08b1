"""The examples run for real (against Tansu, against a local OpenAI-compatible judge), and the Collector configs use
only the kafka exporter keys of the Collector version they pin."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import read_records, spans_of
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
EVAL_LIB_SCRIPT = ROOT / "examples" / "eval_lib_script.py"


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


# ---- The Collector configs: only the kafka exporter keys of the Collector version they pin -----------------------

COLLECTOR_IMAGE = "otel/opentelemetry-collector-contrib:0.161.0"
# The kafka exporter's configuration keys, recorded from opentelemetry-collector-contrib's own config schema (the
# search index's copies: `fetch` refused the 1.37 GB repository, so no tag could be checked out):
# exporter/kafkaexporter/config.schema.yaml (commit 100ff6f973b1), its `properties` plus the two it inlines,
# exporterhelper.timeout_config (`timeout`) and pkg/kafka/configkafka/config.schema.yaml `client_config` (commit
# 13ab5a466aab, which cites deprecations of v0.153.0/v0.154.0). The same keys are the mapstructure tags of
# exporter/kafkaexporter/config.go's Config. That source post-dates the removal of the top-level `topic` and
# `encoding` (deprecated in v0.124.0 for `traces::topic`/`traces::encoding`), as does 0.161.0. Change the pin, and
# record the keys again from that version's source.
KAFKA_EXPORTER_KEYS = {
    # exporter/kafkaexporter Config
    "include_metadata_keys",
    "logs",
    "metrics",
    "partition_logs_by_resource_attributes",
    "partition_logs_by_trace_id",
    "partition_metrics_by_resource_attributes",
    "partition_traces_by_id",
    "producer",
    "profiles",
    "record_headers",
    "record_partitioner",
    "retry_on_failure",
    "sending_queue",
    "signal_header",
    "topic_from_attribute",
    "traces",
    # exporterhelper.TimeoutConfig (squashed)
    "timeout",
    # configkafka.ClientConfig (squashed)
    "auth",
    "brokers",
    "client_id",
    "conn_idle_timeout",
    "metadata",
    "protocol_version",
    "rack_id",
    "resolve_canonical_bootstrap_servers_only",
    "tls",
    "use_leader_epoch",
}
# SignalConfig: the keys under logs / metrics / traces / profiles.
KAFKA_EXPORTER_SIGNAL_KEYS = {"encoding", "message_key_from_metadata_key", "topic", "topic_from_metadata_key"}
SIGNALS = ("logs", "metrics", "traces", "profiles")
COLLECTOR_CONFIGS = (
    ROOT / "examples" / "otel-collector-to-kafka.yaml",
    ROOT / "deploy" / "otel-collector" / "config.yml",
)


def kafka_exporters(path: Path) -> dict[str, dict[str, object]]:
    """The `kafka` and `kafka/NAME` exporters of a Collector config."""
    config = yaml.safe_load(path.read_text())
    exporters = config["exporters"]
    found = {name: body or {} for name, body in exporters.items() if name.split("/")[0] == "kafka"}
    assert found, f"{path}: no kafka exporter"
    used = {e for pipeline in config["service"]["pipelines"].values() for e in pipeline["exporters"]}
    assert set(found) <= used, f"{path}: a kafka exporter outside every pipeline"
    return found


def test_collector_configs_pin_the_version_their_keys_come_from() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    assert compose["services"]["otel-collector"]["image"] == COLLECTOR_IMAGE
    for path in COLLECTOR_CONFIGS:
        assert COLLECTOR_IMAGE in path.read_text(), f"{path} does not say which Collector it is written for"


def kafka_key_problems(path: Path) -> list[str]:
    """Every kafka exporter key of `path` that the pinned Collector does not know."""
    problems = []
    for name, exporter in kafka_exporters(path).items():
        problems += [f"{name}.{key}" for key in sorted(set(exporter) - KAFKA_EXPORTER_KEYS)]
        for signal in SIGNALS:
            nested = exporter.get(signal) or {}
            assert isinstance(nested, dict), f"{path}: {name}.{signal} is not a mapping"
            problems += [f"{name}.{signal}.{key}" for key in sorted(set(nested) - KAFKA_EXPORTER_SIGNAL_KEYS)]
    return problems


def test_collector_configs_use_only_the_pinned_kafka_exporter_keys() -> None:
    for path in COLLECTOR_CONFIGS:
        assert kafka_key_problems(path) == [], f"{path}: keys {COLLECTOR_IMAGE} rejects"
        for exporter in kafka_exporters(path).values():
            # What tracejudge reads: otlp_proto records on the consumer's topic, keyed so a trace stays together.
            traces = exporter["traces"]
            assert isinstance(traces, dict)
            assert traces["encoding"] == "otlp_proto" and traces["topic"] == "otlp_spans", path
            assert exporter["partition_traces_by_id"] is True and exporter["brokers"] == ["kafka:9092"]


def test_the_key_check_rejects_the_old_layout(tmp_path: Path) -> None:
    """The check can fail: the 0.116-era layout (top-level topic/encoding) and a misspelt signal key are refused."""
    old = {
        "exporters": {
            "kafka": {"brokers": ["kafka:9092"], "topic": "otlp_spans", "encoding": "otlp_proto"},
            "kafka/typo": {"traces": {"topics": "otlp_spans"}},
        },
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["kafka", "kafka/typo"]}}},
    }
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    assert kafka_key_problems(path) == ["kafka.encoding", "kafka.topic", "kafka/typo.traces.topics"]


# ---- examples/eval_lib_script.py: runs against any OpenAI-compatible server, or says what it needs ---------------


def run_eval_lib_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EVAL_LIB_SCRIPT)],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


def without_judge() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "JUDGE_MODEL"))}


@pytest.mark.parametrize(
    "given", [{}, {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"}], ids=["nothing", "base-url-without-key"]
)
def test_eval_lib_script_without_a_judge_says_what_to_set(given: dict[str, str]) -> None:
    completed = run_eval_lib_script({**without_judge(), **given})
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_MODEL"):
        assert variable in lines[0]
    assert "placeholder" in lines[0] and "Traceback" not in completed.stderr
    assert "all assertions held" not in completed.stdout


def judge_both_metrics(request: dict[str, object]) -> Reply:
    """A model that is not OpenAI's: Failure Rate says stall (0.4, a fail), Flow says fully."""
    prompt = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))  # type: ignore[union-attr]
    if "fully" in prompt and "mostly" in prompt:
        return Reply(content=json.dumps({"verdict": "fully", "key_issues": [], "reason": "smooth"}))
    return Reply(content=json.dumps({"verdict": "stall", "evidence": ["turn 1"], "reason": "stalled"}))


def test_eval_lib_script_runs_against_a_local_openai_compatible_server(judge_server: JudgeServer) -> None:
    """Any model name on any OpenAI-compatible server, any verdict: the script reports it and holds."""
    judge_server.responder = judge_both_metrics
    completed = run_eval_lib_script({**os.environ, "OPENAI_API_KEY": "placeholder", "JUDGE_MODEL": "openai/my-model"})
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
    assert completed.stdout.rstrip().endswith("all assertions held")
    assert "failureRateMetric: 0.4 (stalled)" in completed.stdout
    assert "conversationalFlowRateMetric: 1.0 (smooth)" in completed.stdout
    assert [r["model"] for r in judge_server.requests] == ["my-model", "my-model"]  # over real HTTP, via LiteLLM


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_eval_lib_script_with_an_unreachable_server_is_one_line() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    env = {**without_judge(), "OPENAI_BASE_URL": url, "OPENAI_API_BASE": url, "OPENAI_API_KEY": "placeholder"}
    completed = run_eval_lib_script(env)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("eval_lib_script.py: the judge gpt-4o-mini at http://127.0.0.1:"), completed.stderr
