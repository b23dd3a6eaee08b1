"""KafkaClients' option precedence: the code's tuning < the user's --kafka-config < what tracejudge decides (where
its topics are read from, acks, commits, group and member identity). A user option must never undo a guarantee."""

from __future__ import annotations

from typing import Any

import pytest

from tracejudge.consumer.kafka import KafkaClients
from tracejudge.consumer.settings import Settings


def _recording() -> tuple[list[dict[str, Any]], Any]:
    made: list[dict[str, Any]] = []

    def factory(**config: Any) -> dict[str, Any]:
        made.append(config)
        return config

    return made, factory


USER = {
    "max_poll_records": 7,  # tuning the user may change
    "linger_ms": 9,
    "auto_offset_reset": "latest",  # decided: would skip queued jobs
    "acks": 1,  # decided: state and verdicts need acks=all
    "group_instance_id": "shared-id",  # decided: --group-instance-id
    "group_id": "other",
    "enable_auto_commit": True,
}


def test_the_users_options_win_over_the_tuning_never_over_what_tracejudge_decides() -> None:
    made, factory = _recording()
    clients = KafkaClients("127.0.0.1:1", USER, consumer_factory=factory, producer_factory=factory)
    consumer = clients.consumer("c", group_id="g", max_poll_records=500)
    member = clients.member("m", "g", max_poll_records=500, auto_offset_reset="earliest")
    static = clients.member("s", "g", instance_id="replica-1")
    producer = clients.producer("p", linger_ms=5, acks="all")
    plain = clients.producer("w")
    assert consumer["max_poll_records"] == member["max_poll_records"] == 7
    assert producer["linger_ms"] == 9
    assert consumer["auto_offset_reset"] == member["auto_offset_reset"] == "earliest"
    assert static["auto_offset_reset"] == "earliest"  # a member that names none reads its topic from the start
    assert producer["acks"] == plain["acks"] == "all"
    assert consumer["group_id"] == member["group_id"] == "g"
    assert "group_instance_id" not in consumer and "group_instance_id" not in member
    assert static["group_instance_id"] == "replica-1"
    assert not consumer["enable_auto_commit"] and not member["enable_auto_commit"]
    assert made == [consumer, member, static, producer, plain]


def test_a_start_from_given_by_the_code_still_applies() -> None:
    _, factory = _recording()
    member = KafkaClients("127.0.0.1:1", {}, consumer_factory=factory).member("m", "g", auto_offset_reset="latest")
    assert member["auto_offset_reset"] == "latest"


@pytest.mark.parametrize(
    ("option", "flag"),
    [
        ("auto_offset_reset=latest", "--start-from"),
        ("acks=1", "acks=all"),
        ("group_instance_id=x", "--group-instance-id"),
        ("group_id=x", "--group-id"),
        ("enable_auto_commit=true", "commits only what"),
    ],
)
def test_settings_refuse_what_tracejudge_decides_naming_the_way(option: str, flag: str) -> None:
    with pytest.raises(ValueError, match="is not a --kafka-config option") as caught:
        Settings.from_options(kafka_config=option)
    assert flag in str(caught.value)


def test_a_read_stalls_no_sooner_than_one_fetch_may_take() -> None:
    """A fetch may take the client's request timeout: a read that gave up sooner would call a slow broker gone."""
    from tracejudge.consumer.kafka.reader import MIN_STALL_S, stall_bound_s

    assert stall_bound_s({}) >= 30.5 > MIN_STALL_S  # kafka-python's request_timeout_ms 30 s + fetch_max_wait_ms
    assert stall_bound_s({"request_timeout_ms": 120_000}) >= 120.5
    assert stall_bound_s({"bootstrap_timeout_ms": 200_000}) == 200.0
