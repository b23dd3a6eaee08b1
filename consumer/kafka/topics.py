"""The registry of every topic and consumer group the consumer uses, and the one policy that creates its internal
topics. docs/deployment.md's topic and ACL tables are rendered from it (`python -m tracejudge.consumer.kafka.topics
--markdown`, `--update docs/deployment.md`), and tests/consumer/test_internal_topics.py fails when they differ or when
a running consumer touches a topic or a group the registry does not list: an operator who pre-creates the topics and
grants literal ACLs from the docs gets no refusal.

The internal topics are named from the group id (as Kafka Streams names them from the application id). Those the
stream tasks share are created with the span topic's partition count (co-partitioned: state, spans and judge jobs of
partition p go together), and that count is checked on a topic that already exists. The others have a fixed count.

Their replication is the cluster's to decide, as in Kafka Streams: without `--replication-factor` they are created
with replication factor -1 (the broker's `default.replication.factor`, Kafka 2.4+), and `--internal-topic-config`
settings (e.g. `min.insync.replicas=2`) go on every one of them; tracejudge sets only what its use of a topic needs
(`cleanup.policy`, the notifications' retention). Topics that already exist are used as they are (pre-created by an
operator whose ACLs give the consumer no Create); the consumer never alters a topic.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kafka.errors as Errors
from kafka.admin import KafkaAdminClient

from .._errors import EXIT_NOPERM, StartupError

logger = logging.getLogger("tracejudge.consumer.streams")

EXIT_CONFIG = 78  # sysexits' EX_CONFIG: the cluster refused the internal topics' layout, or one has the wrong layout
COMPACT = {"cleanup.policy": "compact"}
# The Kafka errors that mean "you may not create topics" (ACLs without Create on the topics or the cluster).
_NOT_ALLOWED = (Errors.TopicAuthorizationFailedError, Errors.ClusterAuthorizationFailedError)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_NOPERM",
    "GROUPS",
    "INTERNAL_TOPICS",
    "ConsumerGroup",
    "InternalTopic",
    "InternalTopics",
    "TopicLayout",
    "TopicLayoutError",
    "TopicSpec",
    "TopicsNotCreatable",
    "ensure",
    "ensure_internal_topics",
    "ensure_topics",
    "partitions_of",
    "results_topic_of",
    "retry_step_count",
]


class TopicLayoutError(StartupError):
    """An internal topic exists with the wrong partition count, the input topic cannot be found, or the cluster
    refused the layout the internal topics were to be created with."""

    exit_code = EXIT_CONFIG


class TopicsNotCreatable(StartupError):
    """The cluster does not let this principal create the internal topics: they must be pre-created."""

    exit_code = EXIT_NOPERM


# -- the registry ------------------------------------------------------------------------------------------------------

# The processes that talk to Kafka, by what they do there (`consume --role all` is both consume roles).
ASSEMBLE = "consume (assemble)"  # `consume --role all|assemble`: spans → conversations → the judge queue
JUDGE = "consume (judge)"  # `consume --role all|judge`: the judge queue → judges → outputs
CONSUME = "consume"  # either role
BACKFILL = "backfill"
EXPLAIN = "explain"
READERS = "compare, export, watch"
REJUDGE = "rejudge"

READ, WRITE, DESCRIBE = "Read", "Write", "Describe"
Access = tuple[tuple[str, tuple[str, ...]], ...]  # (who, the operations it needs), in the docs' order


@dataclass(frozen=True, slots=True)
class InternalTopic:
    """One internal topic: `<group><suffix>`, created by the consumer (`created_by`) when it is needed (`when`).

    `partitions` None is the span topic's count, checked on an existing topic (co-partitioned) unless `checked` is
    False; a number is the count a new topic gets (an existing one is used whatever its count: its readers read every
    partition). `configs` are what tracejudge decides (never the user's option): the rest is the cluster's default or
    `--internal-topic-config`.
    """

    key: str
    suffix: str
    holds: str
    partitions: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)
    when: str = "always"
    needed: Callable[[Any], bool] = lambda settings: True
    access: Access = ()
    created_by: str = CONSUME
    checked: bool = True  # with `partitions` None: an existing topic must have the span topic's count

    def name(self, group_id: str) -> str:
        return f"{group_id}{self.suffix}"

    @property
    def co_partitioned(self) -> bool:
        return self.partitions is None and self.checked

    def spec(self, group_id: str, partitions: int | None = None) -> TopicSpec:
        """What to create: with the span topic's `partitions` if co-partitioned (then required)."""
        count = partitions if self.partitions is None else self.partitions
        if count is None:
            raise ValueError(f"{self.name(group_id)} has the span topic's partition count: pass it")
        return TopicSpec(self.name(group_id), count, dict(self.configs), checked=self.co_partitioned)


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A consumer group, `<group><suffix>`: joined by its members, or only committed to (`joined` False)."""

    key: str
    suffix: str
    holds: str
    who: str
    joined: bool = True
    operations: tuple[str, ...] = (READ, DESCRIBE)

    @property
    def when(self) -> str:
        return "with `--role all` or `assemble`" if self.who == ASSEMBLE else "with `--role all` or `judge`"

    def name(self, group_id: str) -> str:
        return f"{group_id}{self.suffix}"


@dataclass(frozen=True, slots=True)
class UserTopic:
    """A topic the user names (the consumer never creates it): listed for its ACLs."""

    option: str
    holds: str
    access: Access
    when: str = "always"


def _judging(settings: Any) -> bool:
    return getattr(settings, "role", "all") in ("all", "judge")


REPARTITION = InternalTopic(
    "repartition",
    "-conversations-repartition",
    "spans routed to their conversation's owner, verdict acknowledgements",
    access=((ASSEMBLE, (READ, WRITE, DESCRIBE)), (JUDGE, (WRITE, DESCRIBE))),
)
CHANGELOG = InternalTopic(
    "changelog",
    "-conversations-changelog",
    "each conversation's state (restored on rebalance and restart)",
    configs=COMPACT,
    access=((ASSEMBLE, (READ, WRITE, DESCRIBE)), (EXPLAIN, (READ, DESCRIBE))),
)
JUDGE_QUEUE = InternalTopic(
    "judge_queue",
    "-judge-queue",
    "completed conversations waiting for the judges",
    access=((ASSEMBLE, (WRITE, DESCRIBE)), (JUDGE, (READ, WRITE, DESCRIBE)), (REJUDGE, (READ, WRITE, DESCRIBE))),
)
JUDGE_RETRY = InternalTopic(
    "judge_retry",
    "-judge-retry",
    "judge jobs whose next attempt is sooner than one `--judge-retry-backoff` (the last, at the horizon), read at once "
    "and forwarded to the judge queue when due (the retry topics' retention, the cluster's default of 7 days, must "
    "exceed `--judge-retry-horizon`)",
    access=((JUDGE, (READ, WRITE, DESCRIBE)),),
)
# One retry topic per backoff step (consumer/judging/retries.py's ladder): step n holds the jobs waiting the backoff
# doubled n-1 times (10 minutes at most), so a topic's records come due in the order they were written and none waits
# behind another's longer backoff. How many follow --judge-retry-backoff: 6 with its 30 s default, 11 with 1 s.
RETRY_STEPS = 11
_LONGEST_RETRY_WAIT_S = 600.0  # retries.py's MAX_BACKOFF_S (the seam imports nothing above it; a test keeps them equal)


def retry_step_count(backoff_s: float) -> int:
    """The steps of the retry ladder for this backoff: doubled until it reaches 10 minutes, RETRY_STEPS at most."""
    wait, count = backoff_s, 1
    while wait < _LONGEST_RETRY_WAIT_S and count < RETRY_STEPS:
        wait, count = wait * 2, count + 1
    return count


def _retry_step(step: int) -> InternalTopic:
    waits = (
        "one `--judge-retry-backoff`"
        if step == 1
        else f"{2 ** (step - 1)} × `--judge-retry-backoff` (10 minutes at most)"
    )
    under = "" if step == 1 else f" and a `--judge-retry-backoff` under {_LONGEST_RETRY_WAIT_S / 2 ** (step - 2):g} s"
    return InternalTopic(
        f"judge_retry_{step}",
        f"-judge-retry-{step}",
        f"judge jobs waiting {waits} for another attempt, forwarded to the judge queue when due",
        when=f"with `--role all` or `judge`{under}",
        needed=lambda settings: _judging(settings) and step <= retry_step_count(settings.judge_retry_backoff),
        access=((JUDGE, (READ, WRITE, DESCRIBE)),),
        created_by=JUDGE,
    )


JUDGE_RETRY_STEPS: tuple[InternalTopic, ...] = tuple(_retry_step(step) for step in range(1, RETRY_STEPS + 1))
BATCHES = InternalTopic(
    "batches",
    "-judge-batches",
    "the submitted batches, read whole by every replica (a batch is never paid for twice)",
    partitions=1,
    configs=COMPACT,
    when="with `--judge-tier batch`",
    needed=lambda settings: _judging(settings) and getattr(settings, "judge_tier", None) == "batch",
    access=((JUDGE, (READ, WRITE, DESCRIBE)),),
    created_by=JUDGE,
)
# The delivered-ids topic: compacted (one record per result and URL), and what is older than a week deleted (a replay
# reaches further back only after a reset); its size is bounded by the notifications' rate limit.
NOTIFICATIONS = InternalTopic(
    "notifications",
    "-notifications",
    "the notifications delivered (so a replay is not sent again), read whole at start",
    partitions=1,
    configs={"cleanup.policy": "compact,delete", "retention.ms": str(7 * 86_400_000)},
    when="with `--notify-url`",
    needed=lambda settings: bool(getattr(settings, "notify_url", None)),
    access=((CONSUME, (READ, WRITE, DESCRIBE)),),
)
# The results topic: every judgement's verdict, reason and evidence, for `explain`, `export`, `compare` and the
# warehouse. Created by the judge role as the other internal topics are, with the span topic's partition count (it
# scales with the deployment; an existing one is used whatever its count: its readers read every partition).
RESULTS = InternalTopic(
    "results",
    "-results",
    "one JSON record per judgement: verdict, reason, evidence (the transcript with `--results-transcript`)",
    checked=False,
    when="unless `--results-topic` names another or `--no-results`",
    needed=lambda settings: _writes_default_results(settings),
    access=(
        (JUDGE, (WRITE, DESCRIBE)),
        (EXPLAIN, (READ, DESCRIBE)),
        (READERS, (READ, DESCRIBE)),
        (REJUDGE, (READ, DESCRIBE)),
    ),
    created_by=JUDGE,
)
# `tracejudge rejudge`: the failed results already sent to be judged again (keyed by result id), read whole at its
# start so a second run judges none of them twice. Written by the CLI only; compacted, so it stays one record a result.
REJUDGED = InternalTopic(
    "rejudged",
    "-rejudged",
    "the failed results `tracejudge rejudge` sent to be judged again (each is judged again once)",
    partitions=1,
    configs=COMPACT,
    when="once `tracejudge rejudge` has run",
    needed=lambda settings: False,
    access=((REJUDGE, (READ, WRITE, DESCRIBE)),),
    created_by=REJUDGE,
)
# In the docs' order; the first four always exist and share the span topic's partition count.
INTERNAL_TOPICS: tuple[InternalTopic, ...] = (
    REPARTITION,
    CHANGELOG,
    JUDGE_QUEUE,
    JUDGE_RETRY,
    *JUDGE_RETRY_STEPS,
    BATCHES,
    NOTIFICATIONS,
    RESULTS,
    REJUDGED,
)
CORE_TOPICS = tuple(topic for topic in INTERNAL_TOPICS if topic.when == "always")


def _writes_default_results(settings: Any) -> bool:
    """A judge role whose results topic is `<group>-results` (not another --results-topic, not --no-results)."""
    return _judging(settings) and results_topic_of(settings) == RESULTS.name(settings.group_id)


def results_topic_of(settings: Any) -> str | None:
    """The results topic for these settings, for every command that writes or reads it: `--results-topic`, else
    `<group>-results`; None with `--no-results` (TRACEJUDGE_NO_RESULTS)."""
    if getattr(settings, "no_results", False):
        return None
    return getattr(settings, "results_topic", None) or RESULTS.name(settings.group_id)


ASSEMBLERS = ConsumerGroup("assemblers", "", "the span topic's offsets", ASSEMBLE)
JUDGES = ConsumerGroup("judges", "-judges", "the judge queue's offsets", JUDGE)
JUDGE_RETRIES = ConsumerGroup(
    "judge_retries",
    "-judges-retries",
    "the retry topic's offsets (apart: the judge workers' assignor balances the judge queue alone)",
    JUDGE,
    joined=False,
)
GROUPS: tuple[ConsumerGroup, ...] = (ASSEMBLERS, JUDGES, JUDGE_RETRIES)

# Every `consume` reads the span topic's partition count at start (the co-partitioned topics' count): Describe.
SPAN_TOPIC = UserTopic(
    "--topic",
    "the span topic",
    ((ASSEMBLE, (READ, DESCRIBE)), (JUDGE, (DESCRIBE,)), (BACKFILL, (READ, DESCRIBE))),
)
RESULTS_TOPIC = UserTopic(
    "--results-topic",
    "one record per judgement, instead of `<group>-results`",
    (
        (JUDGE, (WRITE, DESCRIBE)),
        (BACKFILL, (READ, WRITE, DESCRIBE)),
        (EXPLAIN, (READ, DESCRIBE)),
        (READERS, (READ, DESCRIBE)),
        (REJUDGE, (READ, DESCRIBE)),
    ),
    when="when set",
)
DEAD_LETTER_TOPIC = UserTopic(
    "--dead-letter-topic",
    "records that cannot be read",
    ((ASSEMBLE, (WRITE, DESCRIBE)), (BACKFILL, (WRITE, DESCRIBE))),
    when="when set",
)
USER_TOPICS: tuple[UserTopic, ...] = (SPAN_TOPIC, RESULTS_TOPIC, DEAD_LETTER_TOPIC)


def internal_topics_for(settings: Any) -> list[InternalTopic]:
    """The internal topics a `consume` process with these settings uses (`needed`)."""
    return [topic for topic in INTERNAL_TOPICS if topic.needed(settings)]


def groups_for(settings: Any) -> list[ConsumerGroup]:
    """The groups a `consume` process with these settings joins or commits to."""
    role = getattr(settings, "role", "all")
    return [g for g in GROUPS if (g.who == ASSEMBLE and role != "judge") or (g.who == JUDGE and role != "assemble")]


@dataclass(frozen=True, slots=True)
class InternalTopics:
    """The internal topics' names for one group id."""

    group_id: str

    @property
    def repartition(self) -> str:
        """Spans (as conversation events) and verdict acknowledgements, keyed by conversation id."""
        return REPARTITION.name(self.group_id)

    @property
    def changelog(self) -> str:
        """Each conversation's state, compacted: the latest record per conversation id, tombstones when forgotten."""
        return CHANGELOG.name(self.group_id)

    @property
    def judge_queue(self) -> str:
        """Completed conversations waiting for the judges (and feedback for them), keyed by conversation id."""
        return JUDGE_QUEUE.name(self.group_id)

    @property
    def judge_retry(self) -> str:
        """Jobs waiting for another judge attempt (a not-before time each), keyed by conversation id; forwarded to
        the judge queue when due. Its retention must exceed --judge-retry-horizon (the cluster's default, 7 days)."""
        return JUDGE_RETRY.name(self.group_id)

    def judge_retry_step(self, step: int) -> str:
        """The retry topic of backoff step `step` (1 to RETRY_STEPS): jobs waiting the backoff doubled step-1 times."""
        return JUDGE_RETRY_STEPS[step - 1].name(self.group_id)

    @property
    def batches(self) -> str:
        """--judge-tier batch: the submitted batches (kafka/topics.py's BATCHES)."""
        return BATCHES.name(self.group_id)

    @property
    def notifications(self) -> str:
        """--notify-url: the delivered notifications' ids (NOTIFICATIONS)."""
        return NOTIFICATIONS.name(self.group_id)

    @property
    def results(self) -> str:
        """The default results topic (RESULTS); `results_topic_of(settings)` is the one in use."""
        return RESULTS.name(self.group_id)

    @property
    def rejudged(self) -> str:
        """`tracejudge rejudge`: the failed result ids already sent to be judged again (REJUDGED)."""
        return REJUDGED.name(self.group_id)

    def all(self) -> list[str]:
        """The topics every `consume` creates at start (co-partitioned with the span topic)."""
        return [topic.name(self.group_id) for topic in CORE_TOPICS]

    def every(self, retry_steps: int = RETRY_STEPS) -> list[str]:
        """Every internal topic a `consume` of the group may create, those only some options add included (not a
        command's own, such as `rejudge`'s REJUDGED); `retry_steps`: of a backoff with that many steps."""
        steps = {topic.key for topic in JUDGE_RETRY_STEPS[retry_steps:]}
        return [
            topic.name(self.group_id)
            for topic in INTERNAL_TOPICS
            if topic.created_by != REJUDGE and topic.key not in steps
        ]

    def groups(self) -> list[str]:
        return [group.name(self.group_id) for group in GROUPS]

    def specs(self, partitions: int) -> list[TopicSpec]:
        return [topic.spec(self.group_id, partitions) for topic in CORE_TOPICS]


# -- creating them: one policy ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create: its name, partition count and the settings only tracejudge decides (cleanup policy).
    `checked`: an existing topic must have this partition count (co-partitioned); else it is used as it is."""

    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    checked: bool = True


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What the operator decides for every internal topic: replication (None: the broker's default) and settings."""

    replication_factor: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Any) -> TopicLayout:
        """`--replication-factor` and `--internal-topic-config`."""
        return cls(settings.replication_factor, dict(settings.internal_topic_config))

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


