"""Judge faults at 30%: 429 with Retry-After, 500, timeouts, hung connections, garbage, unknown labels, empty bodies.
Every conversation ends judged or counted as failed with a reason; the counts add up; no score is made up."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import defaultdict

import pytest

from tests.consumer.test_pipeline import Collect
from tests.support.judge_server import FAULTS, JudgeServer, Reply, conversation_text, fault_reply
from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.prometheus import family_total

CONVERSATIONS = 120
LABELS = ["hallucination", "stall", "mixed", "honest_fallback", "alternative_proposed", "not_applicable"]


class FaultyJudge:
    """30% of requests fail in one of seven ways (seeded); the rest answer a label chosen per conversation."""

    def __init__(self, seed: int = 7) -> None:
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.answered: dict[str, set[str]] = defaultdict(set)
        self.faults: dict[str, int] = defaultdict(int)

    def __call__(self, request: dict) -> Reply:
        text = conversation_text(request)
        found = re.search(r"faulty-\d+", text)
        conversation = found.group(0) if found else "unknown"
        with self.lock:
            roll = self.random.random()
            fault = self.random.choice(FAULTS)
            label = self.random.choice(LABELS)
        if roll < 0.3:
            with self.lock:
                self.faults[fault] += 1
            return fault_reply(fault, label)
        with self.lock:
            self.answered[conversation].add(label)
        return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "ok"}))


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_judge_faults_are_counted_never_scored(broker: EmbeddedBroker, topic: str, judge_server: JudgeServer) -> None:
    faulty = FaultyJudge()
    judge_server.responder = faulty
    collect = Collect()
    provider = traced_app(broker.bootstrap_servers, topic)
    settings = consumer_settings(
        broker.bootstrap_servers, topic, metrics="failure_rate", judge_timeout=1.0, judge_retries=2, max_concurrency=4
    )
    started = time.monotonic()
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        play(provider, {f"faulty-{i}": [(f"faulty-{i} question", "answer")] for i in range(CONVERSATIONS)})
        wait_for(lambda: consumer.sessions() == CONVERSATIONS, timeout=240, what="every conversation accounted")
        judged, failed = consumer.sessions("judged"), consumer.sessions("failed")
        errors = family_total(consumer.app.registry, "tracejudge_judge_errors")
    elapsed = time.monotonic() - started
    assert judged + failed == CONVERSATIONS
    assert failed == errors > 0
    assert sum(faulty.faults.values()) > CONVERSATIONS * 0.2
    reasons = {j.results[0].error_kind for j in collect.judgements if j.results and j.results[0].error}
    assert reasons <= {"timeout", "server_error", "rate_limited", "invalid_output"}
    for judgement in collect.judgements:
        result = judgement.results[0]
        if result.error is None:  # the verdict is one the judge really gave for this conversation
            assert result.verdict in faulty.answered[judgement.job.conversation_id]
        else:
            assert result.score is None and result.verdict is None and result.reason
        # A hung judge never holds a slot past its timeout: attempts x (timeout + backoff) bounds every call.
        assert result.latency_s < 3 * (1.0 + 2.0) + 1
    print(f"\njudge faults: {dict(faulty.faults)}; judged {judged:.0f}, failed {failed:.0f} in {elapsed:.1f}s")
    provider.shutdown()
