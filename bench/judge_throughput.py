"""Judge throughput: 100 conversations x 2 metrics against a local OpenAI-compatible server with a fixed 200 ms
latency, at concurrency 16; against the limit (calls x latency / concurrency) and the seeds' library."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._peers import peers_python
from bench._stats import alternate
from tracejudge.metrics import (
    ConversationalEvalTestCase,
    ConversationalFlowRateMetric,
    EvalTestCase,
    FailureRateMetric,
    evaluate_conversations,
)
from tracejudge.metrics._judge import parse_answer

ROOT = Path(__file__).resolve().parents[1]
LATENCY_S = 0.2
CONCURRENCY = 16


def conversations(count: int, turns: int) -> list[ConversationalEvalTestCase]:
    return [
        ConversationalEvalTestCase(
            turns=[
                EvalTestCase(input=f"conversation {c} question {t}", actual_output=f"answer {t} of conversation {c}")
                for t in range(turns)
            ]
        )
        for c in range(count)
    ]


def own_overhead_ms(cases: list[ConversationalEvalTestCase]) -> float:
    """Our own CPU per judge call, LiteLLM excluded: building the messages and parsing the answer."""
    metric = FailureRateMetric("gpt-4o-mini")
    reply = json.dumps({"verdict": "stall", "evidence": ["turn 1"], "reason": "x"})
    started = time.process_time()
    rounds = 2_000
    for i in range(rounds):
        metric.build_messages(cases[i % len(cases)])
        parse_answer(reply, metric.labels)
    return (time.process_time() - started) / rounds * 1e3


def run(count: int = 100, turns: int = 3, rounds: int = 5, *, with_peer: bool = True) -> dict[str, Any]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.judge_server", str(LATENCY_S)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert server.stdout is not None
    base_url = server.stdout.readline().strip()
    os.environ.update({"OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url, "OPENAI_API_KEY": "sk-bench"})
    cases = conversations(count, turns)
    metrics = [FailureRateMetric("gpt-4o-mini"), ConversationalFlowRateMetric("gpt-4o-mini")]
    calls = count * len(metrics)
    limit = calls * LATENCY_S / CONCURRENCY
    loop = asyncio.new_event_loop()
    cpu_per_call: list[float] = []

    def ours() -> float:
        cpu = time.process_time()
        started = time.perf_counter()
        results = loop.run_until_complete(evaluate_conversations(cases, metrics, max_concurrency=CONCURRENCY))
        elapsed = time.perf_counter() - started
        cpu_per_call.append((time.process_time() - cpu) / calls * 1e3)
        assert all(m.error is None for r in results for m in r.metrics), "a judge call failed during the benchmark"
        return elapsed

    variants: dict[str, Any] = {"tracejudge evaluate_conversations": ours}
    peer = peers_python() if with_peer else None
    if peer is not None:

        def seeds_library() -> float:
            env = {**os.environ, "PYTHONPATH": ""}
            completed = subprocess.run(
                [str(peer), str(ROOT / "bench" / "peer_eval_lib.py"), str(count), str(turns)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if completed.returncode != 0:
                raise RuntimeError(completed.stderr[-2000:])
            return float(json.loads(completed.stdout.strip().splitlines()[-1])["elapsed_s"])

        variants["eval-ai-library 0.8.2 evaluate_conversations"] = seeds_library
    ours()  # warm up: LiteLLM import and connection pool
    cpu_per_call.clear()
    figures = alternate(variants, rounds, unit="s")
    loop.close()
    server.terminate()
    server.wait(10)
    ours_median = figures["tracejudge evaluate_conversations"].median
    out: dict[str, Any] = {
        "calls": calls,
        "latency_s": LATENCY_S,
        "concurrency": CONCURRENCY,
        "limit_s": limit,
        "figures": {name: f.as_dict() for name, f in figures.items()},
        "ours_vs_limit": limit / ours_median,
        "cpu_ms_per_call_total": sorted(cpu_per_call)[len(cpu_per_call) // 2],
        "own_overhead_ms_per_call": own_overhead_ms(cases),
        "goal": "at least 0.8x the limit; own overhead under 3 ms per call",
    }
    out["goal_met"] = out["ours_vs_limit"] >= 0.8 and out["own_overhead_ms_per_call"] < 3
    peer_name = "eval-ai-library 0.8.2 evaluate_conversations"
    if peer_name in figures:
        out["speedup_vs_seeds_library"] = figures[peer_name].median / ours_median
    return out


if __name__ == "__main__":
    sys.stdout.write(json.dumps(run(count=100, rounds=3, with_peer=False), indent=2) + "\n")
