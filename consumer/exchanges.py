"""A conversation's spans → its real exchanges: nesting decided by content, not by position.

Instrumentations nest: an agent span around one or more LLM calls, a workflow around a chat, two libraries around
the same HTTP call. Within one trace a span's container is its parent span when that is a turn too, else the
smallest turn span of the trace that encloses it in time (the links through spans that are not turns are not kept).
Then, bottom-up:

- a span without content yields to what it contains (a parent without text never hides its child LLM span);
- a span with content and at most one exchange below it is one turn: its own text first (unless it was parsed out
  of a raw body and the exchange below has structured messages), a missing side filled from the exchange below (a
  parent and a child that both have content make one turn, not two and not zero);
- a span with content but several exchanges below it (a whole conversation in one trace) yields to them;
- consecutive steps of one exchange merge: a call that only asked for a tool (no answer text) goes with the next
  call on the same question; a call with no new user text after a call that answered (text next to a tool call)
  continues that answer; spans that overlap in time with the same text, or without text next to one with it,
  are two instrumentations of one call and count once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from .adapters import Turn

_MAX_OVERLAPPING = 32  # spans that overlap without nesting, looked past to find the one enclosing a span


def _has_content(turn: Turn) -> bool:
    return turn.input is not None or turn.output is not None


def _encloses(outer: Turn, inner: Turn) -> bool:
    return (
        outer.start_ns <= inner.start_ns
        and inner.end_ns <= outer.end_ns
        and (outer.start_ns < inner.start_ns or inner.end_ns < outer.end_ns)
    )


def _smallest_enclosing(trace_turns: list[Turn]) -> dict[str, Turn]:
    """For each turn of one trace, the smallest other turn that encloses it in time, in O(n log n): spans nest, so
    a sweep by start time keeps the enclosing ones on a stack, innermost on top. Overlapping siblings (spans that do
    not nest) are looked past, a bounded number of them, so a hostile trace cannot make this quadratic."""
    found: dict[str, Turn] = {}
    stack: list[Turn] = []
    for turn in sorted(trace_turns, key=lambda t: (t.start_ns, -t.end_ns, t.span_id)):
        while stack and stack[-1].end_ns < turn.start_ns:
            stack.pop()
        best: Turn | None = None
        for candidate in reversed(stack[-_MAX_OVERLAPPING:]):
            if _encloses(candidate, turn) and (
                best is None or candidate.end_ns - candidate.start_ns < best.end_ns - best.start_ns
            ):
                best = candidate
        if best is not None:
            found[turn.span_id] = best
        stack.append(turn)
    return found


def _containers(turns: list[Turn]) -> dict[str, str | None]:
    by_id = {t.span_id: t for t in turns}
    by_trace: dict[str, list[Turn]] = {}
    for turn in turns:
        by_trace.setdefault(turn.trace_id, []).append(turn)
    enclosing: dict[str, Turn] = {}
    for trace_turns in by_trace.values():
        enclosing.update(_smallest_enclosing(trace_turns))
    containers: dict[str, str | None] = {}
    for turn in turns:
        parent = by_id.get(turn.parent_span_id) if turn.parent_span_id else None
        if parent is not None and parent is not turn:
            containers[turn.span_id] = parent.span_id
            continue
        if not turn.parent_span_id:  # a root span is nobody's child
            containers[turn.span_id] = None
            continue
        best = enclosing.get(turn.span_id)
        containers[turn.span_id] = best.span_id if best is not None else None
    # A cycle (inconsistent parent links) must not lose or merge turns: its members all become roots. Linear time.
    state: dict[str, int] = {}  # 1: on the current path, 2: settled
    for span_id in containers:
        path: list[str] = []
        current: str | None = span_id
        while current is not None and state.get(current) is None:
            state[current] = 1
            path.append(current)
            current = containers.get(current)
        if current is not None and state.get(current) == 1:
            for member in path[path.index(current) :]:
                containers[member] = None
        for member in path:
            state[member] = 2
    return containers


def _side(outer: str | None, outer_body: bool, inner: str | None, inner_body: bool) -> tuple[str | None, bool]:
    """The outer span's text first, unless only it was parsed out of a raw body and the inner one is structured; but
    an inner text that wraps the outer one (a prompt template or an output format around the user's words or the
    answer: DSPy's `[[ ## question ## ]]`) yields to the words it wraps."""
    if outer is None or (outer_body and inner is not None and not inner_body and not _wraps(inner, outer)):
        return (inner, inner_body) if inner is not None else (outer, outer_body)
    return outer, outer_body


def _wraps(text: str, words: str) -> bool:
    """`text` puts something before `words` (a template's header), so `words` is not a clipped copy of it."""
    if not words.strip() or text.startswith(words):
        return False
    return re.search(r"(?<!\w)" + re.escape(words) + r"(?!\w)", text) is not None


def _steps_of(node: Turn, spoken: list[Turn]) -> bool:
    """Whether exchanges below a span are the steps of its one exchange (an agent loop's calls: each asks the span's
    own question, whatever template wraps it), not several exchanges of their own (a conversation in one trace)."""
    question = node.input
    if question is None:
        return False
    asked = re.compile(r"(?<!\w)" + re.escape(question) + r"(?!\w)")  # the whole question, not a word's piece of it
    return all(t.input is None or asked.search(t.input) is not None for t in spoken)


def _merge(outer: Turn, inner: Turn) -> Turn:
    user, user_body = _side(outer.input, outer.input_from_body, inner.input, inner.input_from_body)
    answer, answer_body = _side(outer.output, outer.output_from_body, inner.output, inner.output_from_body)
    return replace(
        outer,
        input=user,
        output=answer,
        input_from_body=user_body,
        output_from_body=answer_body,
        is_error=outer.is_error or inner.is_error,
        index=outer.index if outer.index is not None else inner.index,
    )


def _merge_steps(turns: list[Turn]) -> list[Turn]:
    merged: list[Turn] = []
    for turn in turns:
        if merged:
            previous = merged[-1]
            tool_step = (
                previous.output is None
                and previous.input is not None
                and not previous.is_error
                and turn.input in (None, previous.input)
            )
            overlap = turn.start_ns < previous.end_ns
            duplicate = overlap and (  # two instrumentations of one call overlap in time; a repeating user does not
                (turn.input, turn.output) == (previous.input, previous.output)
                or not _has_content(turn)  # a second, content-less span of the same call (an SDK's own)
            )
            if overlap and not _has_content(previous) and _has_content(turn):
                merged[-1] = _merge(turn, previous)
                continue
            if tool_step:
                merged[-1] = _merge(turn, previous)
                continue
            # A call that said something and asked for a tool ("Let me check."), then the call after the tool result:
            # no new user text (the history ends with that assistant message), so it continues the same exchange.
            if (
                not overlap
                and turn.input is None
                and turn.output is not None
                and previous.input is not None
                and previous.output is not None
                and turn.trace_id == previous.trace_id
            ):
                merged[-1] = replace(
                    previous,
                    output=f"{previous.output}\n{turn.output}",
                    output_from_body=previous.output_from_body and turn.output_from_body,
                    is_error=previous.is_error or turn.is_error,
                )
                continue
            if duplicate:
                merged[-1] = replace(previous, is_error=previous.is_error or turn.is_error)
                continue
        merged.append(turn)
    return merged


def exchanges(spans: Iterable[Turn]) -> list[Turn]:
    """The conversation's exchanges in order; every turn span is accounted for in exactly one of them."""
    turns = sorted(spans, key=lambda t: (t.start_ns, t.index or 0, t.span_id))
    containers = _containers(turns)
    children: dict[str | None, list[Turn]] = {}
    for turn in turns:
        children.setdefault(containers[turn.span_id], []).append(turn)

    resolved: dict[str, list[Turn]] = {}
    # Bottom-up without recursion (a hostile record may chain a thousand parents): children before parents.
    order: list[Turn] = []
    stack = list(children.get(None, ()))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(children.get(node.span_id, ()))
    for node in reversed(order):
        below = _merge_steps([t for child in children.get(node.span_id, ()) for t in resolved.pop(child.span_id)])
        spoken = [t for t in below if _has_content(t)]
        if not below or not (_has_content(node) or spoken):
            # Nothing below it (or nothing with text: an agent run of several calls with content capture off, ADK's
            # invoke_agent around a tool call and the answer) is one exchange: the span itself.
            resolved[node.span_id] = [node]
        elif not _has_content(node):
            resolved[node.span_id] = below
        elif len(spoken) <= 1 or _steps_of(node, spoken):
            # Calls below a span with text, of which at most one has text (Semantic Kernel: its chat spans carry none,
            # the agent span has the question and answer), or all of which ask its question (an agent loop's steps,
            # DSPy's ReAct), are the steps of its one exchange: the span's text, a missing side from the last step.
            resolved[node.span_id] = [_merge(node, spoken[-1])] if spoken else [node]
        else:
            resolved[node.span_id] = below
    return _merge_steps([t for root in children.get(None, ()) for t in resolved.pop(root.span_id)])