def ensure(
    admin: KafkaAdminClient,
    topics: Iterable[InternalTopic],
    group_id: str,
    layout: TopicLayout,
    partitions: int | None = None,
) -> None:
    """Any subset of the registry's internal topics for `group_id`, under the one policy (`ensure_topics`);
    `partitions` is the span topic's count, needed by the co-partitioned ones."""
    ensure_topics(admin, [topic.spec(group_id, partitions) for topic in topics], layout)


def ensure_internal_topics(
    admin: KafkaAdminClient, topics: InternalTopics, partitions: int, layout: TopicLayout | None = None
) -> None:
    """The topics every `consume` creates at start (a cluster without auto-creation works); a wrong layout refused."""
    ensure(admin, CORE_TOPICS, topics.group_id, layout or TopicLayout(), partitions)


def ensure_topics(admin: KafkaAdminClient, specs: Sequence[TopicSpec], layout: TopicLayout) -> None:
    """Create the missing topics with `layout`; existing ones are used as they are if their partition count is
    right (where it is `checked`). Raises TopicLayoutError (refused, or a wrong count) or TopicsNotCreatable (no
    Create permission)."""
    existing = set(admin.list_topics())
    _check_counts(admin, [spec for spec in specs if spec.name in existing])  # before anything is created
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        _create(admin, missing, layout)
        _check_counts(admin, missing)  # another replica may have created one first


