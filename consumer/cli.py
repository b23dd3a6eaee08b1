"""`tracejudge` command line: consume, demo. Invalid configuration: one clear line and exit code 2, before any I/O."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

EXIT_USAGE = 2

# flag → Settings field; the environment variable of each field is in settings.py.
CONSUMER_FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--bootstrap-servers", "bootstrap_servers", {}),
    ("--topic", "topic", {}),
    ("--group-id", "group_id", {}),
    ("--start-from", "start_from", {"metavar": "latest|earliest"}),
    ("--judge-model", "judge_model", {}),
    ("--metrics", "metrics", {"help": "comma-separated: failure_rate,conversational_flow"}),
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
    ("--shutdown-grace", "shutdown_grace", {"metavar": "SECONDS"}),
    ("--judge-timeout", "judge_timeout", {"metavar": "SECONDS"}),
    ("--judge-retries", "judge_retries", {}),
    ("--threshold", "threshold", {}),
    ("--max-open-conversations", "max_open_conversations", {}),
    ("--max-turns-per-conversation", "max_turns_per_conversation", {}),
    ("--max-record-bytes", "max_record_bytes", {}),
    ("--commit-interval", "commit_interval", {"metavar": "SECONDS"}),
    ("--log-format", "log_format", {"metavar": "text|json"}),
    ("--log-level", "log_level", {}),
]


def add_consumer_flags(parser: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
    for flag, dest, extra in CONSUMER_FLAGS:
        if dest in skip:
            continue
        parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, **extra)
    parser.add_argument("--redact", dest="redact", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)


def settings_from_args(namespace: argparse.Namespace, *, skip: Sequence[str] = ()) -> Any:
    """Explicit flags over TRACEJUDGE_* variables over defaults; raises SystemExit(2) with one line if invalid."""
    from .settings import Settings

    fields = {dest for _, dest, _ in CONSUMER_FLAGS} | {"redact"}
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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for noisy in ("kafka", "LiteLLM", "litellm", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("kafka.coordinator").setLevel(logging.ERROR)


def cmd_consume(namespace: argparse.Namespace) -> int:
    settings = settings_from_args(namespace)
    configure_logging(settings.log_level, settings.log_format)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from .app import build_app

    app = build_app(settings)

    def stop(signum: int, _frame: Any) -> None:
        logging.getLogger("tracejudge.consumer").info("signal %d: draining and stopping", signum)
        app.service.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("tracejudge.consumer").info("metrics at %s", app.metrics_url)
    app.run()
    return 0


def cmd_demo(namespace: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(namespace)


def cmd_backfill(namespace: argparse.Namespace) -> int:
    from .backfill import run_backfill

    return run_backfill(namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracejudge", description="Judge live LLM-agent conversations from Kafka.")
    commands = parser.add_subparsers(dest="command", required=True)
    consume = commands.add_parser("consume", help="assemble, sample and judge conversations from a Kafka topic")
    add_consumer_flags(consume)
    consume.set_defaults(handler=cmd_consume)
    demo = commands.add_parser("demo", help="the whole pipeline on an embedded broker with a scripted agent")
    add_consumer_flags(demo, skip=("topic", "group_id", "start_from", "session_idle_timeout"))
    demo.add_argument("--serve", action="store_true", help="keep running after the demo for Prometheus and Grafana")
    demo.add_argument("--seconds-idle", type=float, default=3.0, help="the demo's session idle timeout")
    demo.set_defaults(handler=cmd_demo)
    backfill = commands.add_parser("backfill", help="judge a past time range of the span topic")
    backfill.add_argument("--from", dest="start", required=True, metavar="TIME", help="ISO 8601 or Unix seconds")
    backfill.add_argument("--to", dest="end", required=True, metavar="TIME")
    backfill.add_argument("--agent", default=None, help="only this agent's conversations")
    backfill.add_argument("--sample-rate", dest="backfill_sample_rate", type=float, default=None)
    backfill.add_argument("--rejudge", action="store_true", help="judge again what the results topic already has")
    add_consumer_flags(backfill, skip=("group_id", "start_from", "sample_rate"))
    backfill.set_defaults(handler=cmd_backfill)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    namespace = parser.parse_args(argv)
    return int(namespace.handler(namespace))


if __name__ == "__main__":
    sys.exit(main())
