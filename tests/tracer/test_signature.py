"""@traced_agent reads the decorated function's signature once: where the conversation id and the user's message are.

What it cannot tell is a `TracedAgentWarning` at decoration time (never a silent one-turn conversation, never a user
id recorded as the user's message); decorating and calling never raise into the app.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracejudge.tracer import TracedAgentWarning, conversation, traced_agent


@pytest.fixture
def recorded() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def no_warning() -> Iterator[list[warnings.WarningMessage]]:
    """Fails the test if anything in it warns (each decoration is checked, not just the last)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    assert [str(w.message) for w in caught] == []


def decorate(func: Callable[..., Any], **options: Any) -> tuple[Callable[..., Any], list[str]]:
    """Decorate with warnings recorded: the wrapper and what was said, each checked to point at this file."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = traced_agent(**options)(func)
    said = [w for w in caught if issubclass(w.category, TracedAgentWarning)]
    assert all(w.filename == __file__ for w in said), [w.filename for w in said]  # the decoration site, not ours
    return wrapped, [str(w.message) for w in said]


def only(exporter: InMemorySpanExporter) -> dict[str, Any]:
    (span,) = exporter.get_finished_spans()
    return dict(span.attributes or {})


def user_text(span: ReadableSpan | dict[str, Any]) -> str:
    attributes = span if isinstance(span, dict) else dict(span.attributes or {})
    return json.loads(attributes["gen_ai.input.messages"])[0]["parts"][0]["content"]


def test_the_warning_is_a_user_warning_of_ours() -> None:
    assert issubclass(TracedAgentWarning, UserWarning)


@pytest.mark.parametrize("parameter", ["session_id", "conversation_id", "thread_id", "chat_id"])
def test_the_conversation_id_parameter_is_found_by_its_usual_names(
    recorded: tuple[TracerProvider, InMemorySpanExporter], parameter: str
) -> None:
    provider, exporter = recorded
    namespace: dict[str, Any] = {}
    exec(f"def answer(question, {parameter}):\n    return 'a'", namespace)
    answer, said = decorate(namespace["answer"], name="bot", tracer_provider=provider)
    assert said == []
    answer("hello", "conv-7")
    answer(question="again", **{parameter: "conv-7"})
    spans = exporter.get_finished_spans()
    assert [dict(s.attributes or {})["gen_ai.conversation.id"] for s in spans] == ["conv-7", "conv-7"]
    assert all("tracejudge.conversation.ended" not in (s.attributes or {}) for s in spans)  # not one-turn
    assert [user_text(s) for s in spans] == ["hello", "again"]


def test_no_conversation_parameter_warns_at_decoration_and_says_how_to_fix(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def answer(question: str, conversation: str) -> str:
        return "a"

    answer_traced, said = decorate(answer, name="bot", tracer_provider=provider)
    assert len(said) == 1
    assert "one-turn conversation" in said[0] and "session_id_arg=" in said[0] and "answer" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, at decoration: calls say nothing more
        answer_traced("q", "c-1")
    assert only(exporter)["tracejudge.conversation.ended"] is True  # what the warning said would happen


def test_an_explicit_session_id_arg_wins_and_a_missing_one_warns(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def answer(question: str, room: str, session_id: str = "not this") -> str:
        return "a"

    traced, said = decorate(answer, name="bot", session_id_arg="room", tracer_provider=provider)
    assert said == []
    traced("q", "room-1")
    assert only(exporter)["gen_ai.conversation.id"] == "room-1"

    _, said = decorate(answer, name="bot", session_id_arg="sid", tracer_provider=provider)
    assert len(said) == 1 and "'sid' is not one of its parameters" in said[0]


def test_session_id_arg_none_means_the_block_and_says_nothing(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def answer(question: str) -> str:
        return "a"

    traced, said = decorate(answer, name="bot", session_id_arg=None, tracer_provider=provider)
    assert said == []
    with conversation("from-the-block"):
        traced("q")
    assert only(exporter)["gen_ai.conversation.id"] == "from-the-block"


def test_a_user_id_before_the_question_is_never_the_users_message(
    recorded: tuple[TracerProvider, InMemorySpanExporter], no_warning: list[Any]
) -> None:
    provider, exporter = recorded

    @traced_agent("bot", tracer_provider=provider)
    def answer(user_id: str, question: str, session_id: str) -> str:
        return "a"

    answer("user-42", "Where is my parcel?", "conv-1")
    attributes = only(exporter)
    assert user_text(attributes) == "Where is my parcel?"
    assert attributes["gen_ai.conversation.id"] == "conv-1"


@pytest.mark.parametrize(
    "parameter", ["message", "question", "prompt", "query", "input", "user_input", "user_message", "text"]
)
def test_the_users_message_is_found_by_its_usual_names(
    recorded: tuple[TracerProvider, InMemorySpanExporter], parameter: str
) -> None:
    provider, exporter = recorded
    namespace: dict[str, Any] = {}
    exec(f"def answer(tenant, user_id, {parameter}, locale, session_id):\n    return 'a'", namespace)
    answer, said = decorate(namespace["answer"], name="bot", tracer_provider=provider)
    assert said == []
    answer("acme", "user-42", "the real question", "en", "s-1")
    assert user_text(only(exporter)) == "the real question"


def test_a_single_parameter_that_can_be_text_is_the_message(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def answer(customer_id: str, q: str, session_id: str, retries: int = 3, verbose: bool = False) -> str:
        return "a"

    traced, said = decorate(answer, name="bot", tracer_provider=provider)
    assert said == []  # ids, a non-str default and a non-str annotation are never the message: q is the obvious one
    traced("cust-1", "hi there", "s")
    assert user_text(only(exporter)) == "hi there"


def test_an_ambiguous_message_warns_and_input_arg_settles_it(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def answer(user_id: str, system: str, ask: str, session_id: str) -> str:
        return "a"

    traced, said = decorate(answer, name="bot", tracer_provider=provider)
    assert len(said) == 1 and "input_arg=" in said[0] and "system, ask" in said[0]
    traced("user-42", "be nice", "the question", "s")
    assert user_text(only(exporter)) == "be nice"  # as the warning said: the first str among them, not the user id

    exporter.clear()
    settled, said = decorate(answer, name="bot", input_arg="ask", tracer_provider=provider)
    assert said == []
    settled("user-42", "be nice", "the question", "s")
    assert user_text(only(exporter)) == "the question"

    _, said = decorate(answer, name="bot", capture_content=False, tracer_provider=provider)
    assert said == []  # no content recorded: where the message is does not matter


def test_no_parameter_can_be_the_message_warns(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    def answer(user_id: str, order_id: int, session_id: str) -> str:
        return "a"

    traced, said = decorate(answer, name="bot", tracer_provider=provider)
    assert len(said) == 1 and "empty" in said[0] and "input_arg=" in said[0]
    traced("user-42", 7, "s")
    assert user_text(only(exporter)) == ""


def test_kwargs_carry_the_conversation_and_the_message(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    def handler(**kwargs: Any) -> str:
        return "a"

    traced, said = decorate(handler, name="bot", tracer_provider=provider)
    assert len(said) == 1 and "**kwargs" in said[0]  # the message cannot be told in advance; the id can be looked up
    traced(user_id="user-42", thread_id="t-9", prompt="what now?")
    attributes = only(exporter)
    assert attributes["gen_ai.conversation.id"] == "t-9"
    assert user_text(attributes) == "what now?"


def test_the_name_defaults_to_the_qualified_name_bare_or_called(
    recorded: tuple[TracerProvider, InMemorySpanExporter], no_warning: list[Any]
) -> None:
    provider, exporter = recorded

    class Desk:
        @traced_agent(tracer_provider=provider)
        def reply(self, message: str, session_id: str) -> str:
            return "called"

    @traced_agent
    def bare(message: str, session_id: str) -> str:
        return "bare"

    assert Desk().reply("hi", "s") == "called"
    span = exporter.get_finished_spans()[0]
    qualname = "test_the_name_defaults_to_the_qualified_name_bare_or_called.<locals>.Desk.reply"
    assert span.name == f"invoke_agent {qualname}"
    assert dict(span.attributes or {})["gen_ai.agent.name"] == qualname
    assert bare("hi", "s") == "bare" and bare.__name__ == "bare"  # global provider: no span here, still works


class _UnreadableSignature:
    """A callable whose signature raises something inspect does not expect."""

    @property
    def __signature__(self) -> Any:
        raise RuntimeError("no signature for you")

    def __call__(self, question: str) -> str:
        return f"called with {question}"


@pytest.mark.parametrize(
    ("make", "args", "expected"),
    [
        (lambda: len, (["a", "b"],), 2),  # a builtin: its signature may not be readable
        (lambda: functools.partial(lambda prefix, question, session_id: prefix + question, "> "), ("q", "s"), "> q"),
        (lambda: lambda *args, **kwargs: (args, kwargs), ("q",), (("q",), {})),
        (lambda: _UnreadableSignature(), ("q",), "called with q"),
    ],
)
def test_decorating_anything_callable_never_raises_and_the_call_still_works(
    recorded: tuple[TracerProvider, InMemorySpanExporter], make: Callable[[], Any], args: tuple[Any, ...], expected: Any
) -> None:
    provider, exporter = recorded
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        traced = traced_agent(tracer_provider=provider)(make())
    assert traced(*args) == expected
    assert len(exporter.get_finished_spans()) == 1  # and it is traced


def test_bad_options_warn_and_fall_back(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    def answer(question: str, session_id: str) -> str:
        return "a"

    for options, expected in (
        ({"name": 42}, "non-empty str"),
        ({"name": "   "}, "non-empty str"),
        ({"name": "bot", "session_id_arg": 5}, "session_id_arg=5"),
        ({"name": "bot", "input_arg": ["question"]}, "input_arg=['question']"),
        ({"name": "bot", "input_arg": "nope"}, "input_arg='nope'"),
    ):
        with pytest.warns(TracedAgentWarning, match=re.escape(expected)):
            traced = traced_agent(tracer_provider=provider, **options)(answer)
        assert traced("q", "s") == "a"
    spans = exporter.get_finished_spans()
    assert all(dict(s.attributes or {})["gen_ai.conversation.id"] == "s" for s in spans)
    assert all(user_text(s) == "q" for s in spans)  # the usual names took over
    assert spans[0].name == "invoke_agent test_bad_options_warn_and_fall_back.<locals>.answer"


def test_calling_never_raises_whatever_the_arguments(recorded: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = recorded

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    @traced_agent("bot", tracer_provider=provider)
    def answer(question: Any, session_id: Any) -> str:
        return "fine"

    assert answer(Unprintable(), Unprintable()) == "fine"
    assert answer(None, None) == "fine"
    assert answer(question=b"bytes", session_id=12) == "fine"
    with pytest.raises(TypeError):
        answer("only one")  # type: ignore[call-arg]  # the function's own error, unchanged
    assert len(exporter.get_finished_spans()) >= 2


def test_warnings_made_errors_by_the_user_are_errors() -> None:
    """`-W error` (or a filter on TracedAgentWarning) is the user's explicit wish: a CI can refuse such agents."""

    def answer(question: str) -> str:
        return "a"

    with warnings.catch_warnings():
        warnings.simplefilter("error", TracedAgentWarning)
        with pytest.raises(TracedAgentWarning):
            traced_agent("bot")(answer)


def test_a_callable_tracing_cannot_set_up_runs_untraced_and_says_so(
    recorded: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = recorded

    class BrokenName:
        @property
        def __name__(self) -> str:
            raise RuntimeError("no name")

        def __call__(self, question: str, session_id: str) -> str:
            return "still answers"

    original = BrokenName()
    with pytest.warns(TracedAgentWarning, match="runs untraced"):
        traced = traced_agent(tracer_provider=provider)(original)
    assert traced is original and traced("q", "s") == "still answers"
    assert exporter.get_finished_spans() == ()
