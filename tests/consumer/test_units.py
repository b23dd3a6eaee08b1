"""Unit-level: configuration precedence and validation, sampling, offsets, session assembly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.cli import build_parser, settings_from_args
from tracejudge.consumer.offsets import OffsetTracker
from tracejudge.consumer.sampling import Sampler, sample_point
from tracejudge.consumer.sessions import SessionStore


def test_flag_beats_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEJUDGE_TOPIC", "from-env")
    monkeypatch.setenv("TRACEJUDGE_SAMPLE_RATE", "0.25")
    monkeypatch.setenv("TRACEJUDGE_AGENT_SAMPLE_RATES", "a=0.1,b=1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    parser = build_parser()
    settings = settings_from_args(
        parser.parse_args(["consume", "--topic", "from-flag", "--agent-sample-rate", "c=0.5"])
    )
    assert settings.topic == "from-flag"  # flag
    assert settings.sample_rate == 0.25  # environment
    assert settings.agent_sample_rates == {"c": 0.5}  # the flag replaces the environment's list
    assert settings.otlp_endpoint == "http://collector:4318"
    assert settings.group_id == "tracejudge" and settings.metrics_port == 9464  # defaults
    assert settings.start_from == "latest" and settings.max_concurrency == 16
    assert settings.metrics == ["failure_rate", "conversational_flow"]


@pytest.mark.parametrize(
    "args",
    [
        ["--sample-rate", "1.5"],
        ["--agent-sample-rate", "bot=2"],
        ["--metrics", "failure_rate,toxicity"],
        ["--kafka-config", "not-a-pair"],
        ["--max-concurrency", "0"],
        ["--start-from", "middle"],
    ],
)
def test_invalid_configuration_exits_2_with_one_line(args: list[str]) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "consume", *args], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 2
    assert len(completed.stderr.strip().splitlines()) == 1 and "invalid configuration" in completed.stderr


def test_sampling_is_deterministic_and_per_agent() -> None:
    from tests.consumer.test_outputs import job

    ids = [f"conv-{i}" for i in range(2_000)]
    assert [sample_point(i) for i in ids] == [sample_point(i) for i in ids]
    share = sum(sample_point(i) < 0.3 for i in ids) / len(ids)
    assert 0.25 < share < 0.35
    sampler = Sampler(0.0, {"vip": 1.0})
    assert sampler.should_judge(job("x", agent="vip")) and not sampler.should_judge(job("x", agent="other"))


def test_offsets_never_pass_a_held_record() -> None:
    tracker = OffsetTracker()
    tracker.consumed(0, 10)
    tracker.hold("a", 0, 3)
    tracker.hold("b", 0, 7)
    assert tracker.committable() == {0: 3}
    tracker.release("a")
    assert tracker.committable() == {0: 7}
    tracker.release("b")
    assert tracker.committable() == {0: 10}
    tracker.forget_partitions({0})
    assert tracker.committable() == {}


def turn(span_id: str, index: int) -> Turn:
    return Turn(span_id, "t" * 32, "", index, index + 1, f"q{index}", f"a{index}", index=index)


def test_sessions_dedupe_cap_and_continuation() -> None:
    store = SessionStore(max_turns=3, idle_timeout_s=10)
    assert store.apply(ConversationEvent("c", "bot", turn("s0", 0)), 0, 5, 0.0) is not None
    assert store.apply(ConversationEvent("c", "bot", turn("s0", 0)), 0, 6, 0.0) is None  # duplicate span
    assert store.counts.duplicate_spans == 1
    store.apply(ConversationEvent("c", "bot", turn("s1", 1)), 0, 6, 0.0)
    store.apply(ConversationEvent("c", "bot", turn("s2", 2)), 0, 7, 0.0)  # the cap completes it
    (job,) = store.take_ready()
    assert job.truncated and job.version == 3 and job.completed_by == "turn_cap"
    store.finished(job)
    store.apply(ConversationEvent("c", "bot", turn("s3", 3)), 0, 8, 1.0)
    assert len(store.open["c"].turns) == 1  # after a cap, the next window starts empty
    store.apply(ConversationEvent("c", "bot", ended=True), 0, 9, 1.0)
    (second,) = store.take_ready()
    assert second.version == 4 and second.completed_by == "end_marker"
    store.apply(ConversationEvent("idle", "bot", turn("x0", 0)), 1, 1, 2.0)
    assert store.expire_idle(11.0) == [] and store.take_ready() == []  # 9 s idle: not yet
    assert store.expire_idle(12.5) == [] and store.take_ready()[0].completed_by == "idle_timeout"
