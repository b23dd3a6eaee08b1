"""A traced sync support agent: every answer is one turn, every chat one conversation.

TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS=localhost:9092 python examples/support_agent.py
"""

from __future__ import annotations

import itertools
import os
import time
import uuid

from tracejudge.tracer import conversation, setup_tracing, traced_agent

FAQ = {
    "reset": "I've sent a password reset link to the e-mail address on your account.",
    "refund": "Refunds are possible within 30 days of purchase; I can start one for you.",
    "hours": "Our support team is available 9:00-18:00 CET on weekdays.",
}


@traced_agent("support-bot", session_id_arg=None)  # the conversation comes from the block
def answer(question: str) -> str:
    for keyword, reply in FAQ.items():
        if keyword in question.lower():
            return reply
    return "I'm not sure about that. I can connect you with a human colleague if you like."


def main() -> None:
    provider = setup_tracing(
        os.environ.get("OTEL_SERVICE_NAME", "example-support-agent"),
        topic=os.environ.get("TRACEJUDGE_TOPIC", "otlp_spans"),
    )
    chats = [
        ["How do I reset my password?", "Thanks!"],
        ["Can I get a refund?", "What are your hours?"],
        ["What is the airspeed of an unladen swallow?"],
    ]
    for chat in itertools.islice(itertools.cycle(chats), int(os.environ.get("EXAMPLE_CHATS", "1000000"))):
        with conversation(uuid.uuid4().hex, agent="support-bot", end=True):
            for question in chat:
                print(question, "->", answer(question))
        time.sleep(float(os.environ.get("EXAMPLE_PAUSE_S", "2")))
    provider.shutdown()


if __name__ == "__main__":
    main()
