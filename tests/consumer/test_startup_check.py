"""The judge is checked at startup (`consume`, `backfill`, `calibrate`), through the real CLI: a judge that cannot
answer is one line on stderr and exit 3 before any record is read (nothing connects to Kafka); an unknown provider
prefix is a configuration error, exit 2, before any I/O; `--no-judge-check` / TRACEJUDGE_JUDGE_CHECK=false skip it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.judge_server import JudgeServer, Reply, verdict
from tracejudge.consumer.cli import main
from tracejudge.consumer.cli.options import EXIT_JUDGE_UNAVAILABLE, EXIT_USAGE
from tracejudge.metrics.judge_check import JudgeCallError, check_judge_model, judge_model_problem

ROOT = Path(__file__).resolve().parents[2]


class KafkaListener:
    """A TCP port standing in for the Kafka bootstrap: it only records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="kafka-listener", daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        try:
            while True:
                connection, _ = self.sock.accept()
                self.connected.set()
                connection.close()
        except OSError:
            return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (closing the socket alone would not)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(10)


@pytest.fixture
def kafka() -> Iterator[KafkaListener]:
    listener = KafkaListener()
    yield listener
    listener.close()


def _error(status: int, message: str, code: str | None = None) -> Reply:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return Reply(status=status, raw_body=json.dumps(body).encode())


def _consume(kafka: KafkaListener, *extra: str) -> list[str]:
    return [
        "consume",
        "--bootstrap-servers",
        kafka.bootstrap,
        "--metrics-port",
        "0",
        "--metrics-host",
        "127.0.0.1",
        *extra,
    ]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    # The provider's words once, without LiteLLM's class names (`litellm.InternalServerError: InternalServerError:
    # OpenAIException - ...`).
    assert not re.search(
        r"\blitellm\.[A-Z]|Exception - |InternalServerError|AuthenticationError|NotFoundError", lines[0]
    )
    return lines[0]


def test_consume_exits_3_with_one_line_when_the_judge_answers_500(
    judge_server: JudgeServer, kafka: KafkaListener
) -> None:
    """The installed command in its own process: exit 3, one line, no traceback, Kafka never contacted."""
    judge_server.check_reply = _error(500, "the judge is on fire")
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *_consume(kafka, "--judge-retries", "3")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == EXIT_JUDGE_UNAVAILABLE, completed.stderr
    line = _one_line(completed.stderr)
    assert line.startswith("tracejudge: the judge 'gpt-4o-mini' cannot answer (server_error): ")
    assert f"{judge_server.base_url} answered with a server error (HTTP 500): see that server's log" in line
    assert "it said: the judge is on fire" in line and "--no-judge-check" in line
    assert len(judge_server.checks) == 1  # one cheap call, not retried
    assert judge_server.requests == []
    assert not kafka.connected.is_set()


