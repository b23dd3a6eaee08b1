"""Judge input tokens per judged conversation, and the share in a cacheable static prefix, against the seeds'
library's prompts for the same conversations (counted with litellm.token_counter)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from bench._peers import peers_python
from tests.support.judge_server import JudgeServer, Reply

ROOT = Path(__file__).resolve().parents[1]

_PEER = r"""
import asyncio, contextlib, io, json, sys
from eval_lib import (ConversationalEvalTestCase, ConversationalFlowRateMetric, EvalTestCase, FailureRateMetric,
                      evaluate_conversations)
conversations = [ConversationalEvalTestCase(turns=[EvalTestCase(input=q, actual_output=a) for q, a in turns])
                 for turns in json.loads(sys.argv[1])]
metrics = [FailureRateMetric(model="gpt-4o-mini"), ConversationalFlowRateMetric(model="gpt-4o-mini")]
with contextlib.redirect_stdout(io.StringIO()):
    asyncio.run(evaluate_conversations(conversations, metrics, verbose=False))
"""


def _kind(request: dict[str, Any]) -> str:
    """Either library's Flow prompt lists the label `fully`; neither Failure Rate prompt has that word."""
    return "conversational_flow" if re.search(r"\bfully\b", _flatten(request)) else "failure_rate"


def _answer(request: dict[str, Any]) -> Reply:
    label = "fully" if _kind(request) == "conversational_flow" else "not_applicable"
    return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "bench"}))


def _common_prefix(texts: list[str]) -> str:
    if not texts:
        return ""
    prefix = texts[0]
    for text in texts[1:]:
        while not text.startswith(prefix):
            prefix = prefix[: len(prefix) - max(1, len(prefix) // 50)] if len(prefix) > 200 else prefix[:-1]
    return prefix


def _flatten(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request.get("messages", []))


def capture(conversations: list[list[tuple[str, str]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests each library really sends to judge these conversations with both metrics: (ours, theirs).

    Theirs is empty when the seeds' library cannot be installed here.
    """
    from tracejudge.metrics import (
        ConversationalEvalTestCase,
        ConversationalFlowRateMetric,
        EvalTestCase,
        FailureRateMetric,
        evaluate_conversations,
    )

    server = JudgeServer(responder=_answer).start()
    os.environ.update({"OPENAI_BASE_URL": server.base_url, "OPENAI_API_BASE": server.base_url, "OPENAI_API_KEY": "sk"})
    cases = [
        ConversationalEvalTestCase(turns=[EvalTestCase(input=q, actual_output=a) for q, a in t]) for t in conversations
    ]
    asyncio.run(
        evaluate_conversations(cases, [FailureRateMetric("gpt-4o-mini"), ConversationalFlowRateMetric("gpt-4o-mini")])
    )
    ours = list(server.requests)
    server.requests.clear()
    peer = peers_python()
    theirs: list[dict[str, Any]] = []
    if peer is not None:
        subprocess.run(
            [str(peer), "-c", _PEER, json.dumps(conversations)],
            env={**os.environ, "PYTHONPATH": ""},
            check=True,
            timeout=300,
        )
        theirs = list(server.requests)
    server.stop()
    return ours, theirs


def static_prefixes(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Per metric, the text every request shares from its start: ours is the system message; theirs, whatever their
    prompts have in common before the conversation."""
    texts: dict[str, list[str]] = {}
    for request in theirs:
        texts.setdefault(_kind(request), []).append(_flatten(request))
    return {_kind(r): r["messages"][0]["content"] for r in ours}, {k: _common_prefix(t) for k, t in texts.items()}


def run() -> dict[str, Any]:
    import litellm

    from tracejudge.consumer.cli.demo import SCENARIOS

    conversations = [list(s.turns) for s in SCENARIOS]
    ours, theirs = capture(conversations)
    our_static, their_static = static_prefixes(ours, theirs)

    def summarise(requests: list[dict[str, Any]], static: dict[str, str]) -> dict[str, Any]:
        totals = [litellm.token_counter(model="gpt-4o-mini", messages=r["messages"]) for r in requests]
        prefixes = [litellm.token_counter(model="gpt-4o-mini", text=static[_kind(r)]) for r in requests]
        return {
            "judge_calls": len(requests),
            "input_tokens_per_call": sum(totals) / len(totals),
            "input_tokens_per_conversation": sum(totals) / (len(requests) / 2),
            "static_prefix_tokens_per_call": sum(prefixes) / len(prefixes),
            "cacheable_share": sum(prefixes) / sum(totals),
        }

    # Ours: the system message is the static prefix. Theirs: whatever their prompts share from the start.
    out: dict[str, Any] = {
        "conversations": len(conversations),
        "tracejudge": summarise(ours, our_static),
    }
    if theirs:
        out["eval-ai-library 0.8.2"] = summarise(theirs, their_static)
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
