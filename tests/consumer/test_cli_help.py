"""`--help` documents every flag: what it does, its environment variable and its default (made from Settings)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache

import pytest

# docs/configuration.md's option table as --help shows it: flag → (environment variable, default); the page is
# checked against this by tests/docs/test_docs.py.
CONSUME_FLAGS = {
    "--bootstrap-servers": ("TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
    "--topic": ("TRACEJUDGE_TOPIC", "otlp_spans"),
    "--group-id": ("TRACEJUDGE_GROUP_ID", "tracejudge"),
    "--start-from": ("TRACEJUDGE_START_FROM", "latest"),
    "--judge-model": ("TRACEJUDGE_JUDGE_MODEL", "gpt-4o-mini"),
    "--metrics": ("TRACEJUDGE_METRICS", "failure_rate,conversational_flow"),
    "--sample-rate": ("TRACEJUDGE_SAMPLE_RATE", "1.0"),
    "--agent-sample-rate": ("TRACEJUDGE_AGENT_SAMPLE_RATES", "none"),
    "--session-idle-timeout": ("TRACEJUDGE_SESSION_IDLE_TIMEOUT", "300.0"),
    "--max-concurrency": ("TRACEJUDGE_MAX_CONCURRENCY", "16"),
    "--max-requests-per-minute": ("TRACEJUDGE_MAX_REQUESTS_PER_MINUTE", "none"),
    "--max-cost-per-hour": ("TRACEJUDGE_MAX_COST_PER_HOUR", "none"),
    "--metrics-host": ("TRACEJUDGE_METRICS_HOST", "0.0.0.0"),
    "--metrics-port": ("TRACEJUDGE_METRICS_PORT", "9464"),
    "--max-agents": ("TRACEJUDGE_MAX_AGENTS", "200"),
    "--otlp-endpoint": ("OTEL_EXPORTER_OTLP_ENDPOINT", "none"),
    "--otlp-protocol": ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    "--results-topic": ("TRACEJUDGE_RESULTS_TOPIC", "none"),
    "--dead-letter-topic": ("TRACEJUDGE_DEAD_LETTER_TOPIC", "none"),
    "--kafka-config": ("TRACEJUDGE_KAFKA_CONFIG", "none"),
    "--window-sessions": ("TRACEJUDGE_WINDOW_SESSIONS", "100"),
    "--window-seconds": ("TRACEJUDGE_WINDOW_SECONDS", "900.0"),
    "--redact": ("TRACEJUDGE_REDACT", "on"),
    "--shutdown-grace": ("TRACEJUDGE_SHUTDOWN_GRACE", "30.0"),
    "--judge-timeout": ("TRACEJUDGE_JUDGE_TIMEOUT", "60.0"),
    "--judge-check": ("TRACEJUDGE_JUDGE_CHECK", "on"),
    "--judge-retries": ("TRACEJUDGE_JUDGE_RETRIES", "3"),
    "--judge-tier": ("TRACEJUDGE_JUDGE_TIER", "standard"),
    "--judge-batch-size": ("TRACEJUDGE_JUDGE_BATCH_SIZE", "500"),
    "--judge-batch-wait": ("TRACEJUDGE_JUDGE_BATCH_WAIT", "60.0"),
    "--judge-batch-poll": ("TRACEJUDGE_JUDGE_BATCH_POLL", "30.0"),
    "--threshold": ("TRACEJUDGE_THRESHOLD", "0.7"),
    "--max-open-conversations": ("TRACEJUDGE_MAX_OPEN_CONVERSATIONS", "100000"),
    "--max-turns-per-conversation": ("TRACEJUDGE_MAX_TURNS_PER_CONVERSATION", "1000"),
    "--max-record-bytes": ("TRACEJUDGE_MAX_RECORD_BYTES", "8388608"),
    "--commit-interval": ("TRACEJUDGE_COMMIT_INTERVAL", "2.0"),
    "--log-format": ("TRACEJUDGE_LOG_FORMAT", "text"),
    "--log-level": ("TRACEJUDGE_LOG_LEVEL", "INFO"),
    "--calibration": ("TRACEJUDGE_CALIBRATION", "none"),
    "--role": ("TRACEJUDGE_ROLE", "all"),
    "--group-instance-id": ("TRACEJUDGE_GROUP_INSTANCE_ID", "none"),
    "--state-retention": ("TRACEJUDGE_STATE_RETENTION", "86400.0"),
    "--max-state-bytes": ("TRACEJUDGE_MAX_STATE_BYTES", "536870912"),
    "--max-conversation-bytes": ("TRACEJUDGE_MAX_CONVERSATION_BYTES", "262144"),
    "--end-grace": ("TRACEJUDGE_END_GRACE", "2.0"),
    "--canary-interval": ("TRACEJUDGE_CANARY_INTERVAL", "none"),
    "--canary-dataset": ("TRACEJUDGE_CANARY_DATASET", "none"),
    "--canary-accuracy-floor": ("TRACEJUDGE_CANARY_ACCURACY_FLOOR", "none"),
    "--canary-margin": ("TRACEJUDGE_CANARY_MARGIN", "0.1"),
    "--shadow-judge-model": ("TRACEJUDGE_SHADOW_JUDGE_MODEL", "none"),
    "--shadow-sample-rate": ("TRACEJUDGE_SHADOW_SAMPLE_RATE", "0.1"),
    "--shadow-budget-share": ("TRACEJUDGE_SHADOW_BUDGET_SHARE", "0.2"),
}


@cache
def help_entries(*command: str) -> dict[str, str]:
    """Each option's help text from the real `tracejudge ... --help`, whitespace collapsed, keyed by its long flag."""
    env = {**os.environ, "COLUMNS": "100"}
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    options = completed.stdout.split("\noptions:\n", 1)[1]
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", options):
        text = " ".join(block.split())
        flag = re.match(r"(?:-\w, )?(--[\w-]+)", text)
        assert flag is not None, block
        entries[flag.group(1)] = text
    entries.pop("--help")
    return entries


def test_consume_help_names_env_var_and_default_of_every_flag() -> None:
    entries = help_entries("consume")
    assert set(entries) == set(CONSUME_FLAGS)
    for flag, (env, default) in CONSUME_FLAGS.items():
        assert f"(env {env}, default {default})" in entries[flag], entries[flag]
        description = entries[flag].split(f"(env {env}")[0].split(maxsplit=2)[2]
        assert len(description.strip()) > 5, entries[flag]  # a description, not only the variable


@pytest.mark.parametrize("command", ["demo", "backfill", "calibrate", "compare"])
def test_every_flag_of_every_command_has_help_with_its_default(command: str) -> None:
    entries = help_entries(command)
    assert entries
    for flag, text in entries.items():
        assert "default" in text or "(required)" in text, text
        if flag in CONSUME_FLAGS:
            assert f"(env {CONSUME_FLAGS[flag][0]}, default " in text, text


def test_demo_shows_its_own_defaults() -> None:
    entries = help_entries("demo")
    assert "(env TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS, default an embedded broker)" in entries["--bootstrap-servers"]
    assert "(env TRACEJUDGE_JUDGE_MODEL, default a scripted judge)" in entries["--judge-model"]
