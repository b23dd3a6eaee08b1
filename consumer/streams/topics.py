"""The internal topics, named from the group id (as Kafka Streams names them from the application id) and created
by the consumer with the input topic's partition count, so state, spans and judge jobs are co-partitioned.

Their replication is the cluster's to decide, as in Kafka Streams: without `--replication-factor` they are created
with replication factor -1 (the broker's `default.replication.factor`, Kafka 2.4+), and `--internal-topic-config`
settings (e.g. `min.insync.replicas=2`) go on every one of them. Topics that already exist with the right partition
count are used as they are (pre-created by an operator whose ACLs give the consumer no Create).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as Errors
from kafka.admin import KafkaAdminClient

from .._errors import StartupError

logger = logging.getLogger("tracejudge.consumer.streams")

EXIT_CONFIG = 78  # sysexits' EX_CONFIG: the cluster refused the internal topics' layout, or one has the wrong layout
EXIT_NOPERM = 77  # sysexits' EX_NOPERM: the consumer may not create its internal topics: they must be pre-created
COMPACT = {"cleanup.policy": "compact"}
# The Kafka errors that mean "you may not create topics" (ACLs without Create on the topics or the cluster).
_NOT_ALLOWED = (Errors.TopicAuthorizationFailedError, Errors.ClusterAuthorizationFailedError)


class TopicLayoutError(StartupError):
    """An internal topic exists with the wrong partition count, the input topic cannot be found, or the cluster
    refused the layout the internal topics were to be created with."""

    exit_code = EXIT_CONFIG


class TopicsNotCreatable(StartupError):
    """The cluster does not let this principal create the internal topics: they must be pre-created."""

    exit_code = EXIT_NOPERM


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create: its name, partition count and the settings only tracejudge decides (cleanup policy)."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What the operator decides for every internal topic: replication (None: the broker's default) and settings."""

    replication_factor: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)

    def configs_of(self, spec: TopicSpec) -> dict[str, str]:
        return {**self.configs, **spec.configs}

    def describe(self, spec: TopicSpec) -> str:
        """`name (3 partitions, replication factor 3, cleanup.policy=compact)`: what to pre-create it with."""
        replication = (
            "the cluster's default replication factor"
            if self.replication_factor is None
            else f"replication factor {self.replication_factor}"
        )
        settings = "".join(f", {k}={v}" for k, v in sorted(self.configs_of(spec).items()))
        return (
            f"{spec.name} ({spec.partitions} partition{'s' if spec.partitions != 1 else ''}, {replication}{settings})"
        )


@dataclass(frozen=True, slots=True)
class InternalTopics:
    group_id: str

    @property
    def repartition(self) -> str:
        """Spans (as conversation events) and verdict acknowledgements, keyed by conversation id."""
        return f"{self.group_id}-conversations-repartition"

    @property
    def changelog(self) -> str:
        """Each conversation's state, compacted: the latest record per conversation id, tombstones when forgotten."""
        return f"{self.group_id}-conversations-changelog"

    @property
    def judge_queue(self) -> str:
        """Completed conversations waiting for the judges (and feedback for them), keyed by conversation id."""
        return f"{self.group_id}-judge-queue"

    @property
    def judge_retry(self) -> str:
        """Jobs waiting for another judge attempt (a not-before time each), keyed by conversation id; forwarded to
        the judge queue when due. Its retention must exceed --judge-retry-horizon (the cluster's default, 7 days)."""
        return f"{self.group_id}-judge-retry"

    def all(self) -> list[str]:
        return [self.repartition, self.changelog, self.judge_queue, self.judge_retry]

    def specs(self, partitions: int) -> list[TopicSpec]:
        return [
            TopicSpec(self.repartition, partitions),
            TopicSpec(self.changelog, partitions, COMPACT),
            TopicSpec(self.judge_queue, partitions),
            TopicSpec(self.judge_retry, partitions),
        ]


