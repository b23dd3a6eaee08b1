"""`with conversation(id):` only stamps: one block per web request, served by any number of processes.

Leaving a block ends nothing unless asked (`end=True`, `end_conversation()`), and no per-process turn counter is
written: the consumer orders a conversation's turns by span start time and completes it by idle timeout when no end
marker comes. Checked on the spans, through the consumer's own assembly (decode → adapters → ConversationStore),
and end to end through Tansu, the consumer and a judge over HTTP.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support import assembly
from tests.support.judge_server import JudgeServer, conversation_text, verdict
from tests.support.pipeline import RunningConsumer, consumer_settings, wait_for
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.tracer import ConversationSpanProcessor, conversation, end_conversation, setup_tracing, traced_agent

TURNS = 6
ENDED = "tracejudge.conversation.ended"
INDEX = "tracejudge.turn.index"


class Process:
    """One web worker: its own TracerProvider (as another process would have), recording what it exports."""

    def __init__(self, name: str) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(ConversationSpanProcessor())
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.instrumentation = self.provider.get_tracer(f"opentelemetry.instrumentation.openai_v2.{name}")

        @traced_agent("web-bot", session_id_arg=None, tracer_provider=self.provider)
        def agent(question: str) -> str:
            return f"answer to {question}"

        self.agent = agent

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


def chat(tracer: Any, question: str) -> None:
    """What an instrumentation library records for one LLM call: no session concept of its own."""
    with tracer.start_as_current_span(
        "chat gpt-4o",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": question}]}]),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": f"answer to {question}"}]}]
            ),
        },
    ):
        pass


def request(process: Process, conversation_id: str, question: str, *, traced: bool = False, **block: Any) -> None:
    """One web request serving one turn, the README's pattern: one `with conversation(id):` block."""
    with conversation(conversation_id, agent="web-bot", tracer_provider=process.provider, **block):
        if traced:
            process.agent(question)
        else:
            chat(process.instrumentation, question)


def serve(conversation_id: str, *, traced: bool = False) -> list[Process]:
    """TURNS requests of one conversation, alternating between two processes."""
    processes = [Process("a"), Process("b")]
    for turn in range(TURNS):
        request(processes[turn % 2], conversation_id, f"question {turn}", traced=traced)
    return processes


def assemble(records: list[list[ReadableSpan]], idle_timeout_s: float = 300.0) -> tuple[list[JudgeJob], list[JudgeJob]]:
    """The consumer's assembly of these Kafka records in this order: (completed on arrival, after the idle timeout)."""
    return assembly.assemble([encode_spans(spans).SerializeToString() for spans in records], idle_timeout_s)


def questions(job: JudgeJob) -> list[str | None]:
    return [t.input for t in job.exchanges]


@pytest.mark.parametrize("traced", [False, True], ids=["instrumentation-only", "traced_agent"])
def test_one_block_per_request_from_two_processes_ends_nothing_and_counts_nothing(traced: bool) -> None:
    a, b = serve("web-1", traced=traced)
    spans = a.spans() + b.spans()
    assert len(spans) == TURNS  # no end marker span...
    assert all(dict(s.attributes or {})["gen_ai.conversation.id"] == "web-1" for s in spans)
    assert not [s for s in spans if ENDED in (s.attributes or {})]  # ...and no turn marked as ending it
    assert not [s for s in spans if INDEX in (s.attributes or {})]  # no per-process counter: nothing to collide

    # The consumer gets process b's record before process a's: start times order the turns, idleness completes it.
    on_arrival, after_idle = assemble([b.spans(), a.spans()])
    assert on_arrival == []  # not judged after every turn
    (job,) = after_idle
    assert job.completed_by == "idle_timeout" and job.version == TURNS
    assert questions(job) == [f"question {t}" for t in range(TURNS)]
    assert [t.output for t in job.exchanges] == [f"answer to question {t}" for t in range(TURNS)]


def test_caller_given_turn_indexes_never_collide_across_processes() -> None:
    processes = [Process("a"), Process("b")]
    for turn in range(TURNS):
        request(processes[turn % 2], "web-idx", f"question {turn}", turn_index=turn)
    a, b = processes
    by_question = {
        json.loads(str(s.attributes["gen_ai.input.messages"]))[0]["parts"][0]["content"]: s.attributes[INDEX]
        for s in a.spans() + b.spans()
        if s.attributes
    }
    assert by_question == {f"question {t}": t for t in range(TURNS)}
    _, (job,) = assemble([b.spans(), a.spans()])
    assert [t.index for t in job.exchanges] == list(range(TURNS)) and job.version == TURNS


