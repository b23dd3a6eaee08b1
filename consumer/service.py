"""The consumer service: the assembler (spans → durable conversations → the judge queue) and the judge worker (the
judge queue → judges → outputs), each on its own thread with its own Kafka clients; `--role` runs one or both.

Thread ownership: the stream thread (`run()`'s caller) owns the assembler's clients; the judge thread owns the
judge worker's; the judge pool's event loop runs on a third; rebalance callbacks run on kafka-python's IO thread
while the owning thread waits in `poll()`. Library code: registry, judges and sinks come in as arguments.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tracejudge._shared.text import counted
from tracejudge.metrics import HolisticJudgeMetric
from tracejudge.metrics.batch import BatchCoordinator
from tracejudge.metrics.tiers import TIER_BATCH

from ._errors import EXIT_UNAVAILABLE, KafkaUnreachable
from .emit.delivery import Delivery, JudgementSink
from .emit.prometheus import ConsumerInstruments, family_total
from .judging.feedback import FeedbackJoiner
from .judging.judgement import OUTCOMES
from .judging.pool import JudgePool
from .judging.retries import RetryPolicy, step_delays

if TYPE_CHECKING:
    from .judging.canary import Canary
from .judging.sampling import Sampler
from .kafka import KafkaAdminClient, KafkaClients, TopicPartition
from .kafka.connect import reaching_kafka
from .kafka.membership import PartitionlessMember
from .kafka.topics import (
    JUDGE_RETRY_STEPS,
    RESULTS,
    InternalTopics,
    TopicLayout,
    ensure,
    ensure_internal_topics,
    ensure_topics,
    partitions_of,
)
from .settings import Settings
from .streams.assembler import Assembler
from .streams.batch_store import KafkaBatchStore, batches_topic_spec
from .streams.instruments import StreamsInstruments
from .streams.judge_worker import JudgeWorker

logger = logging.getLogger("tracejudge.consumer")
LAG_INTERVAL_S = 0.5
# A member joined without a partition of its topic for this long (in one generation) is told so: longer than the
# second round of a cooperative rebalance, in which partitions another member gave up reach a newcomer.
PARTITIONLESS_NOTICE_S = 10.0

__all__ = ["EXIT_UNAVAILABLE", "ConsumerService", "JudgementSink", "KafkaUnreachable"]


def outcome_summary(prometheus: ConsumerInstruments) -> str:
    """This run's conversations by outcome, read from tracejudge_sessions_total: the log says what /metrics says."""
    count = {o: int(family_total(prometheus.registry, "tracejudge_sessions", outcome=o)) for o in OUTCOMES}
    return (
        f"{counted(count['judged'], 'conversation')} judged, {count['failed']} failed, "
        f"{count['sampled_out']} sampled out, "
        f"{count['skipped_budget']} skipped for budget in this run"
    )