def partitions_of(consumer: Any, topic: str, timeout_s: float = 30.0) -> int:
    """The topic's partition count, waiting for metadata (a new topic takes a moment to appear)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = consumer.partitions_for_topic(topic)
        if found:
            return len(found)
        if time.monotonic() > deadline:
            raise TopicLayoutError(f"topic {topic!r} not found on the brokers (create it, or check --topic)")
        time.sleep(0.2)


def ensure_internal_topics(
    admin: KafkaAdminClient, topics: InternalTopics, partitions: int, layout: TopicLayout | None = None
) -> None:
    """Create the internal topics if missing (a cluster without auto-creation works); refuse a wrong layout."""
    ensure_topics(admin, topics.specs(partitions), layout or TopicLayout())


def ensure_topics(admin: KafkaAdminClient, specs: Sequence[TopicSpec], layout: TopicLayout) -> None:
    """Create the missing topics with `layout`; existing ones are used as they are if their partition count is
    right. Raises TopicLayoutError (refused, or a wrong count) or TopicsNotCreatable (no Create permission)."""
    existing = set(admin.list_topics())
    _check_counts(admin, [spec for spec in specs if spec.name in existing])  # before anything is created
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        _create(admin, missing, layout)
        _check_counts(admin, missing)  # another replica may have created one first


def _check_counts(admin: KafkaAdminClient, specs: Sequence[TopicSpec]) -> None:
    if not specs:
        return
    for description in admin.describe_topics([spec.name for spec in specs]):
        wanted = next((s.partitions for s in specs if s.name == description.get("name")), None)
        count = len(description.get("partitions") or [])
        if wanted is not None and count and count != wanted:
            raise TopicLayoutError(
                f"internal topic {description['name']!r} has {count} partitions, {wanted} are needed (the input "
                "topic's count): delete the internal topics of this group, or use a new --group-id"
            )


def _create(admin: KafkaAdminClient, missing: Sequence[TopicSpec], layout: TopicLayout) -> None:
    if layout.replication_factor is not None:
        _check_brokers(admin, missing, layout)
    request = {
        spec.name: {
            "num_partitions": spec.partitions,
            "replication_factor": -1 if layout.replication_factor is None else layout.replication_factor,
            "configs": layout.configs_of(spec),
        }
        for spec in missing
    }
    try:
        response = admin.create_topics(request, raise_errors=False)
    except Errors.IncompatibleBrokerVersion:
        raise TopicLayoutError(
            "the brokers are older than Kafka 2.4 and cannot apply their own default replication factor: give "
            "--replication-factor (TRACEJUDGE_REPLICATION_FACTOR)"
        ) from None
    except _NOT_ALLOWED as exc:
        raise not_creatable(missing, layout, exc) from None
    created = check_created(response.get("topics") or [], missing, layout)
    if created:
        logger.info("created internal topics: %s", "; ".join(layout.describe(s) for s in missing if s.name in created))


def check_created(results: Iterable[Mapping[str, Any]], missing: Sequence[TopicSpec], layout: TopicLayout) -> set[str]:
    """The names created, from a CreateTopics response's per-topic results (kafka-python's `create_topics(...,
    raise_errors=False)["topics"]`); raises for the first refusal, as one line saying what to do."""
    created: set[str] = set()
    by_name = {spec.name: spec for spec in missing}
    for result in results:
        error = Errors.for_code(int(result.get("error_code") or 0))
        name = str(result.get("name"))
        if error is Errors.NoError:
            created.add(name)
        elif error is Errors.TopicAlreadyExistsError:
            continue  # another replica created it first
        elif issubclass(error, _NOT_ALLOWED):
            raise not_creatable(missing, layout, error(result.get("error_message")))
        else:
            spec = by_name.get(name)
            what = layout.describe(spec) if spec is not None else name
            message = result.get("error_message") or ""
            raise TopicLayoutError(
                f"the cluster refused internal topic {what}: {error.__name__}"
                + (f" ({message.rstrip('.')})" if message else "")
                + ": set --replication-factor / --internal-topic-config to what the cluster accepts, or pre-create "
                "the topic"
            )
    return created


def not_creatable(missing: Sequence[TopicSpec], layout: TopicLayout, exc: BaseException) -> TopicsNotCreatable:
    topics = "; ".join(layout.describe(spec) for spec in missing)
    return TopicsNotCreatable(
        f"not allowed to create the internal topics ({type(exc).__name__}): pre-create them: {topics}; or grant this "
        "principal Create on them (docs/deployment.md#a-managed-kafka-cluster)"
    )


def _check_brokers(admin: KafkaAdminClient, missing: Sequence[TopicSpec], layout: TopicLayout) -> None:
    """Kafka refuses a replication factor above its broker count (InvalidReplicationFactor); said before anything is
    created, so the topics are created together or not at all, on any broker (the embedded one would accept it).
    Fenced brokers count, so this never refuses what Kafka would accept; a cluster that will not describe itself is
    left to refuse on its own."""
    try:
        brokers = len(admin.describe_cluster().get("brokers") or [])
    except Errors.BrokerResponseError as exc:
        logger.debug("cannot count the brokers (%r): the cluster checks the replication factor itself", exc)
        return
    wanted = layout.replication_factor or 0
    if brokers and wanted > brokers:
        names = ", ".join(spec.name for spec in missing)
        raise TopicLayoutError(
            f"--replication-factor {wanted} is more than the {brokers} broker{'s' if brokers != 1 else ''} of the "
            f"cluster can hold: the internal topics ({names}) were not created; lower it, or leave it unset for the "
            "cluster's default"
        )
