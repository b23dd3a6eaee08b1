"""Every consumer option in one place: a flag and an environment variable each (flag > env > default)."""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tracejudge._shared.kafka_options import DECIDED_OPTIONS, check_kafka_options

from .kafka.clients import consumer_options, known_options, producer_options
from .kafka.rdkafka import check_config

KNOWN_METRICS = ("failure_rate", "conversational_flow")  # the built-in judges; --judge-file adds the team's


def judge_names(judge_files: list[str]) -> tuple[str, ...]:
    """The judges that can run with these rubric files (the built-ins first)."""
    if not judge_files:
        return KNOWN_METRICS
    from tracejudge.metrics.judges import judge_classes

    return tuple(judge_classes(judge_files))


# The sections of `--help` and of docs/configuration.md's table, in their order. Every field names one (`group=`);
# tests/consumer/test_cli_help.py fails naming a field that does not, and --help shows such a field under UNGROUPED.
KAFKA = "Kafka"
JUDGE = "Judge"
SAMPLING = "Sampling and budget"
STATE = "State"
OUTPUTS = "Outputs"
WATCH = "Canary and shadow judge"
GROUPS = (KAFKA, JUDGE, SAMPLING, STATE, OUTPUTS, WATCH)
UNGROUPED = "Other (no group declared yet)"


def _env(
    name: str,
    default: Any,
    description: str,
    *,
    group: str | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    repeatable: bool = False,
    see: str | None = None,
) -> Any:
    """A field read from environment variable `name`, and its command-line flag (`flag`, default `--field-name`).

    Everything about an option is said here once: `tracejudge.consumer.cli.options` makes the flag, its --help
    (`description`, `name`, `default`, under the section `group`, one of GROUPS) and docs/configuration.md's table
    (`see`: a docs link) from it. `metavar` names the value in --help (a Literal's choices are shown without one);
    `repeatable` flags are given once per value. Field order is the order within a section."""
    extra = {"group": group, "flag": flag, "metavar": metavar, "repeatable": repeatable, "see": see}
    return Field(
        default,
        validation_alias=name,
        description=description,
        json_schema_extra={k: v for k, v in extra.items() if v},
    )


def parse_pairs(value: Any, what: str) -> dict[str, str]:
    """`KEY=VALUE` items from a list, a comma-separated string or a dict."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    pairs: dict[str, str] = {}
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad {what} {item!r}: expected KEY=VALUE")
        pairs[key.strip()] = val.strip()
    return pairs


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Seconds from `1h`, `30m`, `5s`, `250ms`, `1h30m` or a bare number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration such as 1h, 30m, 5s or 90")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def _coerce(value: str) -> Any:
    """Kafka client options arrive as strings; give kafka-python ints and booleans where they look like them."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(value)
    except ValueError:
        return value


