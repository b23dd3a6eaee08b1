"""One JSON record per conversation, metric and outcome, keyed by conversation id: for warehouses, replays,
`tracejudge explain`, `export` and `compare`. On by default (`<group>-results`, kafka/topics.py's RESULTS): without
it a newcomer sees counts and never a reason. With `unjudged` off, sampled-out and skipped-for-budget conversations
write nothing (a record per metric fewer for each: at a 1% sample rate, 99% of the volume)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence

from ..judging.judgement import OUTCOME_SAMPLED_OUT, OUTCOME_SKIPPED_BUDGET, Judgement
from ..judging.results import outcome_records, result_record
from ._kafka_writer import KafkaWriter

# `consume --no-results`: the one startup line that says what is given up.
NO_RESULTS_NOTICE = (
    "--no-results: no results topic is written: verdicts are only counted (Prometheus, OTLP); `tracejudge explain` "
    "shows no verdict, reason or evidence, and export, watch and rejudge have nothing to read"
)
_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps(record, ensure_ascii=False) without a new encoder each


class ResultsTopic:
    def __init__(
        self,
        writer: KafkaWriter,
        metrics: Sequence[str] = (),
        *,
        unjudged: bool = True,
        transcript: bool = False,
        keys: Mapping[str, str] | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = list(metrics)  # every metric gets a record, with its result or with the outcome alone
        self.keys = dict(keys or {})  # each metric's result key (a rubric file's version), where not its name
        self.unjudged = unjudged
        self.transcript = transcript  # --results-transcript: the turns as judged go with each record

    def emit(self, judgement: Judgement) -> list[threading.Event]:
        """Returns the deliveries: the consumer commits the conversation only once the broker has them all."""
        key = judgement.job.conversation_id.encode("utf-8", "surrogatepass")
        deliveries: list[threading.Event] = []
        if not self.unjudged and judgement.outcome in (OUTCOME_SAMPLED_OUT, OUTCOME_SKIPPED_BUDGET):
            return deliveries
        records = [result_record(judgement, result, transcript=self.transcript) for result in judgement.results]
        have = {result.name for result in judgement.results}
        records += outcome_records(judgement, [metric for metric in self.metrics if metric not in have], self.keys)
        records += [
            result_record(judgement, result, shadow=True, transcript=self.transcript)
            for result in judgement.shadow_results
        ]
        for record in records:
            value = _ENCODER.encode(record).encode("utf-8", "surrogatepass")
            deliveries.append(self.writer.write(key, value))
        return deliveries
