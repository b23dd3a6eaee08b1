"""A traced async streaming agent: chunks are joined into the turn's output; the span ends with the stream.

TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS=localhost:9092 python examples/streaming_agent.py
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from tracejudge.tracer import conversation, setup_tracing, traced_agent


@traced_agent("streaming-bot", session_id_arg=None)
async def stream_answer(question: str) -> AsyncIterator[str]:
    for word in f"You asked: {question}. Here is a streamed answer.".split():
        await asyncio.sleep(0.01)
        yield word + " "


async def main() -> None:
    provider = setup_tracing("example-streaming-agent", topic=os.environ.get("TRACEJUDGE_TOPIC", "otlp_spans"))
    async with conversation("streaming-demo-1", agent="streaming-bot", end=True):
        for question in ("What is tracejudge?", "Does it stream?"):
            print("".join([chunk async for chunk in stream_answer(question)]))
    provider.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
