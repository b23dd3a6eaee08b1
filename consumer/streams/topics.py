"""The internal topics, named from the group id (as Kafka Streams names them from the application id) and created
by the consumer with the input topic's partition count, so state, spans and judge jobs are co-partitioned."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from .._errors import ConsumerError

logger = logging.getLogger("tracejudge.consumer.streams")


class TopicLayoutError(ConsumerError):
    """An internal topic exists with the wrong partition count, or the input topic cannot be found."""


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


def ensure_internal_topics(admin: KafkaAdminClient, topics: InternalTopics, partitions: int) -> None:
    """Create the internal topics if missing (a cluster without auto-creation works); refuse a wrong layout."""
    wanted = [
        NewTopic(topics.repartition, partitions, 1),
        NewTopic(topics.changelog, partitions, 1, topic_configs={"cleanup.policy": "compact"}),
        NewTopic(topics.judge_queue, partitions, 1),
        NewTopic(topics.judge_retry, partitions, 1),
    ]
    existing = set(admin.list_topics())
    missing = [topic for topic in wanted if topic.name not in existing]
    if missing:
        try:
            admin.create_topics(missing)
            logger.info("created internal topics %s (%d partitions)", [t.name for t in missing], partitions)
        except TopicAlreadyExistsError:
            pass  # another replica created them first
    for description in admin.describe_topics([t.name for t in wanted]):
        count = len(description.get("partitions") or [])
        if count and count != partitions:
            raise TopicLayoutError(
                f"internal topic {description['topic']!r} has {count} partitions, the input topic {partitions}: "
                "they must match (delete the internal topics of this group, or use a new --group-id)"
            )
