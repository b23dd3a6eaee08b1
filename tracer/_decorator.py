"""`@traced_agent`: one call is one turn is one span; the user's own exceptions propagate unchanged.

Everything that can be decided once (the kind of callable, which parameter is the conversation id and which the
user's message, the span name) is decided at decoration time, and what cannot be told is warned about then; per call
we only read arguments, build two small JSON strings and start/end one span.
"""

from __future__ import annotations

import functools
import inspect
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from ._conversation import current_conversation, get_tracer
from ._internal import handle_internal_errors
from ._messages import chunk_text, input_messages_json, output_messages_json, output_text
from .errors import TracedAgentWarning
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


_UNBOUND = -1  # a parameter that can only be passed by keyword (or arrives in **kwargs)


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    position: int  # _UNBOUND when it cannot be passed positionally

    def value(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.name in kwargs:
            return kwargs[self.name]
        if 0 <= self.position < len(args):
            return args[self.position]
        return None


@dataclass(slots=True)
class _Spec:
    """What is known about the decorated callable before it is ever called."""

    agent: str
    span_name: str
    session: tuple[_Param, ...]  # the conversation id: the first of these with a value (one, or names in **kwargs)
    user_message: _Param | None  # the user's message, when the signature says which parameter it is
    message_candidates: tuple[_Param, ...]  # else: the first str among these (never an id)...
    varargs_from: int | None  # ...then among *args...
    scan_kwargs: bool  # ...then among **kwargs
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

    def session_id(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        for param in self.session:
            value = param.value(args, kwargs)
            if value is not None:
                return value
        return None

    def input_text(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.user_message is not None:
            value = self.user_message.value(args, kwargs)
            return "" if value is None else value if isinstance(value, str) else str(value)
        for param in self.message_candidates:
            value = param.value(args, kwargs)
            if isinstance(value, str):
                return value
        if self.varargs_from is not None:
            for value in args[self.varargs_from :]:
                if isinstance(value, str):
                    return value
        if self.scan_kwargs:
            for name in MESSAGE_PARAMETERS:
                if isinstance(kwargs.get(name), str):
                    return kwargs[name]
            for name, value in kwargs.items():
                if isinstance(value, str) and not _id_like(name) and name not in SESSION_PARAMETERS:
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
        session = spec.session_id(args, kwargs)
        active = current_conversation.get()
        one_turn = False
        index: int | None = None
        if session is None:
            if active is not None:
                session, index = active.session_id, active.turn_index
            else:
                session, one_turn, index = uuid.uuid4().hex, True, 0
        session_id = session if isinstance(session, str) else str(session)
        if active is not None and not one_turn and active.session_id == session_id:
            index = active.turn_index  # only an index the caller gave: no process sees every turn to count them
        attributes: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: OPERATION_INVOKE_AGENT,
            GEN_AI_AGENT_NAME: spec.agent,
            GEN_AI_CONVERSATION_ID: session_id,
        }
        if index is not None:
            attributes[TURN_INDEX] = index
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


# Where a conversation id and a user's message are, by the names agents give them (first match wins).
SESSION_PARAMETERS = ("session_id", "conversation_id", "thread_id", "chat_id")
MESSAGE_PARAMETERS = ("user_message", "user_input", "message", "question", "prompt", "query", "input", "text")


class _Auto:
    """`session_id_arg` not given: found from the signature (None, given, means: always from the enclosing block)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AUTO"


AUTO: Any = _Auto()


def _id_like(name: str) -> bool:
    lowered = name.lower()
    return lowered == "id" or lowered.endswith(("_id", "_ids")) or name.endswith(("Id", "ID"))


def _may_be_text(parameter: inspect.Parameter) -> bool:
    """Not a message when its annotation or default says it is something else (`fail: bool`, `retries=3`)."""
    default = parameter.default
    if default is not parameter.empty and default is not None and not isinstance(default, str):
        return False
    annotation = parameter.annotation
    if annotation is parameter.empty or annotation is str or annotation is Any:
        return True
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "str" in text or "Any" in text


def _or(names: tuple[str, ...]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _param(parameter: inspect.Parameter, position: int) -> _Param:
    positional = parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    return _Param(parameter.name, position if positional else _UNBOUND)


def _label(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__qualname__


def _analyse(
    func: Any,
    agent: str,
    session_id_arg: Any,
    input_arg: Any,
    capture_content: bool,
    say: Callable[[str], None],
) -> tuple[tuple[_Param, ...], _Param | None, tuple[_Param, ...], int | None, bool]:
    """Read the signature once: which parameter carries the conversation id and which the user's message.

    What cannot be told is said now (`say`), not discovered later as one-turn conversations or a user id recorded as
    the user's message."""
    label = f"@traced_agent({agent!r}) on {_label(func)}"
    try:
        signature = inspect.signature(func)
    except Exception:  # a builtin, or a callable whose __signature__ is broken: still traced
        signature = None
        say(
            f"{label}: its signature cannot be read, so the conversation id is a keyword argument named "
            f"{_or(SESSION_PARAMETERS)}, else the enclosing `with conversation(id):` block (else each call is its own "
            "one-turn conversation), and the user's message is the first str argument. Wrap it in a function"
        )
    parameters = list(signature.parameters.values()) if signature is not None else []
    by_name = {p.name: _param(p, i) for i, p in enumerate(parameters)}
    var_keyword = signature is None or any(p.kind is p.VAR_KEYWORD for p in parameters)
    var_positional = next((i for i, p in enumerate(parameters) if p.kind is p.VAR_POSITIONAL), None)
    if signature is None:
        var_positional = 0

    session: tuple[_Param, ...] = ()
    if session_id_arg is not None and not isinstance(session_id_arg, str | _Auto):
        say(f"{label}: session_id_arg={session_id_arg!r} is not a parameter name; looking for the usual names")
        session_id_arg = AUTO
    if isinstance(session_id_arg, str):
        if session_id_arg in by_name:
            session = (by_name[session_id_arg],)
        elif var_keyword:
            session = (_Param(session_id_arg, _UNBOUND),)
        else:
            say(
                f"{label}: session_id_arg={session_id_arg!r} is not one of its parameters; each call outside a "
                "`with conversation(id):` block is recorded as its own one-turn conversation. Name the parameter "
                "that carries the conversation id"
            )
    elif isinstance(session_id_arg, _Auto):
        found = next((by_name[name] for name in SESSION_PARAMETERS if name in by_name), None)
        if found is not None:
            session = (found,)
        elif var_keyword:
            session = tuple(_Param(name, _UNBOUND) for name in SESSION_PARAMETERS)
        elif signature is not None:
            say(
                f"{label}: none of its parameters is named {_or(SESSION_PARAMETERS)}, so each call outside a "
                "`with conversation(id):` block is recorded as its own one-turn conversation. Pass "
                "session_id_arg='<the parameter with the conversation id>', or session_id_arg=None if every call "
                "runs inside `with conversation(id):`"
            )
    session_names = {p.name for p in session}

    message: _Param | None = None
    candidates: tuple[_Param, ...] = ()
    if not capture_content:
        return session, None, (), None, False
    if input_arg is not None and not isinstance(input_arg, str):
        say(f"{label}: input_arg={input_arg!r} is not a parameter name; looking for the usual names")
        input_arg = None
    if isinstance(input_arg, str):
        if input_arg in by_name:
            return session, by_name[input_arg], (), None, False
        if var_keyword:
            return session, _Param(input_arg, _UNBOUND), (), None, False
        say(f"{label}: input_arg={input_arg!r} is not one of its parameters; looking for the usual names")
    message = next(
        (by_name[name] for name in MESSAGE_PARAMETERS if name in by_name and name not in session_names), None
    )
    if message is not None:
        return session, message, (), None, False
    candidates = tuple(
        by_name[p.name]
        for i, p in enumerate(parameters)
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name not in session_names
        and not _id_like(p.name)
        and not (i == 0 and p.name in ("self", "cls"))
        and _may_be_text(p)
    )
    if len(candidates) == 1 and var_positional is None:
        return session, candidates[0], (), None, False  # the one parameter that can be the message
    if signature is not None:
        if candidates or var_positional is not None or var_keyword:
            extra = ["*args"] * (var_positional is not None) + ["**kwargs"] * var_keyword
            what = f"the first str argument among {', '.join([p.name for p in candidates] + extra)} (never an id)"
        else:
            what = "empty (no parameter can be it: ids and parameters typed other than str never are)"
        say(
            f"{label}: none of its parameters is named {_or(MESSAGE_PARAMETERS)}, so the user's message recorded "
            f"is {what}. Pass input_arg='<the parameter with the user's message>'"
        )
    return session, None, candidates, var_positional, var_keyword


@overload
def traced_agent(name: F, /) -> F: ...


@overload
def traced_agent(
    name: str | None = None,
    *,
    session_id_arg: str | None = ...,
    input_arg: str | None = None,
    output: Callable[[Any], str] | None = None,
    capture_content: bool = True,
    tracer_provider: TracerProvider | None = None,
    redactor: Callable[[str], str] | None = None,
) -> Callable[[F], F]: ...


def traced_agent(
    name: Any = None,
    *,
    session_id_arg: Any = AUTO,
    input_arg: str | None = None,
    output: Callable[[Any], str] | None = None,
    capture_content: bool = True,
    tracer_provider: TracerProvider | None = None,
    redactor: Callable[[str], str] | None = None,
) -> Any:
    """Record each call of the decorated agent as one `invoke_agent {name}` span (GenAI semantic conventions).

    `@traced_agent`, `@traced_agent()` or `@traced_agent("name")`; the name defaults to the function's qualified
    name. The conversation id is the parameter named `session_id_arg`, else one named session_id, conversation_id,
    thread_id or chat_id, else the enclosing `with conversation(id):` block; the user's message is `input_arg`, else
    a parameter named like a message (message, question, prompt, query, input, ...), never an id. What the signature
    leaves open is warned about once, at decoration time (`TracedAgentWarning`); decorating and calling never raise.

    With `capture_content=False` the messages are left out (the conventions make content opt-in): such turns are
    assembled but cannot be judged. `redactor` (for example `tracejudge.tracer.redact.redact_pii`) rewrites the
    message text before it is recorded, so it never leaves the process.
    """
    if callable(name) and not isinstance(name, str):  # bare @traced_agent
        return _decorator(None, session_id_arg, input_arg, output, capture_content, tracer_provider, redactor, 4)(name)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        warnings.warn(
            f"@traced_agent(name={name!r}): the agent name must be a non-empty str; using the function's qualified "
            "name",
            TracedAgentWarning,
            stacklevel=2,
        )
        name = None
    return _decorator(name, session_id_arg, input_arg, output, capture_content, tracer_provider, redactor, 3)


def _decorator(
    name: str | None,
    session_id_arg: Any,
    input_arg: Any,
    output: Callable[[Any], str] | None,
    capture_content: bool,
    tracer_provider: TracerProvider | None,
    redactor: Callable[[str], str] | None,
    stacklevel: int,
) -> Callable[[F], F]:
    def say(message: str) -> None:  # called from _analyse, called from decorate: the caller's line is the user's
        warnings.warn(message, TracedAgentWarning, stacklevel=stacklevel + 1)

    def decorate(func: F) -> F:
        try:
            agent = name or _label(func)
            session, message, candidates, varargs_from, scan_kwargs = _analyse(
                func, agent, session_id_arg, input_arg, capture_content, say
            )
            spec = _Spec(
                agent=agent,
                span_name=f"invoke_agent {agent}",
                session=session,
                user_message=message,
                message_candidates=candidates,
                varargs_from=varargs_from,
                scan_kwargs=scan_kwargs,
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
        except TracedAgentWarning:
            raise  # warnings turned into errors (-W error): the user asked for that
        except Exception as exc:
            warnings.warn(
                f"@traced_agent on {func!r} could not be set up ({type(exc).__name__}: {exc}): it runs untraced",
                TracedAgentWarning,
                stacklevel=stacklevel,
            )
            return func
        return wrapped  # type: ignore[return-value]

    return decorate
