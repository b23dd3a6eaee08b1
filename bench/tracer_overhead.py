"""Cost per traced turn: no tracing, the same span by hand with the bare SDK, @traced_agent, Langfuse's @observe.

The hand-written span and @traced_agent share one TracerProvider with one BatchSpanProcessor whose exporter discards
(we measure the application's thread, not the network). Langfuse exports to a closed local port, as it would with
its server down.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from bench._stats import Figure, alternate
from tracejudge.tracer import traced_agent


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _answer(question: str) -> str:
    return f"Here is what I found about {question[:20]}."


def build_variants(calls: int) -> tuple[dict[str, Callable[[], float]], list[Callable[[], None]]]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")
    questions = [f"question number {i} about billing" for i in range(calls)]

    def plain(question: str, session_id: str) -> str:
        return _answer(question)

    def by_hand(question: str, session_id: str) -> str:
        with tracer.start_as_current_span(
            "invoke_agent bench",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "bench",
                "gen_ai.conversation.id": session_id,
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": question}]}], ensure_ascii=False
                ),
            },
        ) as span:
            answer = _answer(question)
            span.set_attribute(
                "gen_ai.output.messages",
                json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}],
                    ensure_ascii=False,
                ),
            )
            return answer

    traced = traced_agent("bench", tracer_provider=provider)(plain)

    def timed(function: Callable[[str, str], str]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for question in questions:
                function(question, "conversation-1")
            return (time.perf_counter() - started) / calls * 1e6

        return run

    variants = {"no tracing": timed(plain), "hand-written span": timed(by_hand), "@traced_agent": timed(traced)}
    closers: list[Callable[[], None]] = [provider.shutdown]
    langfuse = _langfuse_variant()
    if langfuse is not None:
        observed, close = langfuse
        variants["langfuse @observe"] = timed(observed)
        closers.append(close)
    return variants, closers


def _langfuse_variant() -> tuple[Callable[[str, str], str], Callable[[], None]] | None:
    try:
        from tracejudge.consumer.embedded_broker import free_port

        os.environ.setdefault("LANGFUSE_PUBLIC_KEY", "pk-lf-bench")
        os.environ.setdefault("LANGFUSE_SECRET_KEY", "sk-lf-bench")
        closed = f"http://127.0.0.1:{free_port()}"
        os.environ["LANGFUSE_HOST"] = closed
        os.environ["LANGFUSE_BASE_URL"] = closed
        from langfuse import get_client, observe
    except ImportError:
        return None

    @observe(name="bench")
    def observed(question: str, session_id: str) -> str:
        return _answer(question)

    client = get_client()
    return observed, client.shutdown


def run(calls: int = 20_000, rounds: int = 5) -> dict[str, Any]:
    variants, closers = build_variants(calls)
    for function in variants.values():  # warm up
        function()
    figures: dict[str, Figure] = alternate(variants, rounds, unit="µs/call")
    for close in closers:
        try:
            close()
        except Exception:
            pass
    baseline = figures["hand-written span"].median
    none = figures["no tracing"].median
    return {
        "calls_per_run": calls,
        "figures": {name: figure.as_dict() for name, figure in figures.items()},
        "ratio_to_hand_written": {name: f.median / baseline for name, f in figures.items()},
        "added_cost_us": {name: f.median - none for name, f in figures.items()},
        "goal": "@traced_agent at most 1.2x the hand-written span",
        "goal_met": figures["@traced_agent"].median <= 1.2 * baseline,
    }


if __name__ == "__main__":
    print(json.dumps(run(calls=5_000, rounds=5), indent=2))
