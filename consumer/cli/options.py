"""The consumer's settings as command-line flags, shared by every subcommand.

Each flag's help is made from its Settings field (description, environment variable, default), so it cannot drift.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from .._errors import EXIT_USAGE
from ..settings import Settings

EXIT_JUDGE_UNAVAILABLE = 3  # the startup judge check got no answer (auth, unknown model, server down)

# flag → Settings field (flag names are a contract; the field gives help, environment variable and default).
CONSUMER_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--bootstrap-servers", "bootstrap_servers", {}),
    ("--topic", "topic", {}),
    ("--group-id", "group_id", {}),
    ("--start-from", "start_from", {"metavar": "latest|earliest"}),
    ("--judge-model", "judge_model", {}),
    ("--metrics", "metrics", {}),
    ("--sample-rate", "sample_rate", {}),
    ("--agent-sample-rate", "agent_sample_rates", {"action": "append", "metavar": "NAME=RATE"}),
    ("--session-idle-timeout", "session_idle_timeout", {"metavar": "SECONDS"}),
    ("--max-concurrency", "max_concurrency", {}),
    ("--max-requests-per-minute", "max_requests_per_minute", {}),
    ("--max-cost-per-hour", "max_cost_per_hour", {"metavar": "USD"}),
    ("--metrics-host", "metrics_host", {}),
    ("--metrics-port", "metrics_port", {}),
    ("--max-agents", "max_agents", {}),
    ("--otlp-endpoint", "otlp_endpoint", {}),
    ("--otlp-protocol", "otlp_protocol", {"metavar": "http/protobuf|grpc"}),
    ("--results-topic", "results_topic", {}),
    ("--dead-letter-topic", "dead_letter_topic", {}),
    ("--kafka-config", "kafka_config", {"action": "append", "metavar": "KEY=VALUE"}),
    ("--window-sessions", "window_sessions", {}),
    ("--window-seconds", "window_seconds", {}),
    ("--redact", "redact", {"action": argparse.BooleanOptionalAction}),
    ("--shutdown-grace", "shutdown_grace", {"metavar": "SECONDS"}),
    ("--judge-timeout", "judge_timeout", {"metavar": "SECONDS"}),
    ("--judge-check", "judge_check", {"action": argparse.BooleanOptionalAction}),
    ("--judge-retries", "judge_retries", {}),
    ("--judge-tier", "judge_tier", {"metavar": "standard|flex|batch"}),
    ("--judge-batch-size", "judge_batch_size", {}),
    ("--judge-batch-wait", "judge_batch_wait", {"metavar": "SECONDS"}),
    ("--judge-batch-poll", "judge_batch_poll", {"metavar": "SECONDS"}),
    ("--threshold", "threshold", {}),
    ("--max-open-conversations", "max_open_conversations", {}),
    ("--max-turns-per-conversation", "max_turns_per_conversation", {}),
    ("--max-record-bytes", "max_record_bytes", {}),
    ("--commit-interval", "commit_interval", {"metavar": "SECONDS"}),
    ("--log-format", "log_format", {"metavar": "text|json"}),
    ("--log-level", "log_level", {}),
    ("--calibration", "calibration", {"metavar": "REPORT.json"}),
    ("--role", "role", {"metavar": "all|assemble|judge"}),
    ("--group-instance-id", "group_instance_id", {}),
    ("--state-retention", "state_retention", {"metavar": "SECONDS"}),
    ("--max-state-bytes", "max_state_bytes", {}),
    ("--max-conversation-bytes", "max_conversation_bytes", {}),
    ("--end-grace", "end_grace", {"metavar": "SECONDS"}),
    ("--canary-interval", "canary_interval", {"metavar": "DURATION"}),
    ("--canary-dataset", "canary_dataset", {"metavar": "PATH.jsonl"}),
    ("--canary-accuracy-floor", "canary_accuracy_floor", {}),
    ("--canary-margin", "canary_margin", {}),
    ("--shadow-judge-model", "shadow_judge_model", {}),
    ("--shadow-sample-rate", "shadow_sample_rate", {}),
    ("--shadow-budget-share", "shadow_budget_share", {}),
]


# The canary and the shadow judge watch a running consumer's judge: nothing to do in backfill or the demo.
WATCH_OPTIONS = (
    "canary_interval",
    "canary_dataset",
    "canary_accuracy_floor",
    "canary_margin",
    "shadow_judge_model",
    "shadow_sample_rate",
    "shadow_budget_share",
)


def shown_default(value: Any) -> str:
    if value is None or value == {}:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def field_help(name: str, default: str | None = None) -> str:
    """`description (env TRACEJUDGE_X, default Y)` of a Settings field; `default` replaces Y where a command differs."""
    field = Settings.model_fields[name]
    shown = shown_default(field.default) if default is None else default
    return f"{field.description} (env {field.validation_alias}, default {shown})".replace("%", "%%")


def add_consumer_flags(
    parser: argparse.ArgumentParser,
    *,
    skip: Collection[str] = (),
    only: Collection[str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> None:
    """Add the flags of every field in `only` (default all) not in `skip`; `defaults` are the defaults this command
    shows instead."""
    for flag, dest, extra in CONSUMER_FLAGS:
        if dest in skip or (only is not None and dest not in only):
            continue
        help_text = field_help(dest, (defaults or {}).get(dest))
        parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=help_text, **extra)


def settings_from_args(namespace: argparse.Namespace, *, skip: Sequence[str] = ()) -> Settings:
    """Explicit flags over TRACEJUDGE_* variables over defaults; raises SystemExit(2) with one line if invalid."""
    fields = {dest for _, dest, _ in CONSUMER_FLAGS}
    given = {k: v for k, v in vars(namespace).items() if k in fields and k not in skip}
    try:
        return Settings.from_options(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        alias = ".".join(str(part) for part in error.get("loc", ()))
        flags = {dest: flag for flag, dest, _ in CONSUMER_FLAGS}
        field = next((name for name, f in Settings.model_fields.items() if f.validation_alias == alias), alias)
        where = f"{flags[field]} / {alias}" if field in flags else alias or "configuration"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        print(f"tracejudge: invalid configuration: {where}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
