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


def test_collector_config_shape() -> None:
    config = yaml.safe_load((ROOT / "examples" / "otel-collector-to-kafka.yaml").read_text())
    exporter = config["exporters"]["kafka"]
    assert exporter["traces"]["encoding"] == "otlp_proto" and exporter["traces"]["topic"] == "otlp_spans"
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["kafka"]


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
