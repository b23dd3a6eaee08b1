"""One JSON record per conversation, metric and version, keyed by conversation id: for warehouses and replays."""

from __future__ import annotations

import json
import threading

from ..judgement import Judgement
from ..results import result_record
from ._kafka_writer import KafkaWriter


class ResultsTopic:
    def __init__(self, writer: KafkaWriter, *, transcript: bool = False) -> None:
        self.writer = writer
        self.transcript = transcript  # --results-transcript: the turns as judged go with each record

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        """Returns the deliveries: the consumer commits the conversation only once the broker has them all."""
        key = judgement.job.conversation_id.encode("utf-8", "surrogatepass")
        deliveries = []
        records = [result_record(judgement, r, transcript=self.transcript) for r in judgement.results]
        records += [
            result_record(judgement, r, shadow=True, transcript=self.transcript) for r in judgement.shadow_results
        ]
        for record in records:
            value = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
            deliveries.append(self.writer.write(key, value))
        return deliveries