def test_no_judge_check_from_the_environment_goes_on_to_kafka(judge_server: JudgeServer, kafka: KafkaListener) -> None:
    judge_server.check_reply = _error(500, "the judge is on fire")
    process = subprocess.Popen(
        [sys.executable, "-m", "tracejudge.consumer", *_consume(kafka)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRACEJUDGE_JUDGE_CHECK": "false"},
    )
    try:
        assert kafka.connected.wait(300), "consume never reached Kafka"
        assert process.poll() is None
        assert judge_server.checks == []
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("reply", "reason", "cause", "fix"),
    [
        (
            _error(404, "The model `gpt-4o-mini` does not exist", "model_not_found"),
            "bad_request",
            "{url} does not serve the model 'gpt-4o-mini' (HTTP 404)",
            "name one it serves with --judge-model (see GET {url}/models",
        ),
        (
            Reply(status=401, raw_body=b'{"error": {"message": "Incorrect API key provided"}}'),
            "auth",
            "{url} rejected the API key set in OPENAI_API_KEY (HTTP 401)",
            "check that OPENAI_API_KEY holds a key this server accepts, with access to 'gpt-4o-mini'",
        ),
        (  # a key was sent: the server's words ("credentials", "api key") do not make it a missing key
            _error(401, "Invalid credentials"),
            "auth",
            "{url} rejected the API key set in OPENAI_API_KEY (HTTP 401)",
            "check that OPENAI_API_KEY holds a key",
        ),
        (
            _error(401, "Missing credentials. Please pass an api_key"),
            "auth",
            "{url} rejected the API key set in OPENAI_API_KEY (HTTP 401)",
            "check that OPENAI_API_KEY holds a key",
        ),
        (
            _error(403, "You do not have access to this model"),
            "auth",
            "{url} rejected the API key set in OPENAI_API_KEY (HTTP 403)",
            "with access to 'gpt-4o-mini'",
        ),
        (
            Reply(status=200, raw_body=b"<html>gateway says hi</html>"),
            "server_error",
            "{url} answered, but not as an OpenAI-compatible API",
            "check that OPENAI_BASE_URL is the API's base URL",
        ),
        (
            _error(503, "model is loading"),
            "server_error",
            "{url} answered with a server error (HTTP 503)",
            "see that server's log",
        ),
        # A key was set and sent: a server whose words say "no key" (a proxy missing its upstream key, one reading
        # another header) is not told "set OPENAI_API_KEY"; its status decides the line.
        (
            _error(500, "Upstream: API key missing for provider"),
            "auth",
            "{url} answered with a server error (HTTP 500)",
            "see that server's log",
        ),
        (
            _error(400, "No API key provided in header x-api-key"),
            "auth",
            "{url} refused the request (HTTP 400)",
            "check --judge-model and the server's message",
        ),
    ],
    ids=[
        "model-not-found",
        "wrong-key",
        "wrong-key-invalid-credentials",
        "wrong-key-missing-credentials",
        "key-without-access",
        "not-an-api",
        "server-error",
        "no-key-words-in-a-500",
        "no-key-words-in-a-400",
    ],
)
def test_consume_refuses_a_judge_that_cannot_answer_naming_url_cause_and_fix(
    judge_server: JudgeServer,
    kafka: KafkaListener,
    capsys: pytest.CaptureFixture[str],
    reply: Reply,
    reason: str,
    cause: str,
    fix: str,
) -> None:
    judge_server.check_reply = reply
    assert main(_consume(kafka)) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    url = judge_server.base_url.rstrip("/")
    expected = f"tracejudge: the judge 'gpt-4o-mini' cannot answer ({reason}): {cause.format(url=url)}: "
    assert line.startswith(expected), line
    assert fix.format(url=url) in line.removeprefix(expected).split(" (it said: ")[0], line
    assert len(judge_server.checks) == 1  # each answer came from the server over HTTP (a key was sent)
    assert not kafka.connected.is_set()


