"""@traced_agent, conversation() and end_conversation() recorded through an in-memory exporter."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tracejudge.tracer import TracedAgentWarning, conversation, end_conversation, traced_agent


@pytest.fixture
def recorded() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def message_text(span: ReadableSpan, key: str) -> str:
    messages = json.loads(attrs(span)[key])
    assert len(messages) == 1
    return messages[0]["parts"][0]["content"]


def test_sync_turn_attributes(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("support", tracer_provider=provider)
    def answer(question: str, session_id: str) -> str:
        return f"echo: {question}"

    assert answer.__name__ == "answer"
    for i in range(3):
        assert answer(f"q{i}", session_id="conv-1") == f"echo: q{i}"
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["invoke_agent support"] * 3
    first = spans[0]
    assert first.kind is SpanKind.INTERNAL
    a = attrs(first)
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "support"
    assert a["gen_ai.conversation.id"] == "conv-1"
    assert json.loads(a["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": "q0"}]}]
    assert json.loads(a["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "echo: q0"}], "finish_reason": "stop"}
    ]
    # No per-process counter: another process may serve the other turns; the consumer orders by start time.
    assert all("tracejudge.turn.index" not in attrs(s) for s in spans)
    assert "tracejudge.conversation.ended" not in a


def test_session_id_positional_is_not_the_input(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    class Agent:
        @traced_agent("bot", tracer_provider=provider)
        def reply(self, session_id: str, message: str) -> str:
            return message.upper()

    Agent().reply("s-9", "hello")
    span = exporter.get_finished_spans()[0]
    assert attrs(span)["gen_ai.conversation.id"] == "s-9"
    assert message_text(span, "gen_ai.input.messages") == "hello"


def test_input_arg_and_output_callable(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("bot", input_arg="prompt", session_id_arg="sid", output=lambda r: r["text"], tracer_provider=provider)
    def run(system: str, prompt: str, sid: str) -> dict[str, str]:
        return {"text": "done"}

    run("be nice", prompt="do it", sid="x")
    span = exporter.get_finished_spans()[0]
    assert message_text(span, "gen_ai.input.messages") == "do it"
    assert message_text(span, "gen_ai.output.messages") == "done"
    assert attrs(span)["gen_ai.conversation.id"] == "x"


class _Message:
    def __init__(self, content: str) -> None:
        self.content = content


class _Choice:
    def __init__(self, content: str) -> None:
        self.message = _Message(content)


class _Completion:
    def __init__(self, content: str) -> None:
        self.choices = [_Choice(content)]


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (_Completion("from object"), "from object"),
        ({"choices": [{"message": {"role": "assistant", "content": "from dict"}}]}, "from dict"),
        ({"role": "assistant", "content": "message dict"}, "message dict"),
        (42, "42"),
    ],
)
def test_output_common_shapes(recorded: tuple[TracerProvider, InMemorySpanExporter], result: Any, text: str) -> None:
    provider, exporter = recorded

    @traced_agent("bot", tracer_provider=provider)
    def run(q: str, session_id: str = "s") -> Any:
        return result

    assert run("q") is result
    assert message_text(exporter.get_finished_spans()[0], "gen_ai.output.messages") == text


def test_fresh_id_makes_a_one_turn_conversation(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    with pytest.warns(TracedAgentWarning, match="one-turn conversation"):

        @traced_agent("bot", tracer_provider=provider)
        def run(q: str) -> str:
            return "a"

    run("one")
    run("two")
    first, second = exporter.get_finished_spans()
    assert attrs(first)["gen_ai.conversation.id"] != attrs(second)["gen_ai.conversation.id"]
    assert attrs(first)["tracejudge.conversation.ended"] is True
    assert attrs(first)["tracejudge.turn.index"] == 0


def test_exception_recorded_and_reraised_unchanged(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    class AgentBroke(RuntimeError):
        pass

    original = AgentBroke("no tool")

    @traced_agent("bot", tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        raise original

    with pytest.raises(AgentBroke) as caught:
        run("q", session_id="e")
    assert caught.value is original
    span = exporter.get_finished_spans()[0]
    assert span.status.status_code is StatusCode.ERROR
    assert attrs(span)["error.type"].endswith("test_exception_recorded_and_reraised_unchanged.<locals>.AgentBroke")
    assert [e.name for e in span.events] == ["exception"]
    assert "gen_ai.output.messages" not in attrs(span)

    @traced_agent("bot", tracer_provider=provider)
    def builtin(q: str, session_id: str = "b") -> str:
        raise ValueError("x")

    with pytest.raises(ValueError):
        builtin("q")
    assert attrs(exporter.get_finished_spans()[-1])["error.type"] == "ValueError"


async def test_async_function(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("async-bot", tracer_provider=provider)
    async def run(q: str, session_id: str) -> str:
        await asyncio.sleep(0)
        return "async answer"

    assert await run("q", session_id="a") == "async answer"
    span = exporter.get_finished_spans()[0]
    assert message_text(span, "gen_ai.output.messages") == "async answer"


def test_sync_generator_joins_chunks_and_ends_on_close(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("stream", tracer_provider=provider)
    def run(q: str, session_id: str) -> Iterator[str]:
        yield "Hel"
        yield "lo"
        yield "!"

    assert list(run("q", session_id="g")) == ["Hel", "lo", "!"]
    assert message_text(exporter.get_finished_spans()[0], "gen_ai.output.messages") == "Hello!"
    stream = run("q", session_id="g")
    assert next(stream) == "Hel"
    assert len(exporter.get_finished_spans()) == 1  # still open while streaming
    stream.close()
    assert message_text(exporter.get_finished_spans()[1], "gen_ai.output.messages") == "Hel"


async def test_async_generator_and_error_mid_stream(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("astream", tracer_provider=provider)
    async def run(q: str, session_id: str, fail: bool = False) -> AsyncIterator[str]:
        yield "a"
        if fail:
            raise KeyError("mid")
        yield "b"

    assert [c async for c in run("q", session_id="s")] == ["a", "b"]
    assert message_text(exporter.get_finished_spans()[0], "gen_ai.output.messages") == "ab"
    with pytest.raises(KeyError):
        async for _ in run("q", session_id="s", fail=True):
            pass
    failed = exporter.get_finished_spans()[1]
    assert failed.status.status_code is StatusCode.ERROR and attrs(failed)["error.type"] == "KeyError"


def test_conversation_context_and_end_marker(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("bot", session_id_arg=None, tracer_provider=provider)
    def run(q: str) -> str:
        return "ok"

    with conversation("outer", agent="bot", end=True, tracer_provider=provider):
        run("1")
        with conversation("inner", tracer_provider=provider):
            run("2")
        run("3")
    spans = exporter.get_finished_spans()
    ids = [(s.name, attrs(s)["gen_ai.conversation.id"]) for s in spans]
    assert ids == [
        ("invoke_agent bot", "outer"),
        ("invoke_agent bot", "inner"),  # the inner block only stamps: no end marker
        ("invoke_agent bot", "outer"),
        ("end_conversation", "outer"),
    ]
    marker = spans[-1]
    assert attrs(marker)["tracejudge.conversation.ended"] is True
    assert attrs(marker)["gen_ai.agent.name"] == "bot"
    assert marker.start_time == marker.end_time
    assert all("tracejudge.turn.index" not in attrs(s) for s in spans)


def test_end_conversation_function(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded
    end_conversation("c-77", tracer_provider=provider)
    span = exporter.get_finished_spans()[0]
    assert attrs(span) == {"gen_ai.conversation.id": "c-77", "tracejudge.conversation.ended": True}


async def test_100_interleaved_asyncio_conversations(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("bot", session_id_arg=None, tracer_provider=provider)
    async def run(q: str) -> str:
        await asyncio.sleep(0)
        return q

    async def talk(n: int) -> None:
        for turn in range(3):  # one block per request, the turn number from the caller, the last one ends it
            async with conversation(f"many-{n}", turn_index=turn, end=turn == 2, tracer_provider=provider):
                await run(f"many-{n} turn {turn}")
                await asyncio.sleep(0)

    await asyncio.gather(*(talk(n) for n in range(100)))
    turns = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke")]
    assert len(turns) == 300
    for span in turns:
        conv = attrs(span)["gen_ai.conversation.id"]
        text = message_text(span, "gen_ai.input.messages")
        assert text.startswith(f"{conv} turn ")
        assert attrs(span)["tracejudge.turn.index"] == int(text.rsplit(" ", 1)[1])
    ended = [attrs(s)["gen_ai.conversation.id"] for s in exporter.get_finished_spans() if s.name == "end_conversation"]
    assert sorted(ended) == sorted(f"many-{n}" for n in range(100))


def test_threads_never_mix_conversations(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("bot", session_id_arg=None, tracer_provider=provider)
    def run(q: str) -> str:
        return q

    def talk(n: int) -> None:
        with conversation(f"t-{n}", tracer_provider=provider):
            for _ in range(20):
                run(f"t-{n}")

    threads = [threading.Thread(target=talk, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for span in exporter.get_finished_spans():
        if span.name.startswith("invoke"):
            assert attrs(span)["gen_ai.conversation.id"] == message_text(span, "gen_ai.input.messages")


def test_capture_content_false(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    @traced_agent("private", capture_content=False, tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        return "secret answer"

    run("secret question", session_id="p")
    a = attrs(exporter.get_finished_spans()[0])
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a
    assert a["gen_ai.conversation.id"] == "p"


def test_tracing_bugs_never_reach_the_app(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    def broken_output(result: object) -> str:
        raise RuntimeError("bug in the output hook")

    @traced_agent("bot", output=broken_output, tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        return "fine"

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    assert run("q", session_id="b") == "fine"
    assert run(Unprintable(), session_id=Unprintable()) == "fine"  # type: ignore[arg-type]
    assert len(exporter.get_finished_spans()) >= 1  # the turn span still ended


def test_nested_spans_are_children_of_the_turn(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded
    tracer = provider.get_tracer("tool")

    @traced_agent("bot", tracer_provider=provider)
    def run(q: str, session_id: str) -> str:
        with tracer.start_as_current_span("tool call"):
            return "x"

    run("q", session_id="n")
    tool, turn = exporter.get_finished_spans()
    assert tool.parent is not None and tool.parent.span_id == turn.context.span_id


def test_global_provider_is_used_when_none_given() -> None:
    code = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracejudge.tracer import traced_agent

@traced_agent("early")  # decorated before the global provider exists
def run(q, session_id="g"):
    return q

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
run("hi")
assert [s.name for s in exporter.get_finished_spans()] == ["invoke_agent early"], exporter.get_finished_spans()
import sys
assert "litellm" not in sys.modules and "tracejudge.metrics" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_empty_name_warns_and_the_qualified_name_stands_in(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded
    with pytest.warns(TracedAgentWarning, match="non-empty str"):
        decorator = traced_agent("", tracer_provider=provider)

    @decorator
    def answer(question: str, session_id: str) -> str:
        return "a"

    assert answer("q", "s") == "a"
    assert exporter.get_finished_spans()[0].name == (
        "invoke_agent test_an_empty_name_warns_and_the_qualified_name_stands_in.<locals>.answer"
    )


# ---- decorated generators behave like `yield from` (PEP 380), and their span ends exactly once -------------------


@pytest.fixture
def ended_twice(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The SDK warns when end() is called on an ended span: collect those warnings."""
    caplog.set_level(logging.WARNING, logger="opentelemetry.sdk.trace")
    warnings: list[str] = []
    yield warnings
    warnings.extend(r.getMessage() for r in caplog.records if "ended span" in r.getMessage())
    assert not warnings, warnings


