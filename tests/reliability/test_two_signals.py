"""Stopping a real `tracejudge consume` by hand (issue 43): the first Ctrl-C (SIGINT) says what it drains and for how
long at most; a second one stops within 2 s, commits nothing unfinished, and says so; after the restart the
conversations that were being judged are judged."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.consumer.test_pipeline import scripted_judge
from tests.reliability.test_state_windows import Replica, Turns, _setup, calls_by_conversation, results_by_conversation
from tests.support.judge_server import JudgeServer, Reply
from tests.support.pipeline import wait_for
from tracejudge.consumer.embedded_broker import EmbeddedBroker

pytestmark = pytest.mark.serial  # real consumer processes with a timed stop


def test_a_second_ctrl_c_stops_within_two_seconds_and_the_restart_judges_what_was_in_flight(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    slow = {"on": True}

    def judge(request: dict[str, Any]) -> Reply:
        reply = scripted_judge(request)
        if slow["on"]:
            reply.delay_s = 25.0  # in flight for longer than the test waits: only a hurried stop ends it
        return reply

    judge_server.responder = judge
    topic, results, group = _setup(broker)
    env = {"TRACEJUDGE_JUDGE_TIMEOUT": "60", "TRACEJUDGE_SHUTDOWN_GRACE": "30"}
    first = Replica(broker, topic, group, results, tmp_path / "first.log", **env)
    first.ready()
    turns = Turns(broker.bootstrap_servers, topic)
    ids = [f"stop{i}" for i in range(3)]
    for cid in ids:
        turns.turn(cid, 1, indexed=False)
        turns.end(cid)
    turns.flush()
    # The judge answers each call after 25 s: wait until calls are at the judge, unanswered (in flight).
    wait_for(lambda: len(calls_by_conversation(judge_server)) >= 1, 60, "a conversation at the judge")
    first.process.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT: stopping: draining" in first.log.read_text(), 30, "the first Ctrl-C said")
    said = next(line for line in first.log.read_text().splitlines() if "SIGINT: stopping: draining" in line)
    in_flight = re.search(r"draining (\d+) judgements? in flight, \d+ outputs? awaiting acknowledgement", said)
    assert in_flight is not None and int(in_flight.group(1)) >= 1, said
    assert "for at most 30s (--shutdown-grace)" in said and "again (Ctrl-C) to stop at once" in said, said
    started = time.monotonic()
    first.process.send_signal(signal.SIGINT)
    first.process.wait(30)
    took = time.monotonic() - started
    assert took < 2.0, f"the second Ctrl-C took {took:.2f}s"
    assert first.process.returncode == 130  # 128 + SIGINT, as a shell reports an interrupted command
    assert "stopped: " in first.log.read_text()  # the stop ran to its end (the 1.5 s timer also exits 130)
    log = first.log.read_text()
    assert "SIGINT again: stopping now" in log and "left uncommitted" in log
    judged_before = set(results_by_conversation(broker, results))
    unfinished = set(ids) - judged_before
    assert unfinished, "every conversation was judged before the stop: nothing was in flight"
    assert unfinished & set(calls_by_conversation(judge_server))  # at least one was at the judge, unanswered

    slow["on"] = False
    before = len(judge_server.requests)
    second = Replica(broker, topic, group, results, tmp_path / "second.log", **env)
    try:
        wait_for(
            lambda: set(results_by_conversation(broker, results)) >= set(ids),
            120,
            "the unfinished conversations judged after the restart",
        )
        assert len(judge_server.requests) > before  # judged after the restart, nothing unfinished was committed
    finally:
        second.stop()
    print(
        f"\nsecond Ctrl-C: gone in {took:.2f}s; {len(unfinished)} unfinished conversation(s) judged after the restart"
    )
