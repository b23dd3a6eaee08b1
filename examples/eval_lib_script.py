"""A script written against eval_lib 0.8.2 (PyPI eval-ai-library) that reads its results, migrated by one line.

Only the import line changed: it read `from eval_lib import (`. The checks restate eval-ai-library 0.8.2's own tests
of FailureRateMetric, ConversationalFlowRateMetric and evaluate_conversations (their patched LLM call replaced by a
CustomLLMClient), read a batch's results the way a report script does, then judge one conversation through a model
string (LiteLLM) against an OpenAI-compatible server. Prints "all assertions held" on success.

It needs that server, and says so in one line (exit 2) when none is configured:
  OPENAI_API_KEY=sk-... python examples/eval_lib_script.py                      # api.openai.com, gpt-4o-mini
  OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=placeholder JUDGE_MODEL=my-model \\
    python examples/eval_lib_script.py                                          # vLLM, Ollama, a LiteLLM proxy...
"""

import asyncio
import json
import os
import sys

from tracejudge.metrics.compat import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    CustomLLMClient,
    EvalTestCase,
    FailureRateMetric,
    evaluate_conversations,
)


class ScriptedLLM(CustomLLMClient):
    """A judge that answers from a script: queued (text, cost) replies first, then by a keyword in the prompt."""

    def __init__(self, replies=(), by_keyword=None, cost=0.002):
        self.replies = list(replies)
        self.by_keyword = by_keyword or {}
        self.cost = cost
        self.call_count = 0

    async def chat_complete(self, messages, temperature):
        self.call_count += 1
        if self.replies:
            return self.replies.pop(0)
        prompt = "\n".join(message["content"] for message in messages)
        for keyword, answer in self.by_keyword.items():
            if keyword in prompt:
                return json.dumps(answer), self.cost
        raise AssertionError("no scripted answer for this prompt")

    def get_model_name(self):
        return "scripted-judge"


def turn(user, assistant):
    return EvalTestCase(input=user, actual_output=assistant)


def conversation(*turns, chatbot_role=None):
    return ConversationalEvalTestCase(turns=list(turns), chatbot_role=chatbot_role)


async def judge_once(metric_class, answer, turns):
    llm = ScriptedLLM(replies=[(json.dumps(answer), 0.003)])
    result = await metric_class(model=llm, threshold=0.7).evaluate(conversation(*turns))
    assert llm.call_count == 1
    return result


# ---- The metrics on their own: `await metric.evaluate(case)` returns a dict -------------------------------------


async def failure_rate_cases():
    honest = await judge_once(
        FailureRateMetric,
        {"verdict": "honest_fallback", "evidence": ["I don't know X."], "reason": "Admitted it did not know."},
        [turn("What's X?", "I don't know X."), turn("How to find out?", "Check the official docs.")],
    )
    assert honest["success"] is True and honest["score"] == 1.0

    fabricated = await judge_once(
        FailureRateMetric,
        {"verdict": "hallucination", "evidence": ["Einstein in 1923."], "reason": "Invented a fact and a source."},
        [turn("Who invented X?", "Einstein in 1923."), turn("Source?", "Nature vol. 42.")],
    )
    assert fabricated["score"] == 0.0 and fabricated["success"] is False

    nothing_to_test = await judge_once(
        FailureRateMetric,
        {"verdict": "not_applicable", "evidence": [], "reason": "No uncertainty arose."},
        [turn("2+2?", "4."), turn("Capital of France?", "Paris.")],
    )
    assert nothing_to_test["score"] == 1.0 and nothing_to_test["success"] is True
    for result in (honest, fabricated, nothing_to_test):
        assert {"score", "success", "reason", "evaluation_cost", "evaluation_log"} <= set(result)
        assert result["evaluation_cost"] == 0.003
    assert honest["reason"] == "Admitted it did not know."


async def conversational_flow_cases():
    smooth = await judge_once(
        ConversationalFlowRateMetric,
        {"verdict": "fully", "key_issues": [], "reason": "Natural throughout."},
        [turn("What's 2+2?", "4."), turn("And 3+3?", "6.")],
    )
    assert smooth["success"] is True and smooth["score"] == 1.0

    broken = await judge_once(
        ConversationalFlowRateMetric,
        {"verdict": "none", "key_issues": ["Ignored the request"], "reason": "Ignored the booking request."},
        [turn("Book me a flight", "What's your favorite color?"), turn("Just book it", "Could you clarify?")],
    )
    assert broken["success"] is False and broken["score"] == 0.0
    assert broken["evaluation_log"]["key_issues"] == ["Ignored the request"]