class ConsumerService:
    """Runs until `request_stop()`."""

    def __init__(
        self,
        settings: Settings,
        judges: Sequence[HolisticJudgeMetric],
        prometheus: ConsumerInstruments,
        *,
        sinks: Sequence[JudgementSink] = (),
        consumer_factory: Callable[..., Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
        shadow_judges: Sequence[HolisticJudgeMetric] = (),
        canary_items: Sequence[Any] = (),
    ) -> None:
        self.settings = settings
        self.prometheus = prometheus
        self.clients = KafkaClients.from_settings(
            settings, consumer_factory=consumer_factory, producer_factory=producer_factory
        )
        self.consumer_factory = self.clients.consumer_factory
        self.producer_factory = self.clients.producer_factory
        self.feedback = FeedbackJoiner(prometheus.record_agreement)
        self.sampler = Sampler(settings.sample_rate, settings.agent_sample_rates)
        self._connected = False
        self.delivery = Delivery(
            prometheus,
            sinks,
            feedback=self.feedback,
            retries=RetryPolicy(settings.judge_retry_horizon, settings.judge_retry_backoff),
        )
        self.pool = JudgePool(
            judges,
            self.delivery.judged,
            max_concurrency=settings.judge_concurrency(len(judges)),
            max_requests_per_minute=settings.max_requests_per_minute,
            max_cost_per_hour=settings.max_cost_per_hour,
            shadow_judges=shadow_judges,
            shadow_sample_rate=settings.shadow_sample_rate,
            shadow_budget_share=settings.shadow_budget_share,
        )
        self.canary_items = list(canary_items)
        self.canary: Canary | None = None
        prometheus.record_judges(self.pool.judges)  # tracejudge_judge_info: whoever builds the service
        self.instruments = StreamsInstruments(prometheus.registry)
        self.topics = InternalTopics(settings.group_id)
        self.topic_layout = TopicLayout(settings.replication_factor, settings.internal_topic_config)
        self.assembler: Assembler | None = None
        self.judge_worker: JudgeWorker | None = None
        self.batch_store: KafkaBatchStore | None = None
        self._stop = threading.Event()
        self._judge_thread: threading.Thread | None = None
        self.stop_deadline: float | None = None  # set when the shutdown starts: the end of the grace period
        self.ready = threading.Event()  # the clients are built and subscribed (tests wait for it)
        self.assigned = threading.Event()  # partitions assigned and their state restored
        self.failure: BaseException | None = None
        self.hurried = False  # a second stop signal came: the process leaves without finishing what runs
        self._partitionless: PartitionlessMember | None = None
        self.partitions = 0  # the span topic's (and the internal topics') partition count, once connected

    def fail(self, exc: BaseException) -> None:
        """A thread the service depends on died (the notifier's): stop, and exit saying why, as for the judge
        thread's failure. Thread-safe; the first failure is the one reported."""
        if self.failure is None:
            self.failure = exc
        self.request_stop()

    def request_stop(self) -> None:
        """Thread- and signal-safe."""
        self._stop.set()
        if self.assembler is not None:
            self.assembler.request_stop()

    def hurry(self) -> None:
        """A second stop signal: in-flight judgements are given up now (cancelled, their offsets not committed: they
        are judged again after the restart). What is finished is still committed. Signal-safe."""
        self.hurried = True
        self.request_stop()
        if self.judge_worker is not None:
            self.judge_worker.hurry()

    def draining(self) -> str:
        """What a stop waits for, in words (read from a signal handler: counters only)."""
        in_flight, awaiting = self.pool.in_flight, self.delivery.awaiting
        return f"{counted(in_flight, 'judgement')} in flight, {counted(awaiting, 'output')} awaiting acknowledgement"

    # -- setup -----------------------------------------------------------------------------------------------------

    def _select(self, job: Any) -> bool:
        if not self.sampler.should_judge(job):
            return False
        self.prometheus.record_submitted()  # TracejudgeJudgeStalled: submitted, and neither verdicts nor errors
        return True

    def _partitions(self) -> int:
        probe = self.clients.consumer("tracejudge-metadata")
        try:
            return partitions_of(probe, self.settings.topic)
        finally:
            probe.close()

    @contextmanager
    def _admin(self) -> Iterator[KafkaAdminClient]:
        """An admin client with the user's Kafka options, closed afterwards (internal topics are created with it)."""
        with self.clients.admin() as admin:
            yield admin

    def _ensure_topics(self, partitions: int) -> None:
        with self._admin() as admin:
            ensure_internal_topics(admin, self.topics, partitions, self.topic_layout)
            # The retry topics of this backoff's steps, and `<group>-results` (the default): under the same policy
            needed = [topic for topic in (*JUDGE_RETRY_STEPS, RESULTS) if topic.needed(self.settings)]
            if needed:
                ensure(admin, needed, self.settings.group_id, self.topic_layout, partitions)

    # -- run -------------------------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect, create the internal topics and subscribe (the groups are joined by the first polls). Raises
        KafkaUnreachable when the brokers do not answer within `bootstrap_timeout_ms`."""
        if self._connected:
            return
        settings = self.settings
        with reaching_kafka(settings.bootstrap_servers, settings.consumer_config()):
            self._open(settings)
        self._connected = True
        topic = self.settings.topic if self.assembler is not None else self.topics.judge_queue
        self._partitionless = PartitionlessMember(topic, PARTITIONLESS_NOTICE_S)
        if self.assembler is not None:
            self._announce_join(self.assembler.group)

    def _open(self, settings: Settings) -> None:
        partitions = self.partitions = self._partitions()
        self._ensure_topics(partitions)
        if settings.role in ("all", "judge"):
            self._open_batch_store()
            self.judge_worker = JudgeWorker(
                settings,
                self.pool,
                self.delivery,
                self.prometheus,
                self.instruments,
                partitions=partitions,
                feedback=self.feedback,
                clients=self.clients,
            )
            self.judge_worker.retries.steps = step_delays(settings.judge_retry_backoff)  # before `open`: its topics
            self.judge_worker.open()
            self.pool.start()
            self._start_canary(self.judge_worker)
            self._judge_thread = threading.Thread(target=self._judge_loop, name="tracejudge-judge-worker", daemon=True)
            self._judge_thread.start()
        if settings.role in ("all", "assemble"):
            self.assembler = Assembler(
                settings,
                self.prometheus,
                self.instruments,
                self._select,
                partitions=partitions,
                clients=self.clients,
            )
            self.assembler.open()

    def _start_canary(self, worker: JudgeWorker) -> None:
        """With --canary-interval: the canary thread; it runs only while this worker owns judge-queue partition 0."""
        settings = self.settings
        if settings.canary_interval is None or not self.canary_items:
            return
        from .judging.canary import BATCH_RUN_TIMEOUT_S, RUN_TIMEOUT_S, Canary, calibration_accuracies

        floors = calibration_accuracies(settings.calibration)
        if settings.canary_accuracy_floor is not None:
            floors = {judge.name: settings.canary_accuracy_floor for judge in self.pool.judges}
        self.canary = Canary(
            settings.canary_interval,
            self.canary_items,
            self.pool.judges,
            self.pool,
            self.prometheus,
            lambda: 0 in worker.assigned and not worker.stopping,
            floors=floors,
            margin=settings.canary_margin,
            timeout_s=BATCH_RUN_TIMEOUT_S if settings.judge_tier == TIER_BATCH else RUN_TIMEOUT_S,
        ).start()

    def _open_batch_store(self) -> None:
        """--judge-tier batch: the durable batch records, read to the end and followed, handed to each model's
        coordinator before its first call (which waits for them)."""
        coordinators = {}
        for judge in [*self.pool.judges, *self.pool.shadow_judges]:  # the shadow's batches are paid for too
            coordinator = getattr(judge.backend, "coordinator", None)
            if isinstance(coordinator, BatchCoordinator):
                coordinators[id(coordinator)] = coordinator
        if not coordinators:
            return
        with self._admin() as admin:
            ensure_topics(admin, [batches_topic_spec(self.settings.group_id)], self.topic_layout)
        store = KafkaBatchStore(self.settings, self.clients)
        self.batch_store = store
        for coordinator in coordinators.values():
            coordinator.on_event = self.prometheus.record_batch_event
            store.follow(coordinator.learn)
            coordinator.attach_store(store)

    def run(self) -> None:
        self.connect()
        settings = self.settings
        logger.info(
            "consuming %r as group %r from %s (role %s; internal topics %s)",
            settings.topic,
            settings.group_id,
            settings.bootstrap_servers,
            settings.role,
            ", ".join(self.topics.all()),
        )
        self.ready.set()
        try:
            if self.assembler is not None:
                try:
                    self._assemble_loop(self.assembler)
                except Exception as exc:  # as the judge thread: the process stops and says why
                    logger.exception("the assembler failed; stopping (records since the last commit are read again)")
                    self.failure = exc
            else:
                while not self._stop.wait(0.2):
                    self._note_assigned()
        finally:
            self._shutdown()

    def _announce_join(self, consumer: Any) -> None:
        """Say before the (possibly long) group join what a new group means: records produced before its partitions
        are assigned are skipped under --start-from latest. "ready" follows once partitions are assigned."""
        settings = self.settings
        where = f"topic {settings.topic!r} as group {settings.group_id!r} on {settings.bootstrap_servers}"
        committed = self._group_has_commits(consumer)
        if committed is False and settings.start_from == "latest":
            logger.warning(
                "joining %s: the group has no committed offsets, so it starts at the end of the topic. Joining can "
                "take a while (~20 s on some brokers); records produced before its partitions are assigned are "
                'skipped with --start-from latest (use --start-from earliest to read them). "ready" follows once '
                "partitions are assigned",
                where,
            )
        elif committed is False:
            logger.info(
                "joining %s: the group has no committed offsets; it reads the topic from the beginning once its "
                "partitions are assigned (joining can take a while, ~20 s on some brokers)",
                where,
            )
        else:
            logger.info('joining %s; "ready" follows once partitions are assigned', where)

    def _group_has_commits(self, consumer: Any) -> bool | None:
        """Whether the group committed an offset on any partition of the topic; None when that cannot be told."""
        try:
            partitions = sorted(consumer.partitions_for_topic(self.settings.topic) or ())
            for partition in partitions:
                if consumer.committed(TopicPartition(self.settings.topic, partition), timeout_ms=5_000) is not None:
                    return True
            return False if partitions else None  # no such topic (yet): nothing to say about its offsets
        except Exception as exc:
            logger.debug("could not read the group's committed offsets: %r", exc)
            return None

    def _note_partitionless(self) -> None:
        """Say once (per stretch without partitions) that this replica joined its group but got no partition: with
        as many members as partitions, a replica more stands by, and only more partitions spread the work."""
        if self._partitionless is None:
            return
        if self.assembler is not None:
            consumer, group, topic = self.assembler.group, self.settings.group_id, self.settings.topic
        elif self.judge_worker is not None:
            consumer, group, topic = self.judge_worker.consumer, self.judge_worker.group_id, self.topics.judge_queue
        else:
            return
        if consumer is None or not self._partitionless.check(consumer, time.monotonic()):
            return
        count = self.partitions
        logger.warning(
            "no partition for this replica: topic %r has %d partition%s and the other members of group %r own %s, so "
            "this replica stands by (it takes over when one leaves); nothing is read or judged here meanwhile. "
            "Replicas beyond the partition count add no throughput: to spread the work over more replicas, give the "
            "span topic more partitions and start them under a new --group-id (this group's internal topics keep %d; "
            "docs/state.md#scaling-each-stage)",
            topic,
            count,
            "" if count == 1 else "s",
            group,
            "it" if count == 1 else "them",
            count,
        )

    def _note_assigned(self) -> None:
        self._note_partitionless()
        if self.assigned.is_set():
            return
        assembled = self.assembler is None or self.assembler.assigned.is_set()
        judging = self.judge_worker is None or self.judge_worker.joined.is_set()
        if assembled and judging:
            self.assigned.set()
            owned = sorted(self.assembler.tasks) if self.assembler is not None else []
            judged = sorted(self.judge_worker.assigned) if self.judge_worker is not None else []
            logger.info(
                "ready: consuming partitions %s (state restored; judging judge-queue partitions %s)", owned, judged
            )

    def _assemble_loop(self, assembler: Assembler) -> None:
        last_commit = last_lag = time.monotonic()
        while not self._stop.is_set():
            assembler.step()
            self._note_assigned()
            now = time.monotonic()
            if now - last_commit >= self.settings.commit_interval:
                assembler.commit()
                last_commit = now
            lag = now - last_lag >= LAG_INTERVAL_S
            assembler.update_gauges(lag=lag)
            if lag:
                last_lag = now

    def _judge_loop(self) -> None:
        worker = self.judge_worker
        assert worker is not None
        last_commit = last_lag = time.monotonic()
        try:
            while not self._stop.is_set():
                worker.step()
                now = time.monotonic()
                if now - last_commit >= self.settings.commit_interval:
                    worker.commit()
                    last_commit = now
                lag = now - last_lag >= LAG_INTERVAL_S
                worker.update_gauges(lag=lag)
                if lag:
                    last_lag = now
        except Exception as exc:  # the judge thread never dies in silence: the process stops and says why
            logger.exception("the judge worker failed; stopping")
            self.failure = exc
            self.request_stop()

    def _shutdown(self) -> None:
        """Everything within `--shutdown-grace`: the assembler commits its state, judgements in flight finish and
        their results land; what is not durable by the deadline stays uncommitted (and is judged again later)."""
        grace = self.settings.shutdown_grace
        grace_end = self.stop_deadline = time.monotonic() + grace
        self._stop.set()
        if self.assembler is not None:
            self.assembler.close(grace)
        if self.canary is not None:
            self.canary.stop(1.0)  # a run under way ends when the pool stops (its calls are cancelled)
        if self._judge_thread is not None:
            self._judge_thread.join(grace)
        if self.judge_worker is not None:
            if not self.judge_worker.close(max(0.5, grace_end - time.monotonic())):
                if self.judge_worker.hurried:
                    logger.warning("judgements still running at the second stop signal are left uncommitted")
                else:
                    logger.warning("judgements still running after the %.0fs grace period are left uncommitted", grace)
        if self.batch_store is not None:
            self.batch_store.close()
        logger.info("stopped: %s", outcome_summary(self.prometheus))

    # -- introspection for tests and benchmarks --------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """What the state tables dropped, cut or de-duplicated, summed over this process's partitions."""
        total: dict[str, int] = {}
        for task in self.assembler.tasks.values() if self.assembler is not None else ():
            for key, count in task.table.counts.items():
                total[key] = total.get(key, 0) + count
        return total

    def conversation(self, conversation_id: str) -> Any:
        """The conversation's state in this process (a ConversationState), or None."""
        for task in self.assembler.tasks.values() if self.assembler is not None else ():
            state = task.table.get(conversation_id)
            if state is not None:
                return state
        return None

    def open_conversations(self) -> int:
        if self.assembler is None:
            return 0
        return sum(task.table.open_count for task in self.assembler.tasks.values())
