"""`@traced_agent`: one call is one turn is one span; the user's own exceptions propagate unchanged.

Everything that can be decided once (the kind of callable, parameter positions, the span name) is decided at
decoration time; per call we only read arguments, build two small JSON strings and start/end one span.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from ._conversation import current_conversation, get_tracer, turn_counter
from ._internal import handle_internal_errors
from ._messages import chunk_text, input_messages_json, output_messages_json, output_text
from .semconv import (
    CONVERSATION_ENDED,
    ERROR_TYPE,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    OPERATION_INVOKE_AGENT,
    TURN_INDEX,
)

F = TypeVar("F", bound=Callable[..., Any])
_MAX_STREAM_CHARS = 1_000_000


def error_type(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


@dataclass(slots=True)
class _Spec:
    """What is known about the decorated callable before it is ever called."""

    agent: str
    span_name: str
    session_name: str
    session_position: int | None
    input_name: str | None
    input_position: int | None
    skip_positions: frozenset[int]
    output: Callable[[Any], str] | None
    capture_content: bool
    redactor: Callable[[str], str] | None
    tracer_provider: TracerProvider | None
    _tracer: trace.Tracer | None = None

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:
            # Before a global provider is set this is a ProxyTracer, which follows the provider once it is set.
            self._tracer = get_tracer(self.tracer_provider)
        return self._tracer

    def argument(self, name: str | None, position: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name is not None and name in kwargs:
            return kwargs[name]
        if position is not None and position < len(args):
            return args[position]
        return None

    def input_text(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.input_name is not None:
            value = self.argument(self.input_name, self.input_position, args, kwargs)
            return "" if value is None else value if isinstance(value, str) else str(value)
        for position, value in enumerate(args):
            if position not in self.skip_positions and isinstance(value, str):
                return value
        for name, value in kwargs.items():
            if name != self.session_name and isinstance(value, str):
                return value
        return ""


class _Turn:
    __slots__ = ("one_turn", "span", "token")

    def __init__(self, span: Span, token: object | None, one_turn: bool) -> None:
        self.span = span
        self.token = token
        self.one_turn = one_turn


def _start(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any], *, attach: bool) -> _Turn | None:
    with handle_internal_errors():
        session = spec.argument(spec.session_name, spec.session_position, args, kwargs)
        one_turn = False
        if session is None:
            active = current_conversation.get()
            if active is not None:
                session = active.session_id
            else:
                session, one_turn = uuid.uuid4().hex, True
        session_id = session if isinstance(session, str) else str(session)
        attributes: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: OPERATION_INVOKE_AGENT,
            GEN_AI_AGENT_NAME: spec.agent,
            GEN_AI_CONVERSATION_ID: session_id,
            TURN_INDEX: 0 if one_turn else turn_counter.next_index(session_id),
        }
        if spec.capture_content:
            text = spec.input_text(args, kwargs)
            if spec.redactor is not None:
                text = spec.redactor(text)
            attributes[GEN_AI_INPUT_MESSAGES] = input_messages_json(text)
        if one_turn:
            attributes[CONVERSATION_ENDED] = True
        span = spec.tracer.start_span(spec.span_name, kind=SpanKind.INTERNAL, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span)) if attach else None
        return _Turn(span, token, one_turn)
    return None


def _detach(turn: _Turn) -> None:
    if turn.token is not None:
        token, turn.token = turn.token, None
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        except Exception:
            pass


def _finish(spec: _Spec, turn: _Turn, result: Any, *, text: str | None = None) -> None:
    with handle_internal_errors():
        _detach(turn)
        try:
            if spec.capture_content:
                if text is None:
                    text = spec.output(result) if spec.output is not None else output_text(result)
                if spec.redactor is not None:
                    text = spec.redactor(text)
                turn.span.set_attribute(GEN_AI_OUTPUT_MESSAGES, output_messages_json(text))
        finally:
            turn.span.end()


def _fail(turn: _Turn, exc: BaseException) -> None:
    with handle_internal_errors():
        _detach(turn)
        span = turn.span
        try:
            span.set_attribute(ERROR_TYPE, error_type(exc))
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:1024]))
            span.record_exception(exc)
        finally:
            span.end()


def _wrap_function(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        turn = _start(spec, args, kwargs, attach=True)
        if turn is None:
            return func(*args, **kwargs)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            _fail(turn, exc)
            raise
        _finish(spec, turn, result)
        return result

    return wrapper


def _wrap_coroutine(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        turn = _start(spec, args, kwargs, attach=True)
        if turn is None:
            return await func(*args, **kwargs)
        try:
            result = await func(*args, **kwargs)
        except BaseException as exc:
            _fail(turn, exc)
            raise
        _finish(spec, turn, result)
        return result

    return wrapper


class _StreamText:
    """Joins streamed chunks, bounded so a runaway stream cannot grow tracing's memory."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.size = 0

    def add(self, chunk: Any) -> None:
        if self.size < _MAX_STREAM_CHARS:
            with handle_internal_errors():
                text = chunk_text(chunk)
                self.parts.append(text)
                self.size += len(text)

    def text(self) -> str:
        return "".join(self.parts)