def _conversation_of_sends(provider: TracerProvider, log: list[Any]) -> Any:
    tracer = provider.get_tracer("tool")

    @traced_agent("chat", tracer_provider=provider)
    def run(q: str, session_id: str) -> Iterator[str]:
        try:
            received = yield "ready"
            log.append(("sent", received))
            while True:
                try:
                    with tracer.start_as_current_span("tool call"):
                        received = yield f"<{received}>"
                    log.append(("sent", received))
                except ValueError as exc:
                    log.append(("caught", str(exc)))
                    received = yield "recovered"
                if received == "stop":
                    return "the return value"
        finally:
            log.append("finally")

    return run


def test_sync_generator_send_throw_return(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded
    log: list[Any] = []
    run = _conversation_of_sends(provider, log)

    def caller() -> Iterator[str]:
        result = yield from run("q", session_id="gen")
        log.append(("returned", result))

    stream = caller()
    assert next(stream) == "ready"
    assert stream.send("one") == "<one>"
    assert stream.throw(ValueError("handled")) == "recovered"  # the user's generator sees it and continues
    assert stream.send("two") == "<two>"
    with pytest.raises(StopIteration):
        stream.send("stop")
    returned = ("returned", "the return value")
    assert log == [("sent", "one"), ("caught", "handled"), ("sent", "stop"), "finally", returned]
    spans = exporter.get_finished_spans()
    turn = next(s for s in spans if s.name == "invoke_agent chat")
    assert len(spans) == 3 and turn.status.status_code is StatusCode.UNSET
    assert message_text(turn, "gen_ai.output.messages") == "ready<one>recovered<two>"
    tools = [s for s in spans if s.name == "tool call"]
    assert all(t.parent is not None and t.parent.span_id == turn.context.span_id for t in tools)


def test_sync_generator_close_throw_unhandled_and_collected(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded
    log: list[Any] = []
    run = _conversation_of_sends(provider, log)

    closed = run("q", session_id="c")
    assert next(closed) == "ready" and closed.send("x") == "<x>"
    closed.close()  # the user's finally runs; the span ends with what was streamed
    assert log[-1] == "finally"
    assert message_text(exporter.get_finished_spans()[-1], "gen_ai.output.messages") == "ready<x>"

    thrown = run("q", session_id="t")
    next(thrown)
    with pytest.raises(KeyError, match="unhandled"):
        thrown.throw(KeyError("unhandled"))
    failed = exporter.get_finished_spans()[-1]
    assert failed.status.status_code is StatusCode.ERROR and attrs(failed)["error.type"] == "KeyError"

    collected = run("q", session_id="gc")
    next(collected)
    before = len(exporter.get_finished_spans())
    del collected
    gc.collect()
    assert log[-1] == "finally" and len(exporter.get_finished_spans()) == before + 1

    never_started = run("q", session_id="n")
    del never_started
    gc.collect()
    assert len(exporter.get_finished_spans()) == before + 1  # no turn was taken, no span
    assert [s.name for s in exporter.get_finished_spans()].count("invoke_agent chat") == 3


def test_sync_generator_that_ignores_close_fails_like_yield_from(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded

    @traced_agent("stubborn", tracer_provider=provider)
    def run(q: str, session_id: str) -> Iterator[str]:
        try:
            yield "a"
        finally:
            yield "b"  # ignores GeneratorExit

    stream = run("q", session_id="s")
    next(stream)
    with pytest.raises(RuntimeError, match="ignored GeneratorExit"):
        stream.close()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR


async def test_async_generator_asend_athrow_aclose(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded
    tracer = provider.get_tracer("tool")
    log: list[Any] = []

    @traced_agent("achat", tracer_provider=provider)
    async def run(q: str, session_id: str) -> AsyncIterator[str]:
        try:
            received = yield "ready"
            while True:
                try:
                    await asyncio.sleep(0)
                    with tracer.start_as_current_span("tool call"):
                        log.append(("sent", received))
                    received = yield f"<{received}>"
                except ValueError as exc:
                    log.append(("caught", str(exc)))
                    received = yield "recovered"
                if received == "stop":
                    return
        finally:
            log.append("finally")

    stream = run("q", session_id="a")
    assert await stream.asend(None) == "ready"
    assert await stream.asend("one") == "<one>"
    assert await stream.athrow(ValueError("handled")) == "recovered"
    assert await stream.asend("two") == "<two>"
    with pytest.raises(StopAsyncIteration):
        await stream.asend("stop")
    assert log == [("sent", "one"), ("caught", "handled"), ("sent", "two"), "finally"]
    turn = next(s for s in exporter.get_finished_spans() if s.name == "invoke_agent achat")
    assert message_text(turn, "gen_ai.output.messages") == "ready<one>recovered<two>"
    tools = [s for s in exporter.get_finished_spans() if s.name == "tool call"]
    assert len(tools) == 2 and all(t.parent is not None and t.parent.span_id == turn.context.span_id for t in tools)

    closed = run("q", session_id="b")
    await closed.asend(None)
    await closed.aclose()
    assert log[-1] == "finally"
    assert message_text(exporter.get_finished_spans()[-1], "gen_ai.output.messages") == "ready"

    thrown = run("q", session_id="c")
    await thrown.asend(None)
    with pytest.raises(KeyError):
        await thrown.athrow(KeyError("unhandled"))
    assert log[-1] == "finally"
    failed = exporter.get_finished_spans()[-1]
    assert failed.status.status_code is StatusCode.ERROR and attrs(failed)["error.type"] == "KeyError"
    assert [s.name for s in exporter.get_finished_spans()].count("invoke_agent achat") == 3


class _BrokenTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracing bug")


class _BrokenProvider(TracerProvider):
    def get_tracer(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return _BrokenTracer() if name == "tracejudge.tracer" else super().get_tracer(name, *args, **kwargs)


async def test_generators_still_forward_when_tracing_is_broken() -> None:
    provider = _BrokenProvider()
    log: list[Any] = []
    run = _conversation_of_sends(provider, log)
    stream = run("q", session_id="broken")
    assert next(stream) == "ready" and stream.send("one") == "<one>"
    assert stream.throw(ValueError("handled")) == "recovered"
    stream.close()
    assert log == [("sent", "one"), ("caught", "handled"), "finally"]

    @traced_agent("abroken", tracer_provider=provider)
    async def arun(q: str, session_id: str) -> AsyncIterator[str]:
        received = yield "ready"
        yield f"<{received}>"

    astream = arun("q", session_id="broken")
    assert await astream.asend(None) == "ready" and await astream.asend("x") == "<x>"
    await astream.aclose()


def test_generator_errors_propagate_as_the_same_object_and_end_the_span_once(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded
    boom = LookupError("inside the user's generator")

    @traced_agent("failing", tracer_provider=provider)
    def run(q: str, session_id: str) -> Iterator[str]:
        yield "partial"
        raise boom

    stream = run("q", session_id="e")
    assert next(stream) == "partial"
    with pytest.raises(LookupError) as caught:
        next(stream)
    assert caught.value is boom
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and attrs(span)["error.type"] == "LookupError"
    with pytest.raises(StopIteration):
        next(stream)  # finished: nothing more, and no second end()
    assert len(exporter.get_finished_spans()) == 1


def test_generator_called_with_wrong_arguments_starts_no_span(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = recorded
    started: list[str] = []

    class StartRecorder(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            started.append(span.name)

    provider.add_span_processor(StartRecorder())

    @traced_agent("strict", tracer_provider=provider)
    def run(q: str, session_id: str) -> Iterator[str]:
        yield q

    @traced_agent("astrict", tracer_provider=provider)
    async def arun(q: str, session_id: str) -> AsyncIterator[str]:
        yield q

    with pytest.raises(TypeError):
        next(run("q", "s", "unexpected"))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        asyncio.run(arun(unexpected=1).__anext__())  # type: ignore[call-arg]
    assert started == []  # a span started here would never end: leaked, and a turn index used up
    assert next(run("q", "s")) == "q" and started == ["invoke_agent strict"]


async def test_async_generator_errors_and_abandoned_streams_end_the_span_once(
    recorded: tuple[TracerProvider, InMemorySpanExporter], ended_twice: list[str]
) -> None:
    provider, exporter = recorded
    boom = LookupError("async boom")
    log: list[str] = []

    @traced_agent("afailing", tracer_provider=provider)
    async def run(q: str, session_id: str, fail: bool) -> AsyncIterator[str]:
        try:
            yield "partial"
            if fail:
                raise boom
            yield "more"
        finally:
            log.append(session_id)

    failing = run("q", session_id="f", fail=True)
    assert await failing.__anext__() == "partial"
    with pytest.raises(LookupError) as caught:
        await failing.__anext__()
    assert caught.value is boom
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR

    abandoned = run("q", session_id="abandoned", fail=False)
    assert await abandoned.__anext__() == "partial"
    del abandoned
    gc.collect()  # the event loop's async-generator finalizer closes it
    for _ in range(20):
        await asyncio.sleep(0)
        if len(exporter.get_finished_spans()) == 2:
            break
    assert log == ["f", "abandoned"]
    spans = exporter.get_finished_spans()
    assert len(spans) == 2 and spans[1].status.status_code is StatusCode.UNSET
    assert message_text(spans[1], "gen_ai.output.messages") == "partial"