def _check_counts(admin: KafkaAdminClient, specs: Sequence[TopicSpec]) -> None:
    specs = [spec for spec in specs if spec.checked]
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


# -- the docs' tables ------------------------------------------------------------------------------------------------

GENERATED = re.compile(r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)


def _ops(operations: Iterable[str]) -> str:
    order = (READ, WRITE, DESCRIBE)
    return ", ".join(sorted(set(operations), key=order.index))


def _who(access: Access) -> str:
    return "; ".join(f"{who}: {_ops(operations)}" for who, operations in access)


def topics_table() -> str:
    """docs/deployment.md's internal-topics table."""
    rows = [
        "| topic | partitions | cleanup.policy | other settings tracejudge sets | exists | what it holds |",
        "|---|---|---|---|---|---|",
    ]
    for topic in INTERNAL_TOPICS:
        if topic.partitions is not None:
            partitions = f"{topic.partitions} (any if pre-created)"
        else:
            partitions = f"the span topic's ({'checked' if topic.co_partitioned else 'any if pre-created'})"
        policy = topic.configs.get("cleanup.policy", "delete (the cluster's default)")
        other = ", ".join(f"`{k}={v}`" for k, v in sorted(topic.configs.items()) if k != "cleanup.policy") or "none"
        rows.append(f"| `<group>{topic.suffix}` | {partitions} | {policy} | {other} | {topic.when} | {topic.holds} |")
    return "\n".join(rows) + "\n"


