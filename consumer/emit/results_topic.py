"""One JSON record per conversation, metric and version, keyed by conversation id: for warehouses and replays."""

from __future__ import annotations

import json
import threading

from ..judgement import Judgement
from ..results import result_record
from ._kafka_writer import KafkaWriter


class ResultsTopic:
    def __init__(self, writer: KafkaWriter) -> None:
        self.writer = writer

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        """Returns the deliveries: the consumer commits the conversation only once the broker has them all."""
        key = judgement.job.conversation_id.encode("utf-8", "surrogatepass")
        deliveries = []
        records = [result_record(judgement, result) for result in judgement.results]
        records += [result_record(judgement, result, shadow=True) for result in judgement.shadow_results]
        for record in records:
            value = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
            deliveries.append(self.writer.write(key, value))
        return deliveries
