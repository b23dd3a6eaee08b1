"""The regression file `tracejudge export --pytest` writes runs where it was made: in the consumer's install with
`python FILE` (pytest is not part of it) and with pytest, against a real OpenAI-compatible judge server; it says at
its top how to run it, sets LiteLLM's offline price list itself before LiteLLM is imported, and without the judge's
variables it stops with one line naming the missing one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.judge_server import JudgeServer, Reply, conversation_text
from tracejudge.consumer.cli.export import Selection, regression_suite, select


def record(conversation: str, label: str, model: str = "gpt-4o-mini") -> dict[str, Any]:
    """A results-topic record as `consume --results-transcript` writes it (the keys export reads)."""
    return {
        "conversation_id": conversation,
        "content_id": f"content-{conversation}",
        "version": 1,
        "agent": "support",
        "metric": "failure_rate",
        "verdict": label,
        "score": 0.0,
        "reason": "scripted",
        "evidence": [],
        "model": model,
        "rubric_version": "failure_rate@000000000000",
        "result_id": f"result-{conversation}",
        "trace_id": f"trace-{conversation}",
        "judged_at": "2026-12-05T12:00:00+00:00",
        "transcript": [{"turn": 1, "user": f"{conversation}: where is my order?", "assistant": "It shipped."}],
    }


def write_suite(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    export = select(records, Selection())
    dataset, suite = tmp_path / "verdicts.jsonl", tmp_path / "test_verdicts.py"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in export.lines), encoding="utf-8")
    suite.write_text(regression_suite(dataset, suite, export, "every verdict"), encoding="utf-8")
    return suite


def user_env(**variables: str) -> dict[str, str]:
    """This venv's interpreter with none of the judge's, LiteLLM's or tracejudge's variables: a user's shell."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "TRACEJUDGE_", "LITELLM_", "ANTHROPIC_", "GEMINI_", "PYTEST_"))
    }
    return {**env, **variables}


def run(suite: Path, env: dict[str, str], *pytest_args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider", *pytest_args]
    return subprocess.run(
        command if pytest_args else [sys.executable, str(suite)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=suite.parent,
    )


def labelled(labels: dict[str, str]) -> Any:
    def respond(request: dict[str, Any]) -> Reply:
        text = conversation_text(request)
        label = next(label for conversation, label in labels.items() if f"{conversation}:" in text)
        return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": f"now {label}"}))

    return respond


def test_the_file_says_how_to_run_it_and_sets_the_offline_price_list_before_litellm(tmp_path: Path) -> None:
    text = write_suite(tmp_path, [record("c1", "hallucination")]).read_text()
    header = text.split('"""', 2)[1]
    assert "pip install './tracejudge[consumer]'" in header
    assert "OPENAI_BASE_URL=" in header and "OPENAI_API_KEY=" in header and "python test_verdicts.py" in header
    assert "python -m pytest test_verdicts.py" in header
    offline = text.index('os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")')
    assert offline < text.index("from tracejudge.metrics import") and "\nimport pytest" not in text.split("PROBLEM")[0]
    compile(text, "test_verdicts.py", "exec")


@pytest.mark.timeout(600)  # four interpreters, each importing LiteLLM
def test_the_file_runs_with_python_alone_and_with_pytest_against_the_judge(
    judge_server: JudgeServer, tmp_path: Path
) -> None:
    suite = write_suite(tmp_path, [record("c1", "hallucination"), record("c2", "honest_fallback")])
    judge_server.responder = labelled({"c1": "hallucination", "c2": "honest_fallback"})
    env = user_env(OPENAI_BASE_URL=judge_server.base_url, OPENAI_API_KEY="placeholder")

    plain = run(suite, env)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert plain.stdout.splitlines()[-1] == "2 passed", plain.stdout
    asked = [conversation_text(r) for r in judge_server.requests]
    assert len(asked) == 2 and any("c1: where is my order?" in t for t in asked), asked

    judge_server.responder = labelled({"c1": "stall", "c2": "honest_fallback"})  # the judge changed its mind on c1
    changed = run(suite, env)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "FAILED c1-failure_rate: c1 (trace trace-c1) was judged hallucination in production, now stall" in (
        changed.stdout
    )
    assert changed.stdout.splitlines()[-1] == "1 passed, 1 failed"

    judge_server.responder = labelled({"c1": "hallucination", "c2": "honest_fallback"})
    with_pytest = run(suite, env, "--rootdir", str(tmp_path))
    assert with_pytest.returncode == 0, with_pytest.stdout + with_pytest.stderr
    assert "2 passed" in with_pytest.stdout


@pytest.mark.timeout(600)
def test_without_the_judges_variables_it_stops_with_one_line_naming_the_missing_one(tmp_path: Path) -> None:
    suite = write_suite(tmp_path, [record("c1", "hallucination")])
    no_key = run(suite, user_env())
    assert no_key.returncode == 2, no_key.stdout + no_key.stderr
    assert no_key.stdout == ""
    (line,) = no_key.stderr.strip().splitlines()
    assert line.startswith("test_verdicts.py: OPENAI_API_KEY is not set: the judge gpt-4o-mini needs it"), line

    # A local server's model (the quickstart's llama3.2) with a key but no server to send it to.
    local = write_suite(tmp_path, [record("c1", "hallucination", model="llama3.2")])
    no_url = run(local, user_env(OPENAI_API_KEY="placeholder"))
    assert no_url.returncode == 2, no_url.stdout + no_url.stderr
    (line,) = no_url.stderr.strip().splitlines()
    assert "OPENAI_BASE_URL is not set: the judge llama3.2 is no OpenAI model" in line, line

    with_pytest = run(suite, user_env(), "--rootdir", str(tmp_path))
    assert with_pytest.returncode == 1, with_pytest.stdout + with_pytest.stderr  # its tests fail, the run goes on
    assert "test_verdicts.py: OPENAI_API_KEY is not set" in with_pytest.stdout + with_pytest.stderr


def test_export_finds_the_results_topic_from_the_group_id_and_says_when_there_is_none(
    broker: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No results flag: `<group>-results`, the consumer's default; a group whose consumer never wrote one is one line
    naming the topic and the group (exit 2); TRACEJUDGE_NO_RESULTS leaves nothing to read (exit 2, before Kafka)."""
    from tracejudge.consumer.cli import main

    group = f"never-{os.getpid()}-{id(tmp_path) % 10_000}"
    argv = ["export", "--bootstrap-servers", broker.bootstrap_servers, "--group-id", group]
    assert main([*argv, "--output", str(tmp_path / "out.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"results topic '{group}-results' (the default of --group-id '{group}') does not exist" in line, line
    assert not (tmp_path / "out.jsonl").exists()
    monkeypatch.setenv("TRACEJUDGE_NO_RESULTS", "true")
    assert main([*argv, "--output", str(tmp_path / "out.jsonl")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tracejudge export: TRACEJUDGE_NO_RESULTS is set: no results topic to read"), line