def test_a_bad_turn_index_is_dropped_and_said(caplog: pytest.LogCaptureFixture) -> None:
    process = Process("a")
    caplog.set_level(logging.WARNING, logger="tracejudge.tracer")
    for bad in (-1, "3", True):
        request(process, "web-bad", "question", turn_index=bad)
    assert not [s for s in process.spans() if INDEX in (s.attributes or {})]
    assert any("turn_index=-1" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("how", ["end=True", "end_conversation()", "end_conversation(id)"])
def test_ending_is_asked_for_explicitly(how: str) -> None:
    processes = [Process("a"), Process("b")]
    for turn in range(TURNS):
        process = processes[turn % 2]
        last = turn == TURNS - 1
        with conversation("web-end", agent="web-bot", end=last and how == "end=True", tracer_provider=process.provider):
            chat(process.instrumentation, f"question {turn}")
            if last and how == "end_conversation()":
                end_conversation()  # the block's conversation, agent and provider
            if last and how == "end_conversation(id)":
                end_conversation("web-end", agent="web-bot", tracer_provider=process.provider)
    a, b = processes
    markers = [s for s in a.spans() + b.spans() if s.name == "end_conversation"]
    assert len(markers) == 1
    assert dict(markers[0].attributes or {}) == {
        "gen_ai.conversation.id": "web-end",
        "gen_ai.agent.name": "web-bot",
        ENDED: True,
    }
    assert markers[0] in b.spans()  # the process that served the last turn said it
    on_arrival, _ = assemble([a.spans(), b.spans()])
    (job,) = on_arrival
    assert job.completed_by == "end_marker" and job.version == TURNS
    assert questions(job) == [f"question {t}" for t in range(TURNS)]


def test_end_conversation_without_an_id_outside_a_block_ends_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process = Process("a")
    caplog.set_level(logging.WARNING, logger="tracejudge.tracer")
    with conversation("web-x", tracer_provider=process.provider):
        pass
    end_conversation(tracer_provider=process.provider)  # never raises
    assert process.spans() == []
    assert any("end_conversation() without an id" in r.getMessage() for r in caplog.records)


def test_an_exception_in_a_block_ends_only_when_asked() -> None:
    process = Process("a")
    with pytest.raises(KeyError):
        with conversation("web-err", tracer_provider=process.provider):
            raise KeyError("the request failed")
    assert process.spans() == []
    with pytest.raises(KeyError):
        with conversation("web-err", end=True, tracer_provider=process.provider):
            raise KeyError("the last request failed")
    assert [s.name for s in process.spans()] == ["end_conversation"]


class Collect:
    def __init__(self) -> None:
        self.judgements: list[Judgement] = []
        self.lock = threading.Lock()

    def emit(self, judgement: Judgement) -> None:
        with self.lock:
            self.judgements.append(judgement)

    def jobs(self) -> dict[str, JudgeJob]:
        with self.lock:
            return {j.job.conversation_id: j.job for j in self.judgements}


def test_web_requests_from_two_processes_are_judged_once_as_one_conversation_end_to_end(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer
) -> None:
    """Two `setup_tracing` providers (two web workers) → Tansu → the consumer → one judge call per conversation."""
    judge_server.responder = lambda request: verdict("honest_fallback")
    workers = [
        setup_tracing(
            f"web-{name}",
            kafka_bootstrap_servers=broker.bootstrap_servers,
            topic=topic,
            set_global=False,
            schedule_delay_millis=600_000,  # nothing leaves before force_flush: the test decides the arrival order
        )
        for name in ("a", "b")
    ]
    tracers = [w.get_tracer("opentelemetry.instrumentation.openai_v2") for w in workers]
    for turn in range(TURNS):  # idle: no end marker ever comes
        with conversation("e2e-idle", agent="web-bot", tracer_provider=workers[turn % 2]):
            chat(tracers[turn % 2], f"idle question {turn}")
    for turn in range(3):  # ended: the last request asks for it
        with conversation("e2e-ended", agent="web-bot", end=turn == 2, tracer_provider=workers[turn % 2]):
            chat(tracers[turn % 2], f"ended question {turn}")
    collect = Collect()
    settings = consumer_settings(broker.bootstrap_servers, topic, session_idle_timeout=1.5, metrics="failure_rate")
    with RunningConsumer(settings, extra_sinks=[collect]) as consumer:
        assert workers[1].force_flush(10_000) and workers[0].force_flush(10_000)  # later turns arrive first
        wait_for(lambda: consumer.sessions("judged") >= 2, what="both conversations judged")
        jobs = collect.jobs()
        assert consumer.sessions("judged") == 2 and len(judge_server.requests) == 2  # once each, not once per turn
    idle, ended = jobs["e2e-idle"], jobs["e2e-ended"]
    assert idle.completed_by == "idle_timeout" and idle.version == TURNS
    assert questions(idle) == [f"idle question {t}" for t in range(TURNS)]
    assert ended.completed_by == "end_marker" and ended.version == 3
    assert questions(ended) == [f"ended question {t}" for t in range(3)]
    sent = next(conversation_text(r) for r in judge_server.requests if "idle question 0" in conversation_text(r))
    positions = [sent.index(f"idle question {t}") for t in range(TURNS)]
    assert positions == sorted(positions)  # the judge read the turns in order
    for worker in workers:
        worker.shutdown()
