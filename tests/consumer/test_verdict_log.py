"""The verdict log (consumer/emit/verdict_log.py), driven through the real Delivery with a fake clock and a fake
timer: under the rate a line per verdict; above it the first lines, then one summary a minute with the counts, the
minutes after it folded whole until a quiet minute; the metrics count every verdict either way."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from tests.consumer.test_outputs import job, verdict
from tests.support.judge_server import JudgeServer
from tracejudge.consumer.embedded_broker import EmbeddedBroker
from tracejudge.consumer.emit.delivery import Delivery
from tracejudge.consumer.emit.prometheus import ConsumerInstruments
from tracejudge.consumer.emit.verdict_log import VerdictLog, short
from tracejudge.consumer.judging.judgement import Judgement
from tracejudge.metrics import MetricResult


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Timers:
    """The timer a real VerdictLog starts, held here: the test fires it once its clock says the minute is over."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None], Timers.Handle]] = []

    class Handle:
        def __init__(self) -> None:
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    def __call__(self, delay_s: float, callback: Callable[[], None]) -> Timers.Handle:
        handle = Timers.Handle()
        self.armed.append((delay_s, callback, handle))
        return handle


@pytest.fixture
def setup(caplog: pytest.LogCaptureFixture) -> tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry]:
    caplog.set_level(logging.INFO, logger="tracejudge.consumer.verdicts")
    clock, timers, registry = Clock(), Timers(), CollectorRegistry()
    sink = VerdictLog(per_minute=3, clock=clock, schedule=timers)
    return Delivery(ConsumerInstruments(registry), [sink]), sink, clock, timers, registry


def judged(
    conversation: str, label: str = "hallucination", agent: str = "bot", reason: str = "made it up"
) -> Judgement:
    result = verdict("failure_rate", label, 0.0)
    result.reason = reason
    return Judgement(job(conversation, agent), "judged", [result])


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = [r.getMessage() for r in caplog.records if r.name == "tracejudge.consumer.verdicts"]
    caplog.clear()
    return found