def acl_table() -> str:
    """docs/deployment.md's ACL table: every topic and group by its literal name, and who needs which operation."""
    rows = ["| resource | literal name | operations | when | who needs what |", "|---|---|---|---|---|"]
    for user in USER_TOPICS[:1]:
        ops = _ops(op for _, operations in user.access for op in operations)
        rows.append(f"| topic | `{user.option}` ({user.holds}) | {ops} | {user.when} | {_who(user.access)} |")
    for topic in INTERNAL_TOPICS:
        ops = _ops(op for _, operations in topic.access for op in operations)
        who = f"{_who(topic.access)}; {topic.created_by}: Create"
        rows.append(f"| topic | `<group>{topic.suffix}` | {ops}; Create unless pre-created | {topic.when} | {who} |")
    for group in GROUPS:
        does = "joins it" if group.joined else "commits to it, never joins"
        rows.append(
            f"| group | `<group>{group.suffix}` | {_ops(group.operations)} | {group.when} | {group.who}: {does}; it "
            f"holds {group.holds} |"
        )
    for user in USER_TOPICS[1:]:
        ops = _ops(op for _, operations in user.access for op in operations)
        rows.append(f"| topic | `{user.option}` ({user.holds}) | {ops} | {user.when} | {_who(user.access)} |")
    rows.append(
        "| cluster | `kafka-cluster` | IdempotentWrite only on brokers older than Kafka 3.0 | always | every producer "
        "(they are idempotent) |"
    )
    rows.append("")
    rows.append(
        "With prefixed ACLs instead, topic `<group>-` (prefixed) and group `<group>` (prefixed) cover every internal "
        "topic and group above."
    )
    return "\n".join(rows) + "\n"


