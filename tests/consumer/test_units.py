"""Unit-level: configuration precedence and validation, sampling, offsets, session assembly."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tracejudge.consumer.adapters import ConversationEvent, Turn
from tracejudge.consumer.cli.options import settings_from_args
from tracejudge.consumer.cli.parser import build_parser
from tracejudge.consumer.conversation.job import JudgeJob
from tracejudge.consumer.conversation.table import ConversationTable
from tracejudge.consumer.judging.sampling import Sampler, sample_point
from tracejudge.consumer.offsets import OffsetTracker


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


def test_sample_points_are_pinned_and_sampling_is_per_agent() -> None:
    from tests.consumer.test_outputs import job

    ids = [f"conv-{i}" for i in range(2_000)]
    assert [sample_point(i) for i in ids] == [sample_point(i) for i in ids]
    # Pinned values: every replica and every restart must draw the same point (a per-process hash() would not).
    assert sample_point("conv-0") == 0.2574288113682099
    assert sample_point("conv-1") == 0.6011535271499797
    assert sample_point("conv-42") == 0.08855837034586184
    assert sample_point("\u00e9t\u00e9-\ud800") == 0.1952590122370766  # not UTF-8 clean: still a stable point
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


def completed(*conversation_ids: str) -> list[JudgeJob]:
    """One-turn conversations, each completed by its end marker."""
    table = ConversationTable(idle_timeout_s=10)
    for cid in conversation_ids:
        table.apply(ConversationEvent(cid, "bot", turn(f"{cid}-0", 0), ended=True), 0)
    return [dispatch.job for dispatch in table.take_dispatches()]


def test_sessions_dedupe_cap_and_continuation() -> None:
    table = ConversationTable(max_turns=3, idle_timeout_s=10)
    table.apply(ConversationEvent("c", "bot", turn("s0", 0)), 0)
    table.apply(ConversationEvent("c", "bot", turn("s0", 0)), 0)  # duplicate span
    assert table.counts["duplicate_spans"] == 1
    table.apply(ConversationEvent("c", "bot", turn("s1", 1)), 0)
    table.apply(ConversationEvent("c", "bot", turn("s2", 2)), 0)  # the cap completes it
    (job,) = [d.job for d in table.take_dispatches()]
    assert job.truncated and job.version == 3 and job.completed_by == "turn_cap"
    table.verdict("c", job.content_id, "judged", 0)
    table.apply(ConversationEvent("c", "bot", turn("s3", 3)), 1_000)
    state = table.get("c")
    assert state is not None and len(state.spans) == 1  # after a cap, the next window starts empty
    table.apply(ConversationEvent("c", "bot", ended=True), 1_000)
    (second,) = [d.job for d in table.take_dispatches()]
    assert second.version == 4 and second.completed_by == "end_marker"
    table.apply(ConversationEvent("idle", "bot", turn("x0", 0)), 2_000)
    table.advance(11_000)
    assert table.take_dispatches() == []  # 9 s idle: not yet
    table.advance(12_500)
    assert table.take_dispatches()[0].job.completed_by == "idle_timeout"


def test_idleness_is_decided_by_the_clock_passed_in_not_by_when_expiry_runs() -> None:
    """A turn that comes after an idle gap completes the earlier version first (the live consumer and backfill read
    the same record timestamps, so they give the same versions), even if `advance` did not run in the gap."""
    table = ConversationTable(idle_timeout_s=10)
    table.apply(ConversationEvent("c", "bot", turn("s0", 0)), 0)
    table.apply(ConversationEvent("c", "bot", turn("s1", 1)), 9_000)  # 9 s: the same version
    table.apply(ConversationEvent("c", "bot", turn("s2", 2)), 19_500)  # 10.5 s idle: version 2 completes first
    (first,) = [d.job for d in table.take_dispatches()]
    assert first.version == 2 and first.completed_by == "idle_timeout"
    table.apply(ConversationEvent("c", "bot", ended=True), 20_000)
    (second,) = [d.job for d in table.take_dispatches()]
    assert second.version == 3 and second.completed_by == "end_marker"
    # Record timestamps are only roughly ordered: an earlier-stamped record never moves activity back.
    table.apply(ConversationEvent("late", "bot", turn("l0", 0)), 30_000)
    table.apply(ConversationEvent("late", "bot", turn("l1", 1)), 25_000)
    table.apply(ConversationEvent("late", "bot", turn("l2", 2)), 36_000)  # 6 s after the latest: one version
    table.advance(39_000)
    assert table.take_dispatches() == []


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_judge_pool_stop_drains_cancels_and_closes_its_loop() -> None:
    """stop(): judgements done within the grace period finish, the rest are cancelled; the loop closed, thread gone."""
    import asyncio

    from tracejudge.consumer.judging.pool import JudgePool
    from tracejudge.metrics import MetricResult

    class Judge:
        name = "failure_rate"

        async def evaluate(self, case):  # type: ignore[no-untyped-def]
            if case.name == "slow":
                await asyncio.sleep(60)
            return MetricResult(name=self.name, threshold=0.5, model="m", score=1.0, verdict="honest_fallback")

    fast, slow = completed("fast", "slow")
    done: list[str] = []
    pool = JudgePool([Judge()], lambda j: done.append(j.job.conversation_id)).start()  # type: ignore[list-item]
    pool.submit(fast)
    pool.submit(slow)
    assert pool.stop(0.3) is False  # the slow one was still running at the end of the grace period
    assert done == ["fast"] and pool.pending == 0 and not pool._thread.is_alive() and pool._loop.is_closed()
    finished = JudgePool([Judge()], lambda j: done.append(j.job.conversation_id)).start()  # type: ignore[list-item]
    finished.submit(fast)
    assert finished.stop(5.0) is True and finished._loop.is_closed()
    assert finished.stop(5.0) is True  # twice: nothing left to stop

    never_started = JudgePool([Judge()], lambda j: None)  # type: ignore[list-item]
    assert never_started.stop(5.0) is True and never_started._loop.is_closed()

    # From its own thread (an on_done callback) stop() refuses at once instead of waiting on its own loop.
    errors: list[BaseException] = []

    def stop_from_callback(judgement: object) -> None:
        try:
            inside.stop(5.0)
        except RuntimeError as exc:
            errors.append(exc)

    inside = JudgePool([Judge()], stop_from_callback).start()  # type: ignore[list-item]
    started = time.monotonic()
    inside.submit(fast)
    while inside.pending and time.monotonic() - started < 5:
        time.sleep(0.01)
    assert len(errors) == 1 and time.monotonic() - started < 2
    assert inside.stop(5.0) is True and inside._loop.is_closed()


def test_delivery_queues_every_judgement_even_when_recording_it_raises() -> None:
    """A judgement never queued would hold its conversation's offset forever: a raising feedback join or Prometheus
    update is logged, and the judgement still reaches `drain()` once its outputs are durable."""
    import threading

    from tracejudge.consumer.emit.delivery import Delivery
    from tracejudge.consumer.judging.judgement import OUTCOME_JUDGED, OUTCOME_SAMPLED_OUT, Judgement

    class Raising:
        def record_judgement(self, judgement: object) -> None:
            raise ValueError("bad label")

        def verdicts(self, judgement: object) -> None:
            raise KeyError("bad verdict")

    acknowledged = threading.Event()

    class Sink:
        def emit(self, judgement: object) -> list[threading.Event]:
            return [acknowledged]

    a, b = completed("a", "b")
    delivery = Delivery(Raising(), [Sink()], feedback=Raising())  # type: ignore[arg-type]
    delivery.judged(Judgement(a, OUTCOME_JUDGED))
    delivery.not_judged(Judgement(b, OUTCOME_SAMPLED_OUT))
    finished: list[str] = []
    delivery.drain(lambda j: finished.append(j.job.conversation_id))
    assert finished == [] and delivery.awaiting == 2  # not durable yet: still waiting
    acknowledged.set()
    delivery.drain(lambda j: finished.append(j.job.conversation_id))
    assert finished == ["a", "b"] and delivery.awaiting == 0 and delivery.judgements == 1


def test_a_raising_sink_is_counted_and_heard_and_the_others_still_deliver(caplog: pytest.LogCaptureFixture) -> None:
    """A sink's own exception costs that sink's output only: counted under output="sink", one rate-limited line
    naming the sink, and the judgement still goes to the other sinks and on to `drain()`."""
    from prometheus_client import CollectorRegistry

    from tracejudge.consumer.emit.delivery import Delivery
    from tracejudge.consumer.emit.prometheus import ConsumerInstruments
    from tracejudge.consumer.judging.judgement import OUTCOME_JUDGED, Judgement

    class BrokenSink:
        def emit(self, judgement: object) -> None:
            raise RuntimeError("sink bug")

    received: list[str] = []

    class Sink:
        def emit(self, judgement: Judgement) -> None:
            received.append(judgement.job.conversation_id)

    registry = CollectorRegistry()
    delivery = Delivery(ConsumerInstruments(registry), [BrokenSink(), Sink()])
    with caplog.at_level("WARNING", logger="tracejudge.consumer"):
        for job in completed("a", "b", "c"):
            delivery.judged(Judgement(job, OUTCOME_JUDGED))
    finished: list[str] = []
    delivery.drain(lambda j: finished.append(j.job.conversation_id))
    assert received == finished == ["a", "b", "c"]
    assert registry.get_sample_value("tracejudge_output_errors_total", {"output": "sink"}) == 3
    lines = [r.getMessage() for r in caplog.records if "BrokenSink" in r.getMessage()]
    assert len(lines) == 1 and "fix the sink" in lines[0]  # rate-limited: three failures, one line