def test_under_the_rate_each_verdict_is_one_line_with_its_reason_cut_short(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    delivery, _sink, clock, timers, registry = setup
    long_reason = "The agent promised a refund\nthat the policy " + "never allows " * 20
    delivery.judged(judged("chat-1", reason=long_reason))
    failed = MetricResult(name="conversational_flow", threshold=0.7, model="m")
    failed.error, failed.error_kind = "the judge answered 401", "auth"
    delivery.judged(Judgement(job("chat-2", "desk"), "failed", [failed]))
    delivery.not_judged(Judgement(job("chat-3"), "sampled_out"))  # not a verdict: no line
    clock.now += 30
    delivery.judged(judged("chat-4", label="honest_fallback", reason="said it did not know"))
    got = lines(caplog)
    assert len(got) == 3 and not timers.armed, got
    first = got[0]
    assert first.startswith("verdict: conversation chat-1 agent bot judge failure_rate verdict hallucination: ")
    reason = first.split("hallucination: ", 1)[1]
    assert "\n" not in reason and len(reason) == 100 and reason.endswith("…")
    assert reason.startswith("The agent promised a refund that the policy never allows")
    assert got[1] == (
        "verdict: conversation chat-2 agent desk judge conversational_flow verdict failed: auth: the judge answered 401"
    )
    assert got[2].endswith("verdict honest_fallback: said it did not know")
    get = registry.get_sample_value
    assert get("tracejudge_verdicts_total", {"agent": "bot", "metric": "failure_rate", "verdict": "hallucination"}) == 1
    assert get("tracejudge_output_errors_total", {"output": "sink"}) in (None, 0.0)  # the sink never raised


def test_above_the_rate_the_first_lines_then_one_summary_a_minute_until_a_quiet_minute(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    delivery, sink, clock, timers, registry = setup
    for i in range(10):  # minute 1: 10 verdicts, 3 a minute allowed
        delivery.judged(judged(f"c{i}", agent="bot" if i < 7 else "desk", label="stall" if i % 2 else "hallucination"))
        clock.now += 1
    got = lines(caplog)
    assert [line.split(" agent")[0] for line in got] == [f"verdict: conversation c{i}" for i in range(3)]
    (armed,) = timers.armed  # the first folded verdict armed the minute's end, no more timers after it
    delay, fire, _ = armed
    assert delay == pytest.approx(60 - 3)
    clock.now = 1000.0 + 59.5
    fire()  # early (a timer may be): nothing yet, and armed again for the rest of the minute
    assert lines(caplog) == [] and len(timers.armed) == 2 and timers.armed[1][0] == pytest.approx(0.5)
    clock.now = 1000.0 + 60.0
    timers.armed[1][1]()
    (summary,) = lines(caplog)
    assert summary == (
        "verdicts: 10 in the last 60 s (the first 3 logged above, 7 folded into this line: up to 3 a minute are logged "
        "one by one); by agent: bot 7, desk 3; by judge: failure_rate 10; by verdict: hallucination 5, stall 5"
    )
    # Minute 2 follows at once: the previous one was above the rate, so it is folded whole, and says so in its summary.
    timers.armed.clear()
    clock.now += 5
    for i in range(2):
        delivery.judged(judged(f"d{i}"))
    assert lines(caplog) == [] and len(timers.armed) == 1
    clock.now += 60
    timers.armed[0][1]()
    (summary,) = lines(caplog)
    assert summary.startswith("verdicts: 2 in the last 60 s (2 folded into this line: up to 3 a minute are logged")
    # Minute 3: minute 2 was under the rate: back to one line a verdict.
    timers.armed.clear()
    clock.now += 1
    delivery.judged(judged("e0"))
    assert [line.split(" agent")[0] for line in lines(caplog)] == ["verdict: conversation e0"] and not timers.armed
    get = registry.get_sample_value
    total = sum(
        get("tracejudge_verdicts_total", {"agent": agent, "metric": "failure_rate", "verdict": label}) or 0
        for agent in ("bot", "desk")
        for label in ("hallucination", "stall")
    )
    assert total == 13  # folded or not, every verdict counted
    sink.close()


def test_close_logs_the_minute_under_way_and_cancels_its_timer(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    delivery, sink, clock, timers, _registry = setup
    for i in range(5):
        delivery.judged(judged(f"c{i}"))
    assert len(lines(caplog)) == 3
    clock.now += 12
    sink.close()
    (summary,) = lines(caplog)
    assert summary.startswith("verdicts: 5 in the last 12 s (the first 3 logged above, 2 folded into this line")
    assert timers.armed[0][2].cancelled
    sink.close()  # twice: nothing more
    assert lines(caplog) == []


def test_a_verdict_after_a_quiet_spell_ends_the_last_minute_without_its_timer(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    """The timer is the usual way a minute ends; a verdict that comes first (a timer late under load) does it too."""
    delivery, _sink, clock, _timers, _registry = setup
    for i in range(4):
        delivery.judged(judged(f"c{i}"))
    lines(caplog)
    clock.now += 300  # a quiet spell: more than a minute without a verdict after it
    delivery.judged(judged("late"))
    got = lines(caplog)
    assert got[0].startswith("verdicts: 4 in the last 60 s") and got[1].startswith("verdict: conversation late")


def test_short_keeps_one_line() -> None:
    assert short("a\n\n b\tc") == "a b c"
    assert short(None) == "" and short("x" * 100) == "x" * 100 and short("x" * 101) == "x" * 99 + "…"


def test_the_live_consumer_logs_a_line_per_verdict(
    broker: EmbeddedBroker, topic: str, judge_server: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Wired by build_app: the real consumer's log holds one line per judge's verdict, with the judge's reason."""
    from tests.docs.test_quickstart import judge_answer
    from tests.support.pipeline import RunningConsumer, consumer_settings, play, traced_app, wait_for

    caplog.set_level(logging.INFO, logger="tracejudge.consumer.verdicts")
    judge_server.responder = judge_answer
    with RunningConsumer(consumer_settings(broker.bootstrap_servers, topic)) as consumer:
        assert isinstance(consumer.app.outputs.verdict_log, VerdictLog)
        play(traced_app(broker.bootstrap_servers, topic), {"vl-1": [("q0", "a0")], "vl-2": [("why swallow?", "idk")]})
        wait_for(lambda: consumer.sessions("judged") == 2, timeout=120, what="both conversations judged")
    got = sorted(line for line in lines(caplog) if line.startswith("verdict: "))
    assert got == [
        "verdict: conversation vl-1 agent support judge conversational_flow verdict fully: scripted judge",
        "verdict: conversation vl-1 agent support judge failure_rate verdict not_applicable: scripted judge",
        "verdict: conversation vl-2 agent support judge conversational_flow verdict fully: scripted judge",
        "verdict: conversation vl-2 agent support judge failure_rate verdict honest_fallback: scripted judge",
    ], got
    assert consumer.value("tracejudge_output_errors_total", output="sink") == 0


def test_after_a_busy_minute_rolled_by_its_timer_a_verdict_after_a_quiet_minute_is_its_own_line(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    """The timer ends a busy minute on time; the next verdict comes hours later: no minute above the rate precedes
    it, so it is logged as a line, not folded into a summary."""
    delivery, sink, clock, timers, _registry = setup
    for i in range(5):
        delivery.judged(judged(f"c{i}"))
    lines(caplog)
    clock.now += 60
    timers.armed[0][1]()  # the minute's summary, on time
    assert lines(caplog)[0].startswith("verdicts: 5 in the last 60 s")
    clock.now += 3 * 3600
    delivery.judged(judged("later"))
    assert [line.split(" agent")[0] for line in lines(caplog)] == ["verdict: conversation later"]
    sink.close()


def test_a_conversation_named_with_a_lone_surrogate_is_logged_encodable(
    setup: tuple[Delivery, VerdictLog, Clock, Timers, CollectorRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    """A record may name anything: a lone surrogate in a log line breaks a UTF-8 stream's handler (and a test
    runner's report); the line is replaced, encodable."""
    delivery, sink, _clock, _timers, _registry = setup
    delivery.judged(judged("c\ud800", agent="a\udfff", reason="r\ud800"))
    (line,) = lines(caplog)
    line.encode("utf-8")
    assert line.startswith("verdict: conversation c")
    sink.close()
