"""`tracejudge modes propose` against the embedded broker and a judge server scripted to propose modes, then sort
the sample into them: the file it writes loads with `--failure-modes`, the report adds up to the sample, `--merge`
keeps a team's names, a dry run spends nothing, a small sample says how small it is."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer, Reply
from tracejudge.consumer.cli import main
from tracejudge.consumer.embedded_broker import EmbeddedBroker, free_port
from tracejudge.consumer.settings import Settings
from tracejudge.metrics.judges import judge_classes
from tracejudge.metrics.rubric import load_failure_modes

# 12 hallucinations about three things (5, 4, 3); stalls are not failing verdicts of failure_rate's taxonomy.
SCRIPT = {"refund": 5, "order date": 4, "url": 3}
PROPOSED = [
    {"name": "invented_refund_rules", "description": "made-up refund or return rules"},
    {"name": "wrong_order_dates", "description": "made-up order or delivery dates"},
    {"name": "invented_urls", "description": "made-up links"},
]
KEYWORDS = {"refund": "invented_refund_rules", "order date": "wrong_order_dates", "url": "invented_urls"}


def record(conversation: str, verdict: str, reason: str) -> dict[str, Any]:
    return {
        "conversation_id": conversation,
        "agent": "support",
        "metric": "failure_rate",
        "verdict": verdict,
        "score": 0.0,
        "reason": reason,
        "evidence": [f"quote from {conversation}"],
        "model": "gpt-4o-mini",
        "result_id": f"result-{conversation}",
        "judged_at": "2026-12-05T12:00:00+00:00",
    }


def produce(broker: EmbeddedBroker, records: list[dict[str, Any]]) -> str:
    from kafka import KafkaProducer

    topic = f"results-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for value in records:
        producer.send(topic, json.dumps(value).encode())
    producer.flush()
    producer.close()
    return topic


@pytest.fixture(scope="module")
def results(broker: EmbeddedBroker) -> str:
    records = [
        record(f"conv-{keyword.replace(' ', '-')}-{i}", "hallucination", f"the assistant stated an invented {keyword}")
        for keyword, count in SCRIPT.items()
        for i in range(count)
    ]
    records += [record(f"conv-stall-{i}", "stall", "the assistant stalled") for i in range(3)]
    return produce(broker, records)


class ModesServer(JudgeServer):
    """The judge server, accepting the strict schemas of `modes propose` (its own check is the verdict schema's)."""

    def _refusal(self, body: dict[str, Any]) -> Reply | None:
        spec = (body.get("response_format") or {}).get("json_schema") or {}
        if str(spec.get("name", "")).startswith("failure_modes_"):
            assert spec.get("strict") is True and spec["schema"]["additionalProperties"] is False
            return None
        return super()._refusal(body)


def responder(proposed: list[dict[str, str]]) -> Any:
    def respond(request: dict[str, Any]) -> Reply:
        name = request["response_format"]["json_schema"]["name"]
        if name == "failure_modes_proposal":
            return Reply(content=json.dumps({"modes": proposed}))
        enum = request["response_format"]["json_schema"]["schema"]["properties"]["assignments"]["items"]
        known = enum["properties"]["mode"]["enum"]
        user = request["messages"][-1]["content"]
        rows = []
        for index, text in re.findall(r"^\[(\d+)\] (.*)$", user, re.M):
            mode = next((KEYWORDS[k] for k in KEYWORDS if k in text), "other")
            rows.append({"item": int(index), "mode": mode if mode in known else "other"})
        return Reply(content=json.dumps({"assignments": rows}))

    return respond


@pytest.fixture
def server(judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    scripted = ModesServer(responder(PROPOSED)).start()
    monkeypatch.setenv("OPENAI_BASE_URL", scripted.base_url)
    monkeypatch.setenv("OPENAI_API_BASE", scripted.base_url)
    yield scripted
    scripted.stop()


def propose(broker: EmbeddedBroker, topic: str, *args: str) -> int:
    return main(["modes", "propose", "--bootstrap-servers", broker.bootstrap_servers, "--results-topic", topic, *args])


def report_rows(text: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"^([a-z][a-z0-9_]*)\s+(\d+)\s+[\d.]+%", text, re.M)}


def test_propose_writes_a_loadable_taxonomy_and_a_report_that_adds_up(
    broker: EmbeddedBroker, results: str, server: ModesServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output, report = tmp_path / "modes.yaml", tmp_path / "report.txt"
    assert propose(broker, results, "--output", str(output), "--report", str(report)) == 0
    err = capsys.readouterr().err
    assert "only 12 failing verdicts: the modes are a guess; read them" in err
    loaded = load_failure_modes(output, judge_classes())
    assert [name for name, _ in loaded["failure_rate"]] == [m["name"] for m in PROPOSED]
    settings = Settings.from_options(failure_modes=str(output))
    assert settings.failure_modes == str(output)
    rows = report_rows(report.read_text())
    assert rows == {"invented_refund_rules": 5, "wrong_order_dates": 4, "invented_urls": 3, "other": 0, "total": 12}
    text = report.read_text()  # three of the mode's conversations to read (which three: the order they were judged)
    read = text.split("invented_refund_rules", 1)[1].split("\n")[1]
    assert read.count("conv-refund-") == 3 and "conv-stall" not in text, text
    calls = [r["response_format"]["json_schema"]["name"] for r in server.requests]
    assert calls == ["failure_modes_proposal", "failure_modes_classification"]  # 12 verdicts: one batch


def test_merge_keeps_the_teams_names_and_adds_modes_only_for_other(
    broker: EmbeddedBroker, results: str, server: ModesServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "team.yaml"
    existing.write_text(
        "failure_rate:\n  - {name: invented_refund_rules, description: made-up refund rules, alert_share: 0.5}\n"
    )
    output = tmp_path / "merged.yaml"
    assert propose(broker, results, "--merge", str(existing), "--output", str(output)) == 0
    out = capsys.readouterr().out
    names = [name for name, _ in load_failure_modes(output, judge_classes())["failure_rate"]]
    assert names[0] == "invented_refund_rules" and set(names) == {m["name"] for m in PROPOSED}
    assert "alert_share: 0.5" in output.read_text()
    assert report_rows(out)["total"] == 12 and report_rows(out)["invented_refund_rules"] == 5
    proposal = next(r for r in server.requests if r["response_format"]["json_schema"]["name"].endswith("proposal"))
    asked = re.findall(r"^\[\d+\] (.*)$", proposal["messages"][-1]["content"], re.M)
    assert len(asked) == 7 and not any("refund" in text for text in asked)  # only what landed in `other`


def test_a_dry_run_spends_nothing(
    broker: EmbeddedBroker, results: str, server: ModesServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "modes.yaml"
    assert propose(broker, results, "--dry-run", "--output", str(output)) == 0
    assert propose(broker, results, "--max-cost", "0", "--output", str(output)) == 0  # above the threshold
    out = capsys.readouterr().out
    assert out.count("dry run") == 2 and "--yes to spend it" in out and "estimated judge cost" in out
    assert server.requests == [] and not output.exists()


def test_nothing_to_name_a_usage_error_and_no_kafka_are_one_line(
    broker: EmbeddedBroker, results: str, server: ModesServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert propose(broker, results, "--agent", "nobody") == 1
    assert propose(broker, results, "--max", "0") == 2
    assert propose(broker, results, "--verdict", "fully") == 2
    unreachable = ["--kafka-config", "bootstrap_timeout_ms=1000"]
    assert main(["modes", "propose", "--bootstrap-servers", f"127.0.0.1:{free_port()}", *unreachable]) == 69
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("tracejudge modes propose: ") for line in lines), lines
    assert "no failure_rate hallucination verdicts" in lines[0] and "--max must be 1..20" in lines[1]
    assert server.requests == []


def test_an_invalid_name_gets_one_corrective_retry_then_one_line(
    broker: EmbeddedBroker, results: str, server: ModesServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = [{"name": "Refund Rules!", "description": "made-up refund rules"}]
    server.enqueue(Reply(content=json.dumps({"modes": bad})))  # then the responder's valid proposal
    output = tmp_path / "modes.yaml"
    assert propose(broker, results, "--output", str(output)) == 0
    calls = [r["response_format"]["json_schema"]["name"] for r in server.requests]
    assert calls == ["failure_modes_proposal", "failure_modes_proposal", "failure_modes_classification"]
    assert "do not match" in server.requests[1]["messages"][-1]["content"]
    server.requests.clear()
    server.enqueue(*[Reply(content=json.dumps({"modes": bad}))] * 2)
    assert propose(broker, results, "--output", str(tmp_path / "never.yaml")) == 3
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "corrective retry" in line]
    assert "Refund Rules!" in line and not (tmp_path / "never.yaml").exists() and len(server.requests) == 2