def _end(spec: _Spec, turn: _Turn | None, stream: _StreamText, exc: BaseException | None) -> None:
    if turn is not None:
        if exc is None:
            _finish(spec, turn, None, text=stream.text())
        else:
            _fail(turn, exc)


def _wrap_generator(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    """`yield from` (PEP 380) with a span: send, throw and close reach the user's generator, its return value is
    returned, and the span ends once, whichever way the stream ends (exhausted, closed, thrown into, collected)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inner = func(*args, **kwargs)  # first: runs no user code, but wrong arguments raise here, before any span
        turn = _start(spec, args, kwargs, attach=False)
        stream = _StreamText()
        span_context = trace.set_span_in_context(turn.span) if turn is not None else None

        def step(method: Callable[..., Any], *arg: Any) -> Any:
            # Only while the user's code runs is the turn the current span: the consumer of the stream is outside it.
            token = otel_context.attach(span_context) if span_context is not None else None
            try:
                return method(*arg)
            finally:
                if token is not None:
                    otel_context.detach(token)

        try:
            chunk = step(inner.send, None)
            while True:
                stream.add(chunk)
                try:
                    sent = yield chunk
                except GeneratorExit:
                    step(inner.close)
                    raise
                except BaseException as exc:
                    chunk = step(inner.throw, exc)
                else:
                    chunk = step(inner.send, sent)
        except StopIteration as stop:
            _end(spec, turn, stream, None)
            return stop.value
        except GeneratorExit:
            _end(spec, turn, stream, None)  # closed early: the turn is what was streamed so far
            raise
        except BaseException as exc:
            _end(spec, turn, stream, exc)
            raise

    return wrapper


def _wrap_async_generator(func: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    """The asend/athrow/aclose loop that `yield from` would be for async generators, with the same span rules."""

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        inner = func(*args, **kwargs)
        turn = _start(spec, args, kwargs, attach=False)
        stream = _StreamText()
        span_context = trace.set_span_in_context(turn.span) if turn is not None else None

        async def step(method: Callable[..., Any], *arg: Any) -> Any:
            token = otel_context.attach(span_context) if span_context is not None else None
            try:
                return await method(*arg)
            finally:
                if token is not None:
                    otel_context.detach(token)

        try:
            chunk = await step(inner.asend, None)
            while True:
                stream.add(chunk)
                try:
                    sent = yield chunk
                except GeneratorExit:
                    await step(inner.aclose)
                    raise
                except BaseException as exc:
                    chunk = await step(inner.athrow, exc)
                else:
                    chunk = await step(inner.asend, sent)
        except StopAsyncIteration:
            _end(spec, turn, stream, None)
        except GeneratorExit:
            _end(spec, turn, stream, None)
            raise
        except BaseException as exc:
            _end(spec, turn, stream, exc)
            raise

    return wrapper


def _parameter_position(signature: inspect.Signature, name: str | None) -> int | None:
    if name is None:
        return None
    for position, parameter in enumerate(signature.parameters.values()):
        if parameter.name == name:
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                return position
            return None
    return None


def traced_agent(
    name: str,
    *,
    session_id_arg: str = "session_id",
    input_arg: str | None = None,
    output: Callable[[Any], str] | None = None,
    capture_content: bool = True,
    tracer_provider: TracerProvider | None = None,
    redactor: Callable[[str], str] | None = None,
) -> Callable[[F], F]:
    """Record each call of the decorated agent as one `invoke_agent {name}` span (GenAI semantic conventions).

    With `capture_content=False` the messages are left out (the conventions make content opt-in): such turns are
    assembled but cannot be judged. `redactor` (for example `tracejudge.tracer.redact.redact_pii`) rewrites the
    message text before it is recorded, so it never leaves the process.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("traced_agent needs a non-empty agent name")

    def decorate(func: F) -> F:
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            signature = inspect.Signature()
        parameters = list(signature.parameters)
        session_position = _parameter_position(signature, session_id_arg)
        skip = {session_position} if session_position is not None else set()
        if parameters and parameters[0] in ("self", "cls"):
            skip.add(0)
        spec = _Spec(
            agent=name,
            span_name=f"invoke_agent {name}",
            session_name=session_id_arg,
            session_position=session_position,
            input_name=input_arg,
            input_position=_parameter_position(signature, input_arg),
            skip_positions=frozenset(skip),
            output=output,
            capture_content=capture_content,
            tracer_provider=tracer_provider,
            redactor=redactor,
        )
        if inspect.isasyncgenfunction(func):
            wrapped = _wrap_async_generator(func, spec)
        elif inspect.isgeneratorfunction(func):
            wrapped = _wrap_generator(func, spec)
        elif inspect.iscoroutinefunction(func):
            wrapped = _wrap_coroutine(func, spec)
        else:
            wrapped = _wrap_function(func, spec)
        return wrapped  # type: ignore[return-value]

    return decorate
