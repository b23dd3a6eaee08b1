"""Fresh high watermarks: what a partition holds now, not what the last fetch of a busy or paused consumer said.

A consumer's `highwater(tp)` is the value from its last fetch response. It goes stale whenever that consumer does not
fetch: the partition is paused, the group is rebalancing, or the thread that polls was busy (a commit, a restore).
Taken as "caught up", a stale value lets wall time run past records that are already in the partition. The probe is
a consumer of its own that fetches one small batch at the caller's positions (Tansu answers ListOffsets wrongly, and a
fetch is what clients trust) and reports only the high watermarks from responses to this very fetch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition


class HighwaterProbe:
    def __init__(self, factory: Callable[..., KafkaConsumer], bootstrap_servers: str, config: Mapping[str, Any]):
        self._factory = factory
        self._bootstrap = bootstrap_servers
        self._config = {k: v for k, v in config.items() if k not in ("group_id", "group_instance_id")}
        self._consumer: KafkaConsumer | None = None

    def highwaters(
        self, positions: Mapping[TopicPartition, int], *, timeout_ms: int = 200
    ) -> dict[TopicPartition, int]:
        """The high watermark of each partition as of now (those whose fetch did not answer in time are left out)."""
        if not positions:
            return {}
        if self._consumer is None:
            self._consumer = self._factory(
                bootstrap_servers=self._bootstrap,
                client_id="tracejudge-highwater-probe",
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=0,  # answer at once: the high watermark is what is wanted, not records
                fetch_max_bytes=4096,
                max_partition_fetch_bytes=4096,
                **self._config,
            )
        consumer = self._consumer
        consumer.assign([])  # fresh partition states: a high watermark read below came from this fetch
        consumer.assign(list(positions))
        for tp, position in positions.items():
            consumer.seek(tp, max(0, position))
        consumer.poll(timeout_ms=timeout_ms, max_records=1)
        found = {}
        for tp in positions:
            end = consumer.highwater(tp)
            if end is not None:
                found[tp] = end
        return found

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None