def test_nothing_listening_is_a_connection_problem_naming_the_url(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LiteLLM reports a refused connection as a 500 `InternalServerError: Connection error.`: it is `connection`."""
    from tracejudge.consumer.embedded_broker import free_port

    closed = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", closed)
    monkeypatch.setenv("OPENAI_API_BASE", closed)
    assert main(_consume(kafka, "--judge-model", "llama3.2")) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        f"tracejudge: the judge 'llama3.2' cannot answer (connection): nothing answers at {closed}: start the "
        "server, or point OPENAI_BASE_URL at the one you run (it said: Connection error.; skip this check with "
        "--no-judge-check"
    ), line
    assert not kafka.connected.is_set()


def test_no_answer_in_time_names_the_timeout_and_its_flag(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str]
) -> None:
    judge_server.check_reply = Reply(content="OK", delay_s=3.0)
    assert main(_consume(kafka, "--judge-timeout", "0.5")) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    assert f"cannot answer (timeout): no answer from {judge_server.base_url} within 0.5 s: " in line, line
    assert "raise --judge-timeout" in line


@pytest.mark.parametrize(("key", "state"), [(None, "is not set"), ("", "is empty")], ids=["unset", "empty"])
def test_missing_key_is_auth_at_startup(
    judge_server: JudgeServer,
    kafka: KafkaListener,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    key: str | None,
    state: str,
) -> None:
    """No key is not a server error: LiteLLM refuses before any request (as a 500); the line says which variable,
    and that it is unset or empty (a key the server refused is the cases above)."""
    if key is None:
        monkeypatch.delenv("OPENAI_API_KEY")
    else:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    started = time.monotonic()
    assert main(_consume(kafka)) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    expected = (
        f"cannot answer (auth): no API key for openai/gpt-4o-mini at {judge_server.base_url} (OPENAI_API_KEY {state}): "
        "set OPENAI_API_KEY"
    )
    assert expected in line, line
    assert "Missing credentials" in line  # LiteLLM's own words, once
    assert time.monotonic() - started < 10  # not retried
    assert judge_server.checks == [] and not kafka.connected.is_set()


@pytest.mark.parametrize(
    ("key", "cause"),
    [
        ("sk-abc\n", "OPENAI_API_KEY contains a newline at its end, so it cannot be sent in an HTTP header: remove it"),
        ("sk-abc ", "OPENAI_API_KEY contains whitespace at its end, so it cannot be sent in an HTTP header: remove it"),
        (
            "sk-abc\u2013",
            "OPENAI_API_KEY contains a non-ASCII character ('\u2013' U+2013), so it cannot be sent in an HTTP header: "
            "remove it",
        ),
        ("sk-a b", "OPENAI_API_KEY contains whitespace, so {url} rejected it (HTTP 401): remove it"),
    ],
    ids=["newline", "trailing-space", "non-ascii", "inner-space-sent"],
)
def test_a_key_with_stray_characters_is_named_not_blamed_on_the_server(
    judge_server: JudgeServer,
    kafka: KafkaListener,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    cause: str,
) -> None:
    """The HTTP client refuses such a header before a request is sent (h11's "Illegal header value", which LiteLLM
    reports as "Connection error."; a non-ASCII character as a 500 no server sent): the server is up and would answer,
    and the line says what is wrong with the key, never the key itself. A key the server got (an inner space) and
    refused is named too, with the server's status."""
    sent = " " in key.strip()
    if sent:
        judge_server.check_reply = _error(401, "Incorrect API key provided")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert main(_consume(kafka)) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    reason = "auth" if sent else "client_error"
    expected = (
        f"tracejudge: the judge 'gpt-4o-mini' cannot answer ({reason}): {cause.format(url=judge_server.base_url)}"
    )
    assert line.startswith(expected), line
    assert "sk-a" not in line and "Connection error" not in line and "nothing answers" not in line
    assert len(judge_server.checks) == (1 if sent else 0)  # the server answers; only the sendable key reached it
    assert not kafka.connected.is_set()


@pytest.mark.parametrize("key", ["sk-abc\n", "sk-abc\u2013"], ids=["newline", "non-ascii"])
def test_a_key_that_cannot_be_sent_is_a_client_error_never_retried(
    judge_server: JudgeServer, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """The judges' one classification, at runtime too: not `connection` or `server_error` (retried, and counted
    as the server's fault) but `client_error`, final; its message never repeats the header (it holds the key)."""
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(JudgeCallError) as caught:
        check_judge_model("gpt-4o-mini", timeout=5.0)
    assert (caught.value.kind, caught.value.retryable) == ("client_error", False)
    assert "the request was not sent" in str(caught.value) and "sk-abc" not in str(caught.value), caught.value
    assert judge_server.checks == []


@pytest.mark.parametrize("model", ["foo/bar", "nosuchprovider:model-x"])
def test_unknown_provider_is_a_configuration_error(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str], model: str
) -> None:
    """Exit 2 (usage), one line, before any I/O: neither the judge nor Kafka is contacted, with or without the check."""
    for extra in ([], ["--no-judge-check"]):
        assert main(_consume(kafka, "--judge-model", model, *extra)) == EXIT_USAGE
        line = _one_line(capsys.readouterr().err)
        provider = model.replace(":", "/").split("/")[0]
        assert line.startswith("tracejudge: invalid configuration: --judge-model / TRACEJUDGE_JUDGE_MODEL: ")
        assert f"unknown provider {provider!r}" in line and "docs.litellm.ai/docs/providers" in line
    assert judge_server.checks == [] and judge_server.requests == []
    assert not kafka.connected.is_set()


@pytest.mark.parametrize(
    ("model", "suggested"),
    [("qwen2.5:7b", "openai/qwen2.5:7b"), ("opena/gpt-4o", "did you mean openai/gpt-4o?")],
)
def test_an_unknown_provider_suggests_the_model_string_meant(model: str, suggested: str) -> None:
    """An Ollama tag (`qwen2.5:7b`) reads as provider `qwen2.5`: the error names the OpenAI-compatible spelling;
    a mistyped prefix, the closest provider."""
    from tracejudge.metrics.judge_check import judge_model_problem

    problem = judge_model_problem(model)
    assert problem is not None and suggested in problem


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o-mini",
        "openai:gpt-4o",
        "anthropic:claude-sonnet-4-5",
        "google:gemini-2.5-flash",
        "ft:gpt-4o-mini:org::x1",
    ],
)
def test_known_model_strings_are_routable(model: str) -> None:
    assert judge_model_problem(model) is None


