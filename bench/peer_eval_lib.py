"""Run inside the peers' venv (eval-ai-library 0.8.2): its own evaluate_conversations on the same judge server.

Prints one JSON line: elapsed seconds and how many results came back. Not imported by tracejudge.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time


def main() -> None:
    conversations_count, turns = int(sys.argv[1]), int(sys.argv[2])
    from eval_lib import (
        ConversationalEvalTestCase,
        ConversationalFlowRateMetric,
        EvalTestCase,
        FailureRateMetric,
        evaluate_conversations,
    )

    conversations = [
        ConversationalEvalTestCase(
            turns=[
                EvalTestCase(input=f"conversation {c} question {t}", actual_output=f"answer {t} of conversation {c}")
                for t in range(turns)
            ]
        )
        for c in range(conversations_count)
    ]
    metrics = [FailureRateMetric(model="gpt-4o-mini"), ConversationalFlowRateMetric(model="gpt-4o-mini")]
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        results = asyncio.run(evaluate_conversations(conversations, metrics, verbose=False))
    elapsed = time.perf_counter() - started
    print(json.dumps({"elapsed_s": elapsed, "results": len(results)}))


if __name__ == "__main__":
    main()
