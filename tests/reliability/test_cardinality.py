"""100,000 distinct agent names produce at most --max-agents + 1 label values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.consumer.test_outputs import job, verdict
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.judging.judgement import Judgement


def test_hundred_thousand_agents() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerInstruments(registry, max_agents=200)
    result = [verdict("failure_rate", "stall", 0.4)]
    for i in range(100_000):
        metrics.record_judgement(Judgement(job(f"c{i}", agent=f"agent-{i}\n\x00{'x' * (i % 300)}"), "judged", result))
    agents = {s.labels["agent"] for f in registry.collect() for s in f.samples if "agent" in s.labels}
    assert len(agents) == 201 and "_other" in agents
    assert all(len(a) <= 1_000 for a in agents)
    assert (
        registry.get_sample_value(
            "tracejudge_verdicts_total", {"agent": "_other", "metric": "failure_rate", "verdict": "stall"}
        )
        == 100_000 - 200
    )
