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
from tracejudge.consumer.kafka import topics as registry
from tracejudge.consumer.kafka.topics import (
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
from tracejudge.consumer.settings import Settings
from tracejudge.consumer.streams.batch_store import batches_topic_spec

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
    names = [*InternalTopics(group_id).all(), InternalTopics(group_id).results]  # the results topic by default
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


# -- the registry: one list of every topic and group, the docs generated from it --------------------------------------


def test_the_docs_tables_are_the_registrys() -> None:
    """docs/deployment.md's internal-topics and ACL tables are rendered from consumer/kafka/topics.py: a topic or a
    group added there and not to the docs (or edited by hand) fails here. Regenerate with
    `python -m tracejudge.consumer.kafka.topics --update docs/deployment.md`."""
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert registry.generated_sections(text) == ["internal-topics", "acls"]
    assert registry.update_docs(text) == text, "docs/deployment.md differs from the registry: run --update"
    for topic in registry.INTERNAL_TOPICS:  # each by its literal name, in both tables
        assert text.count(f"| `<group>{topic.suffix}` |") == 2, topic.suffix
    for consumer_group in registry.GROUPS:
        assert f"| group | `<group>{consumer_group.suffix}` | Read, Describe |" in text, consumer_group.suffix


def test_a_hand_edited_table_is_rendered_again_and_an_unknown_section_refused() -> None:
    stale = "x\n<!-- generated: acls -->\n| group | `<group>` | Read |\n<!-- end generated -->\ny\n"
    fresh = registry.update_docs(stale)
    assert fresh.startswith("x\n<!-- generated: acls -->\n") and fresh.endswith("<!-- end generated -->\ny\n")
    assert "`<group>-judges-retries`" in fresh and "| group | `<group>` | Read |\n" not in fresh
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        registry.update_docs("<!-- generated: nope -->\n<!-- end generated -->\n")


def test_the_markdown_command_prints_the_docs_sections() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer.kafka.topics", "--markdown"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == registry.render_markdown()
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    for section in completed.stdout.split("<!-- end generated -->\n")[:-1]:
        assert section + "<!-- end generated -->\n" in text


def test_every_name_comes_from_the_group_id() -> None:
    topics = InternalTopics("g")
    assert topics.all() == [
        "g-conversations-repartition",
        "g-conversations-changelog",
        "g-judge-queue",
        "g-judge-retry",
    ]
    steps = [f"g-judge-retry-{n}" for n in range(1, registry.RETRY_STEPS + 1)]  # one per backoff step
    assert topics.every() == [*topics.all(), *steps, "g-judge-batches", "g-notifications", "g-results"]
    assert topics.every(6) == [*topics.all(), *steps[:6], "g-judge-batches", "g-notifications", "g-results"]
    assert [topics.judge_retry_step(n) for n in range(1, registry.RETRY_STEPS + 1)] == steps
    assert (topics.batches, topics.notifications, topics.results) == ("g-judge-batches", "g-notifications", "g-results")
    assert topics.groups() == ["g", "g-judges", "g-judges-retries"]
    assert batches_topic_spec("g") == registry.TopicSpec("g-judge-batches", 1, {"cleanup.policy": "compact"}, False)
    assert [spec.checked for spec in topics.specs(3)] == [True] * 4  # co-partitioned: the count is checked


def test_which_topics_and_groups_a_process_needs_follows_its_options() -> None:
    plain = Settings.from_options(group_id="g")
    names = [topic.name("g") for topic in registry.internal_topics_for(plain)]
    steps = [f"g-judge-retry-{n}" for n in range(1, 7)]  # the default 30 s backoff's six steps
    assert names == [*InternalTopics("g").all(), *steps, "g-results"]  # the results topic, by default
    quick = [
        topic.name("g") for topic in registry.internal_topics_for(plain.model_copy(update={"judge_retry_backoff": 1}))
    ]
    assert [name for name in quick if "-judge-retry-" in name] == [f"g-judge-retry-{n}" for n in range(1, 12)]
    assert plain.results_topic_name() == "g-results"
    for other in ({"results_topic": "warehouse"}, {"no_results": True}, {"role": "assemble"}):
        assert registry.RESULTS not in registry.internal_topics_for(plain.model_copy(update=other)), other
    assert plain.model_copy(update={"results_topic": "warehouse"}).results_topic_name() == "warehouse"
    assert plain.model_copy(update={"no_results": True}).results_topic_name() is None
    with pytest.raises(ValueError, match="contradicts --results-topic"):
        Settings.from_options(no_results=True, results_topic="warehouse")
    every = plain.model_copy(update={"judge_tier": "batch", "notify_url": ["http://127.0.0.1:9/hook"]})
    assert [topic.name("g") for topic in registry.internal_topics_for(every)] == InternalTopics("g").every(6)
    assembler = every.model_copy(update={"role": "assemble"})
    assert registry.BATCHES not in registry.internal_topics_for(assembler)
    assert [g.name("g") for g in registry.groups_for(assembler)] == ["g"]
    assert [g.name("g") for g in registry.groups_for(every.model_copy(update={"role": "judge"}))] == [
        "g-judges",
        "g-judges-retries",
    ]


def test_the_notifications_topic_is_created_under_the_one_policy(broker: EmbeddedBroker, admin: RecordingAdmin) -> None:
    """Once created by its own NewTopic call (a refusal left to auto-creation); now as every internal topic: the
    user's replication (unset: -1, the cluster's default) and settings, the registry's cleanup policy and retention."""
    from tracejudge.consumer.emit.notify import DeliveredIds

    name = InternalTopics(group()).notifications
    ids = DeliveredIds(broker.bootstrap_servers, name, {}, None, topic_configs={"min.insync.replicas": "1"})
    ids.ensure_topic()
    configs = configs_of(admin, name)
    assert configs["cleanup.policy"] == "compact,delete" and configs["retention.ms"] == str(7 * 86_400_000)
    assert configs["min.insync.replicas"] == "1"
    (description,) = admin.describe_topics([name])
    assert len(description["partitions"]) == 1 and replicas_of(admin, name) == [1]
    ids.ensure_topic()  # exists: used as it is


def test_a_pre_created_fixed_count_topic_is_used_as_it_is(broker: EmbeddedBroker, admin: RecordingAdmin) -> None:
    """An operator's notifications or batches topic with more partitions: its readers read every partition, so no
    count is imposed (only the co-partitioned topics' count is checked); nothing is created or altered."""
    group_id = group()
    for topic in (registry.BATCHES, registry.NOTIFICATIONS):
        admin.create_topics({topic.name(group_id): {"num_partitions": 3, "replication_factor": 1}})
    admin.requests.clear()
    registry.ensure(admin, [registry.BATCHES, registry.NOTIFICATIONS], group_id, TopicLayout(None, {}))
    assert admin.requests == []


def test_the_running_consumer_uses_only_the_registrys_topics_and_groups(
    broker: EmbeddedBroker, topic: str, judge_server: Any, admin: RecordingAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real consumer with every option that adds a topic (the batch tier, --notify-url, the default results topic
    and a dead-letter topic): every group id any of its clients is built with, every topic one subscribes to, is
    assigned, looks up or writes, and every topic of the group on the broker, is in the registry; and the registry
    lists nothing it does not use."""
    from tests.consumer.test_pipeline import Collect
    from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app
    from tests.support.webhook_receiver import WebhookReceiver
    from tracejudge.consumer.kafka import KafkaConsumer, KafkaProducer

    groups: set[str] = set()
    touched: set[str] = set()
    consumer_init, subscribe, assign = KafkaConsumer.__init__, KafkaConsumer.subscribe, KafkaConsumer.assign
    partitions_for_topic, send = KafkaConsumer.partitions_for_topic, KafkaProducer.send

    def init(self: Any, *topics: str, **configs: Any) -> None:
        if configs.get("group_id"):
            groups.add(configs["group_id"])
        touched.update(topics)
        consumer_init(self, *topics, **configs)

    def subscribing(self: Any, topics: Any = (), *args: Any, **kwargs: Any) -> Any:
        touched.update(topics)
        return subscribe(self, topics, *args, **kwargs)

    def assigning(self: Any, partitions: Any) -> Any:
        touched.update(tp.topic for tp in partitions)
        return assign(self, partitions)

    def looking_up(self: Any, name: str) -> Any:
        touched.add(name)
        return partitions_for_topic(self, name)

    def sending(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        touched.add(name)
        return send(self, name, *args, **kwargs)

    monkeypatch.setattr(KafkaConsumer, "__init__", init)
    monkeypatch.setattr(KafkaConsumer, "subscribe", subscribing)
    monkeypatch.setattr(KafkaConsumer, "assign", assigning)
    monkeypatch.setattr(KafkaConsumer, "partitions_for_topic", looking_up)
    monkeypatch.setattr(KafkaProducer, "send", sending)
    suffix = uuid.uuid4().hex[:8]
    dead_letter = f"dead-letter-{suffix}"
    collect = Collect()
    with WebhookReceiver() as receiver:
        settings = consumer_settings(
            broker.bootstrap_servers,
            topic,
            metrics="failure_rate",
            judge_model="gpt-5-mini",
            judge_tier="batch",
            judge_batch_wait=0.2,
            judge_batch_poll=0.2,
            notify_url=[receiver.url],
            dead_letter_topic=dead_letter,
            session_idle_timeout=1.0,
        )
        with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
            assert consumer.app.service.assigned.wait(60), "partitions not assigned"
            play(traced_app(broker.bootstrap_servers, topic), {f"registry-{suffix}": [("question", "answer")]})
            wait_for(lambda: len(collect.ids()) >= 1, timeout=120, what="the conversation judged")
    group_id = settings.group_id
    topics = InternalTopics(group_id)
    on_broker = {name for name in admin.list_topics() if name.startswith(f"{group_id}-")}
    every = set(topics.every(registry.retry_step_count(settings.judge_retry_backoff)))  # this backoff's retry steps
    assert on_broker == every, on_broker ^ every
    assert groups == set(topics.groups()), groups ^ set(topics.groups())
    allowed = {topic, dead_letter, *every}
    assert touched - allowed == set(), touched - allowed
    assert every <= touched  # each one read or written, not only created