MAX_RETRY_HORIZON_S = 7 * 86_400.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(populate_by_name=True, extra="forbid", case_sensitive=False)

    bootstrap_servers: str = _env(
        "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092", "Kafka brokers, host:port[,host:port]", group=KAFKA
    )
    topic: str = _env("TRACEJUDGE_TOPIC", "otlp_spans", "the span topic", group=KAFKA)
    group_id: str = _env("TRACEJUDGE_GROUP_ID", "tracejudge", "the Kafka consumer group", group=KAFKA)
    start_from: Literal["latest", "earliest"] = _env(
        "TRACEJUDGE_START_FROM", "latest", "where a group without committed offsets starts", group=KAFKA
    )
    judge_model: str = _env("TRACEJUDGE_JUDGE_MODEL", "gpt-4o-mini", "the judge: a LiteLLM model string", group=JUDGE)
    judge_files: Annotated[list[str], NoDecode] = _env(
        "TRACEJUDGE_JUDGE_FILES",
        [],
        "a rubric file (YAML): the team's own judge, run beside the built-ins unless --metrics leaves it out "
        "(repeatable; comma-separated in the variable)",
        flag="--judge-file",
        metavar="PATH",
        repeatable=True,
        see="judges.md#your-own-judges-rubric-files",
        group=JUDGE,
    )
    failure_modes: str | None = _env(
        "TRACEJUDGE_FAILURE_MODES",
        None,
        "a failure-mode taxonomy file (YAML: for each judge's name, a list of {name, description}, at most 20): what "
        "a failing verdict is about, named by the judge in the same call; replaces a judge's own (failure_rate's)",
        metavar="FILE",
        see="failure-modes.md",
        group=JUDGE,
    )
    metrics: Annotated[list[str], NoDecode] = _env(
        "TRACEJUDGE_METRICS",
        ["failure_rate", "conversational_flow"],
        "which judges run, comma-separated: failure_rate,conversational_flow and the names of --judge-file judges "
        "(default: all of them; not Prometheus: its endpoint is --metrics-host / --metrics-port)",
        metavar="JUDGE[,JUDGE]",
        group=JUDGE,
    )
    sample_rate: float = _env("TRACEJUDGE_SAMPLE_RATE", 1.0, "share of conversations judged, 0..1", group=SAMPLING)
    agent_sample_rates: Annotated[dict[str, float], NoDecode] = _env(
        "TRACEJUDGE_AGENT_SAMPLE_RATES",
        {},
        "one agent's sample rate (repeatable)",
        flag="--agent-sample-rate",
        metavar="NAME=RATE",
        repeatable=True,
        group=SAMPLING,
    )
    session_idle_timeout: float = _env(
        "TRACEJUDGE_SESSION_IDLE_TIMEOUT",
        300.0,
        "a conversation silent this long is complete and judged",
        metavar="SECONDS",
        group=STATE,
    )
    max_concurrency: int = _env("TRACEJUDGE_MAX_CONCURRENCY", 16, "judge calls in flight at most", group=SAMPLING)
    max_requests_per_minute: float | None = _env(
        "TRACEJUDGE_MAX_REQUESTS_PER_MINUTE", None, "judge calls per minute at most (none: unlimited)", group=SAMPLING
    )
    max_cost_per_hour: float | None = _env(
        "TRACEJUDGE_MAX_COST_PER_HOUR",
        None,
        "judge spend per hour at most (none: unlimited)",
        metavar="USD",
        group=SAMPLING,
    )
    metrics_host: str = _env(
        "TRACEJUDGE_METRICS_HOST", "0.0.0.0", "address of the Prometheus /metrics endpoint", group=OUTPUTS
    )
    metrics_port: int = _env(
        "TRACEJUDGE_METRICS_PORT",
        9464,
        "port of the Prometheus /metrics endpoint (which judges run is --metrics)",
        group=OUTPUTS,
    )
    max_agents: int = _env(
        "TRACEJUDGE_MAX_AGENTS", 200, "distinct agent label values; later agents are reported as _other", group=OUTPUTS
    )
    otlp_endpoint: str | None = _env(
        "OTEL_EXPORTER_OTLP_ENDPOINT", None, "OTLP base URL for evaluation spans and events (none: off)", group=OUTPUTS
    )
    otlp_protocol: Literal["http/protobuf", "grpc"] = _env(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "OTLP protocol", group=OUTPUTS
    )
    results_topic: str | None = _env(
        "TRACEJUDGE_RESULTS_TOPIC",
        None,
        "Kafka topic for one JSON result per judgement, its verdict, reason and evidence (none: `<group>-results`, "
        "created as the internal topics are); explain, export and compare find it from --group-id alone",
        group=OUTPUTS,
    )
    no_results: bool = _env(
        "TRACEJUDGE_NO_RESULTS",
        False,
        "write no results topic: verdicts are only counted (Prometheus, OTLP), and explain, export, watch and "
        "rejudge have no reason, evidence or outcome to read",
        group=OUTPUTS,
    )
    results_transcript: bool = _env(
        "TRACEJUDGE_RESULTS_TRANSCRIPT",
        False,
        "keep the conversation as the judge saw it (redacted, windowed) in every results-topic record, for "
        "`tracejudge export`: up to the judge's window a record (36 KB of English, 64 KB of Cyrillic text), and "
        "conversation text on the results topic",
        see="feedback-and-backfill.md#from-a-verdict-to-a-regression-test",
        group=OUTPUTS,
    )
    results_unjudged: bool = _env(
        "TRACEJUDGE_RESULTS_UNJUDGED",
        True,
        "write sampled-out and skipped-for-budget outcomes to the results topic too (off: one record per metric "
        "fewer for each; `explain` then cannot tell them from conversations never completed)",
        group=OUTPUTS,
    )
    dead_letter_topic: str | None = _env(
        "TRACEJUDGE_DEAD_LETTER_TOPIC", None, "Kafka topic for records that cannot be read (none: off)", group=OUTPUTS
    )
    kafka_config: Annotated[dict[str, Any], NoDecode] = _env(
        "TRACEJUDGE_KAFKA_CONFIG",
        {},
        "a Kafka client option, e.g. security_protocol=SASL_SSL (repeatable)",
        metavar="KEY=VALUE",
        repeatable=True,
        group=KAFKA,
    )
    producer_client: Literal["kafka-python", "librdkafka"] = _env(
        "TRACEJUDGE_PRODUCER_CLIENT",
        "kafka-python",
        "the library that writes the internal topics (repartition, changelog, judge queue): librdkafka "
        "(confluent-kafka, the `librdkafka` extra) takes that work off the interpreter",
        group=KAFKA,
        see="benchmarks.md#a-librdkafka-producer-for-the-internal-topics",
    )
    replication_factor: int | None = _env(
        "TRACEJUDGE_REPLICATION_FACTOR",
        None,
        "replication factor of the internal topics the consumer creates (none: the cluster's "
        "default.replication.factor, as Kafka Streams)",
        metavar="N",
        see="deployment.md#a-managed-kafka-cluster",
        group=KAFKA,
    )
    internal_topic_config: Annotated[dict[str, str], NoDecode] = _env(
        "TRACEJUDGE_INTERNAL_TOPIC_CONFIG",
        {},
        "a setting of every internal topic the consumer creates, e.g. min.insync.replicas=2 (repeatable)",
        metavar="KEY=VALUE",
        repeatable=True,
        see="deployment.md#a-managed-kafka-cluster",
        group=KAFKA,
    )
    window_sessions: int = _env(
        "TRACEJUDGE_WINDOW_SESSIONS", 100, "rates cover each agent's last N judged conversations", group=OUTPUTS
    )
    window_seconds: float = _env(
        "TRACEJUDGE_WINDOW_SECONDS", 900.0, "rates cover conversations judged within this many seconds", group=OUTPUTS
    )
    redact: bool = _env(
        "TRACEJUDGE_REDACT",
        True,
        "replace e-mails, phone numbers, cards, IBANs and keys before the judge sees them",
        group=JUDGE,
    )
    shutdown_grace: float = _env(
        "TRACEJUDGE_SHUTDOWN_GRACE",
        30.0,
        "seconds in-flight judgements get to finish on SIGTERM or the first Ctrl-C (SIGINT); a second signal stops "
        "within 2 s, leaving what is unfinished uncommitted (judged again after the restart)",
        metavar="SECONDS",
        group=JUDGE,
    )
    judge_timeout: float = _env(
        "TRACEJUDGE_JUDGE_TIMEOUT", 60.0, "seconds per judge call attempt", metavar="SECONDS", group=JUDGE
    )
    judge_check: bool = _env(
        "TRACEJUDGE_JUDGE_CHECK",
        True,
        "one cheap judge call at startup; a judge that cannot answer exits 3 before any record is read",
        group=JUDGE,
    )
    judge_retries: int = _env("TRACEJUDGE_JUDGE_RETRIES", 3, "retries of a failed judge call", group=JUDGE)
    judge_retry_horizon: float = _env(
        "TRACEJUDGE_JUDGE_RETRY_HORIZON",
        21_600.0,
        "a judgement that failed for a reason that can pass (5xx, rate limit, timeout, connection, expired batch) is "
        "tried again, durably, until this long after its first failure; then it fails with its last reason (0: never)",
        metavar="DURATION",
        group=JUDGE,
    )
    judge_retry_backoff: float = _env(
        "TRACEJUDGE_JUDGE_RETRY_BACKOFF",
        30.0,
        "the wait before a failed judgement's first retry, doubled at each attempt up to 10 minutes",
        metavar="DURATION",
        group=JUDGE,
    )
    judge_tier: Literal["standard", "flex", "batch"] = _env(
        "TRACEJUDGE_JUDGE_TIER",
        "standard",
        "the provider's service tier: standard, flex (half price, slower; standard when refused for capacity) or "
        "batch (half price through the Batch API; verdicts within the provider's window, usually minutes)",
        see="tiers.md",
        group=JUDGE,
    )
    judge_batch_size: int = _env(
        "TRACEJUDGE_JUDGE_BATCH_SIZE",
        500,
        "--judge-tier batch: judge requests gathered into one batch at most",
        group=JUDGE,
    )
    judge_batch_wait: float = _env(
        "TRACEJUDGE_JUDGE_BATCH_WAIT",
        60.0,
        "--judge-tier batch: seconds the first request of a batch waits for others before the batch is submitted",
        metavar="SECONDS",
        group=JUDGE,
    )
    judge_batch_poll: float = _env(
        "TRACEJUDGE_JUDGE_BATCH_POLL",
        30.0,
        "--judge-tier batch: seconds between polls of a submitted batch",
        metavar="SECONDS",
        group=JUDGE,
    )
    threshold: float = _env("TRACEJUDGE_THRESHOLD", 0.7, "a score at or above this passes", group=JUDGE)
    max_open_conversations: int = _env(
        "TRACEJUDGE_MAX_OPEN_CONVERSATIONS",
        100_000,
        "open conversations held in memory at most; past it the least recently active wait in the local store on disk",
        group=STATE,
    )
    max_turns_per_conversation: int = _env(
        "TRACEJUDGE_MAX_TURNS_PER_CONVERSATION",
        1_000,
        "a conversation is judged (marked truncated) at this many turns",
        group=STATE,
    )
    max_record_bytes: int = _env(
        "TRACEJUDGE_MAX_RECORD_BYTES", 8 * 1024 * 1024, "larger Kafka records are skipped as malformed", group=KAFKA
    )
    commit_interval: float = _env(
        "TRACEJUDGE_COMMIT_INTERVAL", 2.0, "seconds between offset commits", metavar="SECONDS", group=KAFKA
    )
    log_format: Literal["text", "json"] = _env("TRACEJUDGE_LOG_FORMAT", "text", "log line format", group=OUTPUTS)
    log_level: str = _env("TRACEJUDGE_LOG_LEVEL", "INFO", "log level", group=OUTPUTS)
    calibration: str | None = _env(
        "TRACEJUDGE_CALIBRATION",
        None,
        "a `tracejudge calibrate --output` report: correct hallucination rates for judge error",
        metavar="REPORT.json",
        see="calibration.md#hallucination-rates-corrected-for-judge-error",
        group=OUTPUTS,
    )
    role: Literal["all", "assemble", "judge"] = _env(
        "TRACEJUDGE_ROLE",
        "all",
        "stages this process runs: all, assemble (spans to conversations) or judge (the judge queue)",
        see="state.md#scaling-each-stage",
        group=STATE,
    )
    group_instance_id: str | None = _env(
        "TRACEJUDGE_GROUP_INSTANCE_ID",
        None,
        "static group membership: a stable id per replica (e.g. the pod name), so a restart moves no partition",
        group=KAFKA,
    )
    state_retention: float = _env(
        "TRACEJUDGE_STATE_RETENTION",
        86_400.0,
        "seconds a completed conversation is kept for continuations and late feedback (record time)",
        metavar="SECONDS",
        group=STATE,
    )
    max_state_bytes: int = _env(
        "TRACEJUDGE_MAX_STATE_BYTES",
        512 * 1024 * 1024,
        "conversation state held in memory at most; past it the oldest go to the local store on disk",
        group=STATE,
    )
    state_dir: str = _env(
        "TRACEJUDGE_STATE_DIR",
        "tracejudge-state",
        "directory of the local conversation store (RocksDB, one per partition) and its checkpoints (relative: to the"
        " working directory); a restart on the same directory restores only the changelog's tail",
        metavar="DIR",
        see="state.md#the-local-store-on-disk",
        group=STATE,
    )
    max_conversation_bytes: int = _env(
        "TRACEJUDGE_MAX_CONVERSATION_BYTES",
        262_144,
        "UTF-8 bytes of text kept per conversation (its newest turns; the judge's window is smaller)",
        group=STATE,
    )
    end_grace: float = _env(
        "TRACEJUDGE_END_GRACE",
        2.0,
        "seconds an end marker waits for turns routed from other partitions (spans not keyed by conversation id)",
        metavar="SECONDS",
        group=STATE,
    )
    canary_interval: float | None = _env(
        "TRACEJUDGE_CANARY_INTERVAL",
        None,
        "judge the canary set through the live judges this often, e.g. 1h, 30m, 5s (none: off)",
        metavar="DURATION",
        see="switching-judges.md#the-canary",
        group=WATCH,
    )
    canary_dataset: str | None = _env(
        "TRACEJUDGE_CANARY_DATASET",
        None,
        "the canary's labelled conversations in the calibrate format (none: a balanced 24-conversation subset of "
        "the built-in gold set)",
        metavar="PATH.jsonl",
        group=WATCH,
    )
    canary_accuracy_floor: float | None = _env(
        "TRACEJUDGE_CANARY_ACCURACY_FLOOR",
        None,
        "canary accuracy expected of every metric (none: the --calibration report's accuracy)",
        group=WATCH,
    )
    canary_margin: float = _env(
        "TRACEJUDGE_CANARY_MARGIN",
        0.1,
        "TracejudgeCanaryRegressed fires this far below the accuracy floor",
        group=WATCH,
    )
    shadow_judge_model: str | None = _env(
        "TRACEJUDGE_SHADOW_JUDGE_MODEL",
        None,
        "a second judge model run on a sample of the judged conversations, reported apart (none: off)",
        see="switching-judges.md#the-shadow-judge",
        group=WATCH,
    )
    shadow_sample_rate: float = _env(
        "TRACEJUDGE_SHADOW_SAMPLE_RATE",
        0.1,
        "share of the judged conversations the shadow judge also judges, 0..1",
        group=WATCH,
    )
    shadow_budget_share: float = _env(
        "TRACEJUDGE_SHADOW_BUDGET_SHARE",
        0.2,
        "share of --max-cost-per-hour reserved for the shadow judge (the primary gets the rest), 0..1",
        group=WATCH,
    )
    notify_url: Annotated[list[str], NoDecode] = _env(
        "TRACEJUDGE_NOTIFY_URL",
        [],
        "POST one notification per matching verdict to this URL (repeatable; comma-separated in the variable)",
        metavar="URL",
        repeatable=True,
        see="feedback-and-backfill.md#notifications-per-verdict",
        group=OUTPUTS,
    )
    notify_on: Annotated[list[str], NoDecode] = _env(
        "TRACEJUDGE_NOTIFY_ON",
        ["failure_rate=hallucination"],
        "the verdicts notified: METRIC=VERDICT, VERDICT (any metric) or METRIC=* (repeatable)",
        metavar="METRIC=VERDICT",
        repeatable=True,
        group=OUTPUTS,
    )
    notify_format: Literal["cloudevents", "slack"] = _env(
        "TRACEJUDGE_NOTIFY_FORMAT",
        "cloudevents",
        "the body posted: a CloudEvents 1.0 JSON event (structured mode) or a Slack incoming-webhook message",
        group=OUTPUTS,
    )
    notify_secret: str | None = _env(
        "TRACEJUDGE_NOTIFY_SECRET",
        None,
        "sign each body with HMAC-SHA256 under this key (header X-Tracejudge-Signature: sha256=HEX; prefer the "
        "variable to the flag, which `ps` shows)",
        group=OUTPUTS,
    )
    trace_url_template: str | None = _env(
        "TRACEJUDGE_TRACE_URL_TEMPLATE",
        None,
        "a link to the judged trace in notifications, e.g. http://tempo:3200/trace/{trace_id}; fields {trace_id}, "
        "{conversation_id}, {agent}, {result_id}",
        metavar="URL",
        group=OUTPUTS,
    )
    notify_rate_limit: float = _env(
        "TRACEJUDGE_NOTIFY_RATE_LIMIT",
        30.0,
        "notifications per agent per minute at most; the rest are held back and counted (the next one says how many)",
        group=OUTPUTS,
    )
    notify_retry_for: float = _env(
        "TRACEJUDGE_NOTIFY_RETRY_FOR",
        600.0,
        "seconds a notification is retried with backoff before it is given up (its conversation's commit waits that "
        "long at most)",
        metavar="SECONDS",
        group=OUTPUTS,
    )

    @field_validator("judge_files", mode="before")
    @classmethod
    def _judge_files(cls, value: Any) -> list[str]:
        if isinstance(value, list | tuple) and any(not str(item).strip() for item in value):
            raise ValueError("an empty path (an unset variable in a template?): name a rubric file")
        items = value if isinstance(value, list | tuple) else str(value or "").split(",")
        paths = list(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))
        from tracejudge.metrics.judges import RubricError, file_judges

        try:
            file_judges(paths)  # a bad file: one line naming the file, the field and the problem, before anything
        except RubricError as exc:
            raise ValueError(str(exc)) from None
        return paths

    @field_validator("failure_modes")
    @classmethod
    def _failure_modes(cls, value: str | None, info: ValidationInfo) -> str | None:
        if not value or not value.strip():
            return None
        from tracejudge.metrics.judges import RubricError, judge_classes
        from tracejudge.metrics.rubric import load_failure_modes

        try:
            load_failure_modes(value.strip(), judge_classes(info.data.get("judge_files", [])))
        except RubricError as exc:
            raise ValueError(str(exc)) from None
        return value.strip()

    def taxonomies(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """--failure-modes: each named judge's taxonomy (replacing its own); {} without the flag."""
        if not self.failure_modes:
            return {}
        from tracejudge.metrics.judges import judge_classes
        from tracejudge.metrics.rubric import load_failure_modes

        return load_failure_modes(self.failure_modes, judge_classes(self.judge_files))

    def mode_alerts(self) -> dict[str, dict[str, float]]:
        """--failure-modes: the modes each named judge opts into the mode-share alert (`alert_share`)."""
        if not self.failure_modes:
            return {}
        from tracejudge.metrics.judges import judge_classes
        from tracejudge.metrics.rubric import failure_mode_alerts

        return failure_mode_alerts(self.failure_modes, judge_classes(self.judge_files))

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, value: Any, info: ValidationInfo) -> list[str]:
        names = value if isinstance(value, list | tuple) else str(value).split(",")
        names = [str(n).strip() for n in names if str(n).strip()]
        known = judge_names(info.data.get("judge_files", []))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown metric(s) {', '.join(unknown)}; known: {', '.join(known)}")
        if not names:
            raise ValueError("at least one metric is needed")
        return list(dict.fromkeys(names))  # "failure_rate,failure_rate" must not judge (and count) twice

    @model_validator(mode="after")
    def _file_judges_run(self) -> Settings:
        """A loaded judge runs unless --metrics leaves it out: without --metrics, every judge known runs."""
        if "metrics" not in self.model_fields_set and self.judge_files:
            self.metrics = [*self.metrics, *(n for n in judge_names(self.judge_files) if n not in self.metrics)]
        return self

    @field_validator("agent_sample_rates", mode="before")
    @classmethod
    def _agent_rates(cls, value: Any) -> dict[str, float]:
        rates: dict[str, float] = {}
        for agent, raw in parse_pairs(value, "agent sample rate").items():
            try:
                rate = float(raw)
            except ValueError:
                raise ValueError(f"agent sample rate for {agent!r} is not a number: {raw!r}") from None
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"agent sample rate for {agent!r} must be within 0..1, got {rate}")
            rates[agent] = rate
        return rates

    @field_validator("kafka_config", mode="before")
    @classmethod
    def _kafka_config(cls, value: Any) -> dict[str, Any]:
        if isinstance(value, dict):
            pairs = {str(k): v for k, v in value.items()}
        else:
            pairs = {k: _coerce(v) for k, v in parse_pairs(value, "Kafka option").items()}
        check_kafka_options(pairs, known_options())
        decided = sorted(set(pairs) & set(DECIDED_OPTIONS))
        if decided:
            raise ValueError(f"{decided[0]} is not a --kafka-config option: {DECIDED_OPTIONS[decided[0]]}")
        return pairs

    @field_validator("internal_topic_config", mode="before")
    @classmethod
    def _internal_topic_config(cls, value: Any) -> dict[str, str]:
        pairs = parse_pairs(value, "internal topic setting")
        if "cleanup.policy" in pairs:  # the changelog must be compacted, the queues must not: tracejudge decides it
            raise ValueError("cleanup.policy is set per internal topic by tracejudge; leave it out")
        return pairs

    @field_validator("replication_factor")
    @classmethod
    def _replication_factor(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be at least 1 (leave it unset for the cluster's default), got {value}")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, value: str | None) -> str | None:
        """A URL with a scheme and a host (both OTLP protocols take one); anything else would fail every export."""
        if not value:
            return None
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(value.strip())
            parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL such as http://otel-collector:4318")
        return value.strip()

    @field_validator("notify_url", "notify_on", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> list[str]:
        items = value if isinstance(value, list | tuple) else str(value or "").split(",")
        return [str(item).strip() for item in items if str(item).strip()]

    @field_validator("notify_url")
    @classmethod
    def _notify_urls(cls, value: list[str]) -> list[str]:
        from urllib.parse import urlsplit

        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an http(s) URL such as https://hooks.example.com/tracejudge")
        return value

    @field_validator("notify_on")
    @classmethod
    def _notify_on(cls, value: list[str], info: ValidationInfo) -> list[str]:
        from tracejudge.metrics.judges import labels_of

        labels = {name: set(verdicts) for name, verdicts in labels_of(info.data.get("judge_files", [])).items()}
        for item in value:
            metric, sep, verdict = item.rpartition("=")
            if sep and metric not in labels:
                raise ValueError(f"{item!r}: unknown metric {metric!r}; known: {', '.join(labels)}")
            known = labels[metric] if sep else set().union(*labels.values())
            if verdict != "*" and verdict not in known:
                raise ValueError(f"{item!r}: unknown verdict {verdict!r}; known: {', '.join(sorted(known))}")
            if verdict == "*" and not sep:
                raise ValueError(f"{item!r}: name a metric, e.g. failure_rate=*")
        return value

    @field_validator("trace_url_template")
    @classmethod
    def _trace_url_template(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            value.format(trace_id="t", conversation_id="c", agent="a", result_id="r")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"{value!r}: unknown field {exc}; use {{trace_id}}, {{conversation_id}}, {{agent}}, {{result_id}}"
            ) from None
        return value

    @field_validator("judge_retry_horizon", "judge_retry_backoff", mode="before")
    @classmethod
    def _retry_durations(cls, value: Any, info: ValidationInfo) -> float:
        seconds = parse_duration(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"must be a finite duration, not negative, got {value!r}")
        if info.field_name == "judge_retry_horizon" and seconds > MAX_RETRY_HORIZON_S:
            raise ValueError(f"at most 7 days (the retry topic's default retention), got {value!r}")
        if info.field_name == "judge_retry_backoff" and seconds < 1.0:
            raise ValueError(f"at least 1 s (a smaller wait retries a failing provider in a loop), got {value!r}")
        return seconds

    @field_validator("notify_retry_for")
    @classmethod
    def _notify_retry_for(cls, value: float) -> float:
        # nan passed `<= 0` and gave every notification up before its first attempt; inf held commits forever
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"must be a finite number of seconds, positive, got {value!r}")
        if value > MAX_RETRY_HORIZON_S:
            raise ValueError(f"at most 7 days (as --judge-retry-horizon), got {value!r}")
        return value

    @field_validator("canary_interval", mode="before")
    @classmethod
    def _canary_interval(cls, value: Any) -> float | None:
        if value is None or value == "" or str(value).strip().lower() in ("off", "none"):
            return None
        seconds = parse_duration(value)
        if seconds <= 0:
            raise ValueError(f"the canary interval must be positive, got {value!r}")
        return seconds

    @field_validator("shadow_sample_rate", "shadow_budget_share", "canary_margin")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"must be within 0..1, got {value}")
        return value

    @field_validator("canary_accuracy_floor")
    @classmethod
    def _floor(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"must be within 0..1, got {value}")
        return value

    @field_validator("sample_rate")
    @classmethod
    def _rate(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"sample rate must be within 0..1, got {value}")
        return value

    @field_validator("no_results")
    @classmethod
    def _no_results(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("results_topic"):  # results_topic is declared first: validated already
            raise ValueError("contradicts --results-topic / TRACEJUDGE_RESULTS_TOPIC: give one of them")
        return value

    def results_topic_name(self) -> str | None:
        """The results topic these settings write and read (kafka/topics.py's `results_topic_of`, the one rule):
        --results-topic, else `<group>-results`; None with --no-results."""
        from .kafka.topics import results_topic_of

        return results_topic_of(self)

    @model_validator(mode="after")
    def _positive(self) -> Settings:
        for name in (
            "max_concurrency",
            "max_agents",
            "window_sessions",
            "max_open_conversations",
            "max_state_bytes",
            "max_conversation_bytes",
            "judge_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "session_idle_timeout",
            "window_seconds",
            "notify_rate_limit",
            "notify_retry_for",
            "judge_timeout",
            "state_retention",
            "judge_batch_poll",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.end_grace < 0:
            raise ValueError("end_grace must not be negative")
        if self.producer_client == "librdkafka":
            if importlib.util.find_spec("confluent_kafka") is None:
                raise ValueError("producer_client librdkafka needs confluent-kafka: install tracejudge[librdkafka]")
            check_config(producer_options(self.kafka_config))  # an option it lacks or refuses, named
        if self.judge_batch_wait < 0:
            raise ValueError("judge_batch_wait must not be negative")
        if self.max_requests_per_minute is not None and self.max_requests_per_minute <= 0:
            raise ValueError("max_requests_per_minute must be positive")
        if self.max_cost_per_hour is not None and self.max_cost_per_hour < 0:
            raise ValueError("max_cost_per_hour must not be negative")
        return self

    @classmethod
    def from_options(cls, **options: Any) -> Settings:
        """Build from explicit options (by field name), which win over the environment."""
        aliased = {}
        for name, value in options.items():
            field = cls.model_fields.get(name)
            alias = field.validation_alias if field is not None else None
            aliased[alias if isinstance(alias, str) else name] = value
        return cls(**aliased)

    def judge_concurrency(self, judges: int) -> int:
        """Judge calls in flight at most: at the batch tier a call waits for its batch, so a whole batch is in flight
        (for `consume`, `backfill` and `calibrate` alike)."""
        if self.judge_tier == "batch":
            return max(self.max_concurrency, self.judge_batch_size * max(1, judges))
        return self.max_concurrency

    def consumer_config(self) -> dict[str, Any]:
        return consumer_options(self.kafka_config)

    def producer_config(self) -> dict[str, Any]:
        return producer_options(self.kafka_config)
