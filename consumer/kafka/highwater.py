"""High watermarks of partitions a consumer does not fetch (paused ones), and kafka-python's remembered one.

`HighwaterProbe` asks a consumer of its own. On a cluster that answers ListOffsets it asks for the end offsets (one
round trip). Tansu (the embedded broker) answers ListOffsets wrongly (1 for a partition holding 50 records), so
there (`quirks.is_tansu`) the probe fetches one small batch from each partition at the caller's positions and reads
the high watermark the fetch answered, waiting up to `timeout_ms` for it.

`forget_highwater`/`restore_highwater` work around kafka-python (any broker): it keeps the high watermark of the
last fetch with no way to tell whether a fetch answered since; the stream clock drops it to learn that one did."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from tracejudge._shared.rate_limited_log import RateLimitedLog

from .clients import KafkaClients
from .quirks import is_tansu

logger = logging.getLogger("tracejudge.consumer.kafka")


class HighwaterProbe:
    def __init__(self, clients: KafkaClients) -> None:
        self._clients = clients
        self._consumer: Any = None
        self._fetching = False  # Tansu: read from a fetch, not ListOffsets
        self._log = RateLimitedLog(logger, interval_s=60.0)

    def highwaters(
        self, positions: Mapping[TopicPartition, int], *, timeout_ms: int = 200
    ) -> dict[TopicPartition, int]:
        """Never raises: a lag gauge is not worth a worker. The brokers unreachable (an outage: creating the probe's
        consumer cannot bootstrap) answers nothing, said once a minute, and the next call tries again."""
        if not positions:
            return {}
        try:
            return self._highwaters(positions, timeout_ms)
        except Exception as exc:
            self._log.warning("judge-queue lag not measured: %r (the brokers unreachable? measured again later)", exc)
            if self._consumer is not None:
                try:
                    self._consumer.close(autocommit=False)
                except Exception:
                    pass
                self._consumer = None
            return {}

    def _highwaters(self, positions: Mapping[TopicPartition, int], timeout_ms: int) -> dict[TopicPartition, int]:
        if self._consumer is None:
            self._consumer = self._clients.consumer(
                "tracejudge-lag-probe", fetch_max_bytes=4096, max_partition_fetch_bytes=4096
            )
            self._fetching = is_tansu(self._consumer)
        consumer = self._consumer
        if not self._fetching:
            try:  # bounded as the fetch path is: it runs on the judge thread
                ends = consumer.end_offsets(list(positions), timeout_ms=timeout_ms)
            except KafkaTimeoutError:
                return {}  # not answered in time (a leader moving): measured again next round, the consumer kept
            return {tp: end for tp, end in ends.items() if end is not None}
        consumer.assign(list(positions))
        for tp, position in positions.items():
            consumer.seek(tp, max(0, position))
        consumer.poll(timeout_ms=timeout_ms, max_records=1)
        return {tp: end for tp in positions if (end := consumer.highwater(tp)) is not None}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None


def forget_highwater(consumer: Any, tp: TopicPartition) -> bool:
    """Drop the high watermark a consumer remembers from its last fetch of `tp`, so that the next one it reports came
    from a fetch answered after this call. False when this kafka-python keeps it elsewhere (nothing was dropped)."""
    try:
        consumer._subscription.assignment[tp].highwater = None
    except (AttributeError, KeyError, TypeError):
        return False
    return consumer.highwater(tp) is None


def restore_highwater(consumer: Any, tp: TopicPartition, highwater: int) -> bool:
    """Put back a dropped high watermark (no answer came for it); False when it cannot be."""
    try:
        state = consumer._subscription.assignment[tp]
        if state.highwater is None:
            state.highwater = highwater
    except (AttributeError, KeyError, TypeError):
        return False
    return True
