"""High watermarks of partitions a consumer does not fetch (paused ones): a consumer of its own fetches one small
batch from each at the caller's positions (Tansu answers ListOffsets wrongly, and a fetch is what clients trust)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from tracejudge._shared.kafka_options import construct_client
from tracejudge._shared.rate_limited_log import RateLimitedLog

logger = logging.getLogger("tracejudge.consumer.streams")


class HighwaterProbe:
    def __init__(self, factory: Callable[..., KafkaConsumer], bootstrap_servers: str, config: Mapping[str, Any]):
        self._factory = factory
        self._bootstrap = bootstrap_servers
        self._config = {k: v for k, v in config.items() if k not in ("group_id", "group_instance_id")}
        self._consumer: KafkaConsumer | None = None
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
            self._consumer = construct_client(
                self._factory,
                bootstrap_servers=self._bootstrap,
                client_id="tracejudge-lag-probe",
                group_id=None,
                enable_auto_commit=False,
                fetch_max_bytes=4096,
                max_partition_fetch_bytes=4096,
                **self._config,
            )
        consumer = self._consumer
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