# ---- evaluate_conversations with a metric object of one's own ---------------------------------------------------


class MyConversationalMetric:
    """Any object with name, model, threshold, verbose and an async evaluate() returning eval_lib's dict."""

    name = "myConvMetric"

    def __init__(self, score=0.9, success=True):
        self.model = "my-model"
        self.threshold = 0.5
        self.verbose = False
        self.score = score
        self.success = success

    async def evaluate(self, conv_case):
        return {
            "name": self.name,
            "score": self.score,
            "success": self.success,
            "reason": "my reason",
            "evaluation_cost": 0.003,
        }


def greeting(chatbot_role="friendly assistant"):
    return conversation(turn("Hi", "Hello!"), turn("How are you?", "I am fine."), chatbot_role=chatbot_role)


async def own_metric_cases():
    results = await evaluate_conversations([greeting()], [MyConversationalMetric()], verbose=False)
    assert len(results) == 1
    _, conv_results = results[0]
    assert len(conv_results) == 1 and conv_results[0].success is True

    results = await evaluate_conversations([greeting() for _ in range(3)], [MyConversationalMetric()], verbose=False)
    assert len(results) == 3

    failing = MyConversationalMetric(score=0.2, success=False)
    _, conv_results = (await evaluate_conversations([greeting()], [failing], verbose=False))[0]
    assert conv_results[0].success is False

    _, conv_results = (await evaluate_conversations([greeting()], [MyConversationalMetric()], verbose=False))[0]
    dialogue = conv_results[0].dialogue
    assert len(dialogue) == 4
    assert dialogue[0]["role"] == "user" and dialogue[1]["role"] == "assistant"
    assert dialogue[3] == {"role": "assistant", "content": "I am fine."}
    row = conv_results[0].metrics_data[0]
    assert (row.name, row.score, row.threshold, row.success) == ("myConvMetric", 0.9, 0.5, True)
    assert (row.evaluation_cost, row.reason, row.evaluation_model, row.evaluation_log) == (
        0.003,
        "my reason",
        "my-model",
        None,
    )

    assert await evaluate_conversations([], [MyConversationalMetric()], verbose=False) == []


# ---- A report over a batch, reading every field -----------------------------------------------------------------

BILLING = conversation(
    turn("Why did ticket ZX-41 get charged twice?", "I can't see payment records, so I don't know."),
    turn("Who can check?", "The billing team can: billing@example.com, or the Payments page."),
    chatbot_role="billing assistant",
)
REFUND = conversation(
    turn("What is the refund window for ticket QV-77?", "Exactly 97 days, per policy R-9 from 2019."),
    turn("Where is that written?", "In section 12 of the policy."),
)


