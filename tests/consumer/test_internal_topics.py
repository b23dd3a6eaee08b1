"""The internal topics on the user's cluster: created with the replication the cluster decides (its own default
unless --replication-factor says otherwise) and every --internal-topic-config setting, read back from the broker;
a layout the cluster refuses, a principal without Create and a wrong partition count are one line and an exit code;
topics that already exist are used as they are. Real `tracejudge consume` processes and a real admin client against
the embedded broker (Tansu), which accepts any layout: Kafka's own refusals are read from CreateTopics results."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from tests.support.pipeline import wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams.batch_store import batches_topic_spec
from tracejudge.consumer.streams.topics import (
    EXIT_CONFIG,
    EXIT_NOPERM,
    InternalTopics,
    TopicLayout,
    TopicLayoutError,
    TopicsNotCreatable,
    check_created,
    ensure_internal_topics,
    ensure_topics,
)

ROOT = Path(__file__).resolve().parents[2]


class RecordingAdmin(KafkaAdminClient):  # type: ignore[misc]
    """The real admin client; remembers what it was asked to create (to show what the consumer sent)."""

    def __init__(self, **configs: Any) -> None:
        super().__init__(**configs)
        self.requests: list[dict[str, Any]] = []

    def create_topics(self, new_topics: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests.append(dict(new_topics))
        return super().create_topics(new_topics, *args, **kwargs)


@pytest.fixture
def admin(broker: EmbeddedBroker) -> Iterator[RecordingAdmin]:
    client = RecordingAdmin(bootstrap_servers=broker.bootstrap_servers, client_id="test-admin")
    yield client
    client.close()


def group() -> str:
    return f"tj-topics-{uuid.uuid4().hex[:8]}"


def configs_of(admin: KafkaAdminClient, topic: str) -> dict[str, str]:
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    return {key: entry["value"] for key, entry in described["topic"][topic].items()}


def replicas_of(admin: KafkaAdminClient, topic: str) -> list[int]:
    (description,) = admin.describe_topics([topic])
    return sorted({len(p["replica_nodes"]) for p in description["partitions"]})


def tracejudge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_JUDGE_CHECK": "false", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *args], capture_output=True, text=True, env=environ, timeout=300
    )


def consume_args(broker: EmbeddedBroker, topic: str, group_id: str) -> list[str]:
    return [
        "consume",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--group-id",
        group_id,
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        "0",
    ]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_consume_creates_its_topics_with_the_replication_factor_and_settings_given(
    broker: EmbeddedBroker, topic: str, admin: RecordingAdmin, tmp_path: Path
) -> None:
    """A real `tracejudge consume`: flags and their variables reach the broker; read back with describe_configs."""
    group_id = group()
    env = {"TRACEJUDGE_INTERNAL_TOPIC_CONFIG": "min.insync.replicas=1,retention.ms=604800000"}
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tracejudge.consumer",
                *consume_args(broker, topic, group_id),
                "--replication-factor",
                "1",
                "--internal-topic-config",
                "max.message.bytes=4194304",
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_JUDGE_CHECK": "false", **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    names = InternalTopics(group_id).all()
    try:
        wait_for(
            lambda: set(names) <= set(admin.list_topics()) or process.poll() is not None,
            timeout=240,
            what="the internal topics",
        )
        assert process.poll() is None, log.read_text()
    finally:
        process.terminate()
        process.wait(60)
    flag_only = {"max.message.bytes": "4194304"}  # a flag replaces the variable's list (flag > env)
    for name in names:
        configs = configs_of(admin, name)
        assert {k: configs.get(k) for k in flag_only} == flag_only, (name, configs)
        assert "retention.ms" not in configs and "min.insync.replicas" not in configs, (name, configs)
        assert replicas_of(admin, name) == [1]
        assert configs.get("cleanup.policy") == ("compact" if name.endswith("-changelog") else None), (name, configs)


def test_settings_from_the_variable_and_the_default_replication_reach_the_broker(
    broker: EmbeddedBroker, topic: str, admin: RecordingAdmin
) -> None:
    """Without --replication-factor the request says -1 (the broker's default.replication.factor), never 1."""
    settings = Settings.from_options(
        bootstrap_servers=broker.bootstrap_servers,
        internal_topic_config="min.insync.replicas=1, retention.ms=604800000",
    )
    layout = TopicLayout(settings.replication_factor, settings.internal_topic_config)
    topics = InternalTopics(group())
    ensure_internal_topics(admin, topics, 3, layout)
    ensure_topics(admin, [batches_topic_spec(topics.group_id)], layout)
    sent = {name: spec for request in admin.requests for name, spec in request.items()}
    assert set(sent) == {*topics.all(), f"{topics.group_id}-judge-batches"}
    assert {spec["replication_factor"] for spec in sent.values()} == {-1}
    assert sent[f"{topics.group_id}-judge-batches"]["num_partitions"] == 1
    for name in sent:
        configs = configs_of(admin, name)
        assert configs["min.insync.replicas"] == "1" and configs["retention.ms"] == "604800000", (name, configs)
        compacted = name.endswith(("-changelog", "-judge-batches"))
        assert configs.get("cleanup.policy") == ("compact" if compacted else None), (name, configs)
        assert replicas_of(admin, name) == [1]  # the embedded broker's default: one replica


def test_a_replication_factor_above_the_broker_count_is_one_line_and_creates_nothing(
    broker: EmbeddedBroker, topic: str, admin: RecordingAdmin
) -> None:
    group_id = group()
    completed = tracejudge(*consume_args(broker, topic, group_id), "--replication-factor", "3")
    assert completed.returncode == EXIT_CONFIG == 78, completed.stderr
    line = one_line(completed.stderr)
    assert line.startswith("tracejudge: --replication-factor 3 is more than the 1 broker of the cluster"), line
    assert f"{group_id}-judge-queue" in line
    assert not [name for name in admin.list_topics() if name.startswith(group_id)]  # all or nothing


def test_existing_topics_with_the_right_partition_count_are_used_as_they_are(
    broker: EmbeddedBroker, admin: RecordingAdmin
) -> None:
    """Pre-created by an operator (ACLs without Create): no create request, their settings untouched."""
    topics = InternalTopics(group())
    admin.create_topics(
        {
            name: {"num_partitions": 3, "replication_factor": 1, "configs": {"retention.ms": "3600000"}}
            for name in topics.all()
        }
    )
    admin.requests.clear()
    ensure_internal_topics(admin, topics, 3, TopicLayout(1, {"retention.ms": "1", "min.insync.replicas": "2"}))
    assert admin.requests == []
    for name in topics.all():
        configs = configs_of(admin, name)
        assert configs["retention.ms"] == "3600000" and "min.insync.replicas" not in configs, configs


def test_an_existing_topic_with_the_wrong_partition_count_is_one_line(
    broker: EmbeddedBroker, topic: str, admin: RecordingAdmin
) -> None:
    group_id = group()
    admin.create_topics({InternalTopics(group_id).judge_queue: {"num_partitions": 2, "replication_factor": 1}})
    completed = tracejudge(*consume_args(broker, topic, group_id))
    assert completed.returncode == EXIT_CONFIG, completed.stderr
    line = one_line(completed.stderr)
    assert f"internal topic '{group_id}-judge-queue' has 2 partitions, 3 are needed" in line, line
    assert "--group-id" in line
    assert [name for name in admin.list_topics() if name.startswith(group_id)] == [f"{group_id}-judge-queue"]


SPECS = InternalTopics("g").specs(6)
LAYOUT = TopicLayout(3, {"min.insync.replicas": "2"})


def result(name: str, code: int, message: str | None = None) -> dict[str, Any]:
    """One topic's entry in kafka-python's `create_topics(..., raise_errors=False)["topics"]` (shape as returned)."""
    return {"name": name, "error_code": code, "error_message": message, "num_partitions": 6, "replication_factor": 3}


def test_a_layout_kafka_refuses_is_one_line_naming_the_topic_and_its_settings() -> None:
    """Kafka's own refusal (Tansu refuses nothing): InvalidReplicationFactor, PolicyViolation, InvalidConfig."""
    for code, error, message in (
        (38, "InvalidReplicationFactorError", "Replication factor: 3 larger than available brokers: 2."),
        (44, "PolicyViolationError", "Topic replication factor must be 3"),
        (40, "InvalidConfigurationError", "Invalid value 0 for configuration min.insync.replicas"),
    ):
        results = [result("g-conversations-repartition", 0), result("g-conversations-changelog", code, message)]
        with pytest.raises(TopicLayoutError) as refused:
            check_created(results, SPECS, LAYOUT)
        text = str(refused.value)
        assert refused.value.exit_code == EXIT_CONFIG and "\n" not in text
        assert text.startswith(
            "the cluster refused internal topic g-conversations-changelog (6 partitions, replication factor 3, "
            f"cleanup.policy=compact, min.insync.replicas=2): {error} ({message.rstrip('.')})"
        ), text


def test_no_create_permission_names_every_topic_to_pre_create_with_its_settings() -> None:
    results = [result(spec.name, 29, "Authorization failed.") for spec in SPECS]
    with pytest.raises(TopicsNotCreatable) as refused:
        check_created(results, SPECS, TopicLayout(None, {"min.insync.replicas": "2"}))
    text = str(refused.value)
    assert refused.value.exit_code == EXIT_NOPERM == 77 and "\n" not in text
    assert "TopicAuthorizationFailedError" in text
    for spec in SPECS:
        assert f"{spec.name} (6 partitions, the cluster's default replication factor" in text
    changelog = "g-conversations-changelog (6 partitions, the cluster's default replication factor, "
    assert changelog + "cleanup.policy=compact, min.insync.replicas=2)" in text


def test_a_topic_another_replica_created_first_is_not_an_error() -> None:
    results = [result(SPECS[0].name, 36, "Topic with this name already exists."), result(SPECS[1].name, 0)]
    assert check_created(results, SPECS, LAYOUT) == {SPECS[1].name}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--replication-factor", "0", "must be at least 1"),
        ("--internal-topic-config", "cleanup.policy=delete", "cleanup.policy is set per internal topic"),
        ("--internal-topic-config", "retention.ms", "expected KEY=VALUE"),
    ],
)
def test_a_bad_layout_option_is_a_configuration_error(flag: str, value: str, says: str) -> None:
    completed = tracejudge("consume", flag, value)
    assert completed.returncode == 2, completed.stderr
    line = one_line(completed.stderr)
    assert line.startswith(f"tracejudge: invalid configuration: {flag} /") and says in line, line