def test_backfill_checks_the_judge_before_reading(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str]
) -> None:
    judge_server.check_reply = _error(500, "the judge is on fire")
    argv = ["backfill", "--from", "2026-01-01", "--to", "2026-01-02", "--bootstrap-servers", kafka.bootstrap]
    argv += ["--results-topic", "results"]  # without an output backfill refuses (exit 2) before the check
    assert main(argv) == EXIT_JUDGE_UNAVAILABLE
    assert "cannot answer (server_error)" in _one_line(capsys.readouterr().err)
    assert not kafka.connected.is_set()


def _gold(tmp_path: Path) -> Path:
    path = tmp_path / "gold.jsonl"
    turns = [{"user": "Where is my order?", "assistant": "It shipped yesterday."}]
    path.write_text(json.dumps({"id": "g1", "turns": turns, "labels": {"failure_rate": "not_applicable"}}) + "\n")
    return path


def test_calibrate_checks_the_judge_and_can_skip_the_check(
    judge_server: JudgeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge_server.check_reply = _error(500, "the judge is on fire")
    judge_server.default = verdict("not_applicable")
    argv = ["calibrate", "--dataset", str(_gold(tmp_path)), "--metrics", "failure_rate", "--judge-retries", "0"]
    assert main(argv) == EXIT_JUDGE_UNAVAILABLE
    assert "cannot answer (server_error)" in _one_line(capsys.readouterr().err)
    assert judge_server.requests == []  # no item judged
    assert main([*argv, "--no-judge-check"]) == 0
    assert len(judge_server.checks) == 1 and len(judge_server.requests) == 1
    judge_server.check_reply = Reply(content="OK")
    assert main(argv) == 0
    assert len(judge_server.checks) == 2 and len(judge_server.requests) == 2


def test_an_unroutable_shadow_judge_is_a_configuration_error(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shadow is checked as the primary is: exit 2, one line naming --shadow-judge-model; configuration first, so
    neither judge is called and Kafka is never contacted."""
    assert main(_consume(kafka, "--shadow-judge-model", "foo/bar")) == EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("tracejudge: invalid configuration: --shadow-judge-model / TRACEJUDGE_SHADOW_JUDGE_MODEL: ")
    assert judge_server.checks == [] and not kafka.connected.is_set()


def test_a_shadow_judge_that_cannot_answer_is_named_as_the_shadow(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str]
) -> None:
    judge_server.check_responder = lambda request: (
        _error(404, "no such model: judge-b") if request["model"] == "judge-b" else Reply(content="OK")
    )
    assert main(_consume(kafka, "--shadow-judge-model", "judge-b")) == EXIT_JUDGE_UNAVAILABLE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("tracejudge: the shadow judge 'judge-b' cannot answer (bad_request): "), line
    assert "name one it serves with --shadow-judge-model" in line
    assert [check["model"] for check in judge_server.checks] == ["gpt-4o-mini", "judge-b"]
    assert not kafka.connected.is_set()


def test_the_metrics_port_is_configuration_checked_before_the_judge_and_kafka(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented order: configuration (the metrics port included) exits 2 before the judge is called (it would
    exit 3 here) or Kafka contacted; the judge (exit 3) before Kafka is the tests above."""
    judge_server.check_reply = _error(500, "the judge is on fire")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = ["consume", "--bootstrap-servers", kafka.bootstrap, "--metrics-host", "127.0.0.1"]
        started = time.monotonic()
        assert main([*argv, "--metrics-port", str(port)]) == EXIT_USAGE
        took = time.monotonic() - started
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("tracejudge: invalid configuration: --metrics-port / TRACEJUDGE_METRICS_PORT: ")
    assert f"127.0.0.1:{port}" in line
    assert judge_server.checks == [] and judge_server.requests == []
    assert not kafka.connected.is_set()
    print(f"\nmetrics port taken: exit 2 after {took:.2f} s: {line}")


@pytest.mark.parametrize("shadow", ["judge-b", "foo/bar"], ids=["shadow-cannot-answer", "shadow-unroutable"])
@pytest.mark.parametrize("command", ["calibrate", "backfill"])
def test_backfill_and_calibrate_check_only_the_judge_they_call(
    judge_server: JudgeServer,
    kafka: KafkaListener,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    shadow: str,
) -> None:
    """Neither runs the shadow judge: a TRACEJUDGE_SHADOW_JUDGE_MODEL set for `consume` (one the server does not
    serve, or one no provider routes) is neither called nor refused; the primary judge is checked once."""
    from tracejudge.consumer.service import EXIT_UNAVAILABLE

    monkeypatch.setenv("TRACEJUDGE_SHADOW_JUDGE_MODEL", shadow)
    judge_server.check_responder = lambda request: (
        Reply(content="OK") if request["model"] == "gpt-4o-mini" else _error(404, f"no such model: {shadow}")
    )
    judge_server.default = verdict("not_applicable")
    if command == "calibrate":
        argv = ["calibrate", "--dataset", str(_gold(tmp_path)), "--metrics", "failure_rate", "--judge-retries", "0"]
        assert main(argv) == 0, capsys.readouterr().err
        assert len(judge_server.requests) == 1
    else:
        argv = ["backfill", "--from", "2026-01-01", "--to", "2026-01-02", "--bootstrap-servers", kafka.bootstrap]
        argv += ["--results-topic", "results", "--kafka-config", "bootstrap_timeout_ms=1000"]
        assert main(argv) == EXIT_UNAVAILABLE, capsys.readouterr().err  # past the check, to the silent Kafka
        assert kafka.connected.is_set()
    assert [check["model"] for check in judge_server.checks] == ["gpt-4o-mini"]


@pytest.mark.parametrize("check", [True, False], ids=["with-judge-check", "no-judge-check"])
def test_backfill_refuses_a_tier_the_provider_lacks_before_the_judge_and_kafka(
    judge_server: JudgeServer, kafka: KafkaListener, capsys: pytest.CaptureFixture[str], check: bool
) -> None:
    """`--judge-tier batch` for a provider without a Batch API is configuration (exit 2), said before the judge check
    (exit 3) or Kafka (69), as `consume` says it and docs/configuration.md documents."""
    argv = ["backfill", "--from", "2026-01-01", "--to", "2026-01-02", "--bootstrap-servers", kafka.bootstrap]
    argv += ["--results-topic", "results", "--kafka-config", "bootstrap_timeout_ms=1000"]
    argv += ["--judge-tier", "batch", "--judge-model", "ollama/llama3.2", *([] if check else ["--no-judge-check"])]
    assert main(argv) == EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("tracejudge backfill: ") and "has no Batch API" in line, line
    assert "(--judge-model 'ollama/llama3.2')" in line, line
    assert judge_server.checks == [] and judge_server.requests == []
    assert not kafka.connected.is_set()