async def batch_report():
    failure_llm = ScriptedLLM(
        by_keyword={
            "ZX-41": {"verdict": "alternative_proposed", "evidence": ["turn 2"], "reason": "Pointed to billing."},
            "QV-77": {"verdict": "hallucination", "evidence": ["turn 1"], "reason": "Invented a policy."},
        },
        cost=0.002,
    )
    flow_llm = ScriptedLLM(
        by_keyword={
            "ZX-41": {"verdict": "mostly", "key_issues": [], "reason": "Direct and coherent."},
            "QV-77": {"verdict": "partial", "key_issues": ["turn 2: vague"], "reason": "Some friction."},
        },
        cost=0.001,
    )
    failure = FailureRateMetric(model=failure_llm, threshold=0.7)
    flow = ConversationalFlowRateMetric(model=flow_llm, threshold=0.7)
    results = await evaluate_conversations([BILLING, REFUND], [failure, flow], verbose=False)

    assert [first for first, _ in results] == [None, None]
    (_, [billing]), (_, [refund]) = results
    assert billing.success is True and refund.success is False
    assert billing.dialogue == [
        {"role": "user", "content": BILLING.turns[0].input},
        {"role": "assistant", "content": BILLING.turns[0].actual_output},
        {"role": "user", "content": BILLING.turns[1].input},
        {"role": "assistant", "content": BILLING.turns[1].actual_output},
    ]
    assert [row.name for row in billing.metrics_data] == [failure.name, flow.name]
    assert [row.name for row in billing.metrics_data] == ["failureRateMetric", "conversationalFlowRateMetric"]

    failure_row, flow_row = billing.metrics_data
    assert (failure_row.score, failure_row.success, failure_row.threshold) == (1.0, True, 0.7)
    assert failure_row.reason == "Pointed to billing."
    assert failure_row.evaluation_model is failure_llm
    assert failure_row.evaluation_cost == 0.002
    log = failure_row.evaluation_log
    assert log["verdict"]["verdict"] == "alternative_proposed" and log["evidence"] == ["turn 2"]
    assert log["number_of_turns"] == 2 and log["final_score"] == 1.0 and log["final_reason"] == "Pointed to billing."
    assert "ZX-41" in log["dialogue"]
    assert (flow_row.score, flow_row.success, flow_row.evaluation_log["key_issues"]) == (0.9, True, [])

    refund_failure, refund_flow = refund.metrics_data
    assert (refund_failure.score, refund_failure.success) == (0.0, False)
    assert (refund_flow.score, refund_flow.success) == (0.7, True)
    assert refund_flow.evaluation_log["key_issues"] == ["turn 2: vague"]

    total_cost = sum(row.evaluation_cost for _, [result] in results for row in result.metrics_data)
    assert round(total_cost, 6) == 0.006
    assert failure_llm.call_count == 2 and flow_llm.call_count == 2
    assert failure.verbose is False and flow.verbose is False  # the batch's verbose does not stick

    failing = [
        (result.dialogue[0]["content"], row.name, row.score, row.reason)
        for _, [result] in results
        for row in result.metrics_data
        if not row.success
    ]
    assert failing == [(REFUND.turns[0].input, "failureRateMetric", 0.0, "Invented a policy.")]


# ---- The same through a model string, against the configured OpenAI-compatible server ---------------------------

MODEL = os.environ.get("JUDGE_MODEL", "gpt-4o-mini")
# The scores each metric can give: a verdict's weight (a real model may pick any label).
FAILURE_RATE_SCORES = {0.0, 0.4, 0.6, 1.0}
FLOW_SCORES = {0.0, 0.3, 0.7, 0.9, 1.0}
NEEDS = (
    "eval_lib_script.py needs an OpenAI-compatible judge: set OPENAI_API_KEY (any placeholder for a local server), "
    "OPENAI_BASE_URL for a server other than api.openai.com (e.g. http://127.0.0.1:8000/v1) and JUDGE_MODEL "
    "(default gpt-4o-mini)"
)


def judge_missing():
    """Without a key LiteLLM refuses before any request: say what to set instead of failing half-way."""
    return not os.environ.get("OPENAI_API_KEY")


def where():
    return f"{MODEL} at {os.environ.get('OPENAI_BASE_URL') or 'api.openai.com'}"


async def through_a_model_string():
    failure = FailureRateMetric(model=MODEL)
    flow = ConversationalFlowRateMetric(model=MODEL, threshold=0.9)
    try:
        [(_, [result])] = await evaluate_conversations([BILLING], [failure, flow], verbose=False)
    except Exception as exc:  # eval_lib aborts the batch on a judge error; say which, in one line
        raise SystemExit(f"eval_lib_script.py: the judge {where()} failed: {type(exc).__name__}: {exc}") from None
    rows = result.metrics_data
    unscored = [row for row in rows if row.score is None]
    if unscored:
        raise SystemExit(f"eval_lib_script.py: the judge {where()} gave no verdict: {unscored[0].reason}")
    assert [(row.name, row.evaluation_model) for row in rows] == [
        ("failureRateMetric", MODEL),
        ("conversationalFlowRateMetric", MODEL),
    ]
    failure_row, flow_row = rows
    assert failure_row.score in FAILURE_RATE_SCORES and flow_row.score in FLOW_SCORES
    assert failure_row.success is (failure_row.score >= 0.7) and flow_row.success is (flow_row.score >= 0.9)
    assert result.success is (failure_row.success and flow_row.success)
    assert all(row.evaluation_cost >= 0 and row.reason for row in rows)  # a local server's model is unpriced: 0.0
    for row in rows:
        print(f"{row.name}: {row.score} ({row.reason})")


async def main():
    if judge_missing():
        print(NEEDS, file=sys.stderr)
        return 2
    await failure_rate_cases()
    await conversational_flow_cases()
    await own_metric_cases()
    await batch_report()
    await through_a_model_string()
    print("model string: ok")
    print("all assertions held")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
