"""The work-arounds only the embedded broker (Tansu) needs run only there, both sides: on Tansu the quirk is real
and the work-around answers right; a cluster that reports another id never takes the Tansu path."""

from __future__ import annotations

import uuid
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.kafka import KafkaClients
from tracejudge.consumer.kafka.highwater import HighwaterProbe
from tracejudge.consumer.kafka.membership import CompletedJoinKeeper, guard_membership
from tracejudge.consumer.kafka.quirks import cluster_id, is_tansu

RECORDS = 50


def _filled(broker: EmbeddedBroker) -> TopicPartition:
    topic = f"q-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for i in range(RECORDS):
        producer.send(topic, value=str(i).encode(), partition=0)
    producer.flush()
    producer.close()
    return TopicPartition(topic, 0)


def test_tansu_is_told_by_its_cluster_id(broker: EmbeddedBroker) -> None:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        assert cluster_id(consumer) == "tansu_cluster" and is_tansu(consumer)
    finally:
        consumer.close()


def test_on_tansu_list_offsets_is_wrong_and_the_probe_reads_a_fetch(broker: EmbeddedBroker) -> None:
    """Without the fetch path the lag probe would read Tansu's ListOffsets answer, which is not the end."""
    tp = _filled(broker)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        listed = consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()
    assert listed != RECORDS, f"Tansu answered ListOffsets right ({listed}): the fetch path may no longer be needed"
    probe = HighwaterProbe(KafkaClients(broker.bootstrap_servers))
    try:
        assert probe.highwaters({tp: 0}, timeout_ms=2_000) == {tp: RECORDS}
    finally:
        probe.close()


class _Cluster:
    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id


class _OtherBrokerConsumer:
    """A consumer whose brokers say they are another cluster: only ListOffsets may be asked."""

    def __init__(self, **_: Any) -> None:
        self._client = type("Client", (), {"cluster": _Cluster("kafka-prod-eu1")})()
        self.asked: list[list[TopicPartition]] = []

    def end_offsets(self, partitions: list[TopicPartition], timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        assert timeout_ms is not None and timeout_ms <= 1000, "the judge thread's probe waits a bounded time"
        self.asked.append(partitions)
        return {tp: 7 for tp in partitions}

    def assign(self, partitions: Any) -> None:
        raise AssertionError("the fetch path (Tansu's) was taken on another cluster")

    def close(self, **_: Any) -> None:
        pass


def test_on_another_cluster_the_probe_asks_list_offsets_and_never_fetches() -> None:
    made: list[_OtherBrokerConsumer] = []

    def factory(**config: Any) -> _OtherBrokerConsumer:
        made.append(_OtherBrokerConsumer(**config))
        return made[-1]

    probe = HighwaterProbe(KafkaClients("127.0.0.1:1", consumer_factory=factory))
    tp = TopicPartition("judge-queue", 3)
    assert probe.highwaters({tp: 2}) == {tp: 7}
    assert made[0].asked == [[tp]]


def test_on_another_cluster_the_orphaned_leader_guard_is_not_installed(broker: EmbeddedBroker) -> None:
    """The guard's DescribeGroups (and, in a race, its LeaveGroup) never reach a real cluster; the keeper of
    kafka-python's dropped joins is installed on every broker."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=f"g-{uuid.uuid4().hex[:6]}")
    try:
        coordinator = consumer._coordinator
        original_join = coordinator._do_join_and_sync_async
        consumer._client.cluster.cluster_id = "kafka-prod-eu1"
        assert guard_membership(consumer) is None
        keeper = coordinator._do_join_and_sync_async.__self__
        assert isinstance(keeper, CompletedJoinKeeper) and keeper._join_and_sync == original_join
    finally:
        consumer.close()


def test_on_tansu_both_membership_work_arounds_are_installed(broker: EmbeddedBroker) -> None:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=f"g-{uuid.uuid4().hex[:6]}")
    try:
        assert guard_membership(consumer) is not None
        assert isinstance(consumer._coordinator._do_join_and_sync_async.__self__, CompletedJoinKeeper)
    finally:
        consumer.close()


def test_a_replaced_producer_closes_now_and_fails_what_it_held() -> None:
    """Without `close_now`, kafka-python's close(timeout=0) raises while a send is in flight and leaves the producer's
    thread and sockets alive, its send neither failed nor delivered (until delivery_timeout_ms, 120 s)."""
    from tracejudge.consumer.kafka.clients import close_now

    own = EmbeddedBroker().start()
    try:
        own.create_topic("held", 1)
        producer = KafkaProducer(bootstrap_servers=own.bootstrap_servers, acks="all", linger_ms=5)
        producer.send("held", b"warm").get(30)
        own.stop()
        future = producer.send("held", b"in flight")
        close_now(producer)
        assert not producer._sender.is_alive() and producer._closed
        assert future.is_done and future.failed()  # its errback ran: its owner sends it again
    finally:
        own.stop()