SECTIONS: dict[str, Callable[[], str]] = {"internal-topics": topics_table, "acls": acl_table}


def render_markdown() -> str:
    """Every generated section, each between its markers, as they appear in docs/deployment.md."""
    return "\n".join(
        f"<!-- generated: {name} -->\n{render()}<!-- end generated -->\n" for name, render in SECTIONS.items()
    )


def update_docs(text: str) -> str:
    """`text` with each generated section (between `<!-- generated: NAME -->` and `<!-- end generated -->`) rendered
    again from the registry; a section the registry does not know is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in SECTIONS:
            raise ValueError(f"unknown generated section {name!r} (known: {', '.join(SECTIONS)})")
        return f"{match.group(1)}{SECTIONS[name]()}{match.group(4)}"

    return GENERATED.sub(replace, text)


def generated_sections(text: str) -> list[str]:
    return [match.group("name") for match in GENERATED.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tracejudge.consumer.kafka.topics",
        description="The internal topics' and the ACLs' tables of docs/deployment.md, from the registry.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--markdown", action="store_true", help="print the generated sections")
    action.add_argument("--update", metavar="PATH", type=Path, help="render the generated sections of PATH in place")
    namespace = parser.parse_args(argv)
    if namespace.markdown:
        sys.stdout.write(render_markdown())
        return 0
    path: Path = namespace.update
    text = path.read_text(encoding="utf-8")
    updated = update_docs(text)
    if updated != text:
        path.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
