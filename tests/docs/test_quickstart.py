"""The README's five-minute path, run exactly as written: a fresh clone, a fresh venv, three terminals.

The `<!-- quickstart:NAME -->` bash blocks are what a user copies; each runs in its own bash (a "terminal") fed line
by line, as a terminal would run a paste (`watch` in the agent's terminal). The only change is the judge:
`OPENAI_BASE_URL`'s value points at the tests' local OpenAI-compatible server instead of the user's Ollama. `watch`
runs as written until the verdicts show, then Ctrl-C, then once more with `--once`, as a script would. pip may reuse
its cache (as on a laptop that installed anything before); the install is otherwise real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import missing_part
from tests.support.judge_server import JudgeServer, Reply, conversation_text, metric_of
from tracejudge.consumer.embedded_broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCKS = ("broker", "consumer", "agent", "watch")
# Ports the README's commands use; the test needs them free (it is the user's machine).
PORTS = (9092, 9464)


def quickstart_blocks(text: str) -> dict[str, list[str]]:
    """Each `<!-- quickstart:NAME -->` marker's following ```bash block, as its command lines."""
    blocks: dict[str, list[str]] = {}
    for match in re.finditer(r"<!-- quickstart:(\w+) -->\n```bash\n(.*?)\n```", text, re.S):
        assert match.group(1) not in blocks, f"two quickstart blocks named {match.group(1)}"
        blocks[match.group(1)] = match.group(2).splitlines()
    return blocks


def readme_snippet(text: str) -> str:
    """The "Wrap your agent" snippet (the `<!-- quickstart:snippet -->` python block)."""
    match = re.search(r"<!-- quickstart:snippet -->\n```python\n(.*?)\n```", text, re.S)
    assert match is not None, "the README's snippet lost its marker"
    return match.group(1)


def runnable_snippet(snippet: str, bootstrap: str) -> str:
    """The snippet as a user runs it: their agent function defined, their broker's address in place of kafka:9092."""
    assert snippet.count('kafka_bootstrap_servers="kafka:9092"') == 1
    agent = 'def my_llm_agent(question: str) -> str:\n    return "Your parcel left our warehouse yesterday."\n\n\n'
    return agent + snippet.replace('"kafka:9092"', repr(bootstrap))


def test_the_readme_snippet_ends_its_conversations_and_says_what_the_idle_timeout_does() -> None:
    from tracejudge.consumer.settings import Settings

    text = README.read_text()
    snippet = readme_snippet(text)
    conversations = set(re.findall(r'session_id="([^"]+)"', snippet))
    assert conversations and conversations == set(re.findall(r'end_conversation\("([^"]+)"\)', snippet))
    after = " ".join(text.split("<!-- quickstart:snippet -->", 1)[1].split("## Works with", 1)[0].split())
    idle = Settings.model_fields["session_idle_timeout"].default
    assert f"`--session-idle-timeout` ({idle:g} s by default)" in after, after
    assert "pip install tracejudge`" not in text and "pip install 'tracejudge[" not in text  # not on PyPI


# `pip install tracejudge`, `pip install 'tracejudge[redact]'`: from PyPI, where no tracejudge is published (a git URL,
# `'tracejudge @ git+…'`, or a clone's path, `./tracejudge`, works).
FROM_PYPI = re.compile(r"pip install (?:-\S+ )*['\"]?tracejudge(?:\[[\w,]*\])?(?!\s*@|[\w/.-])")


def test_no_install_line_a_user_reads_asks_pypi_for_tracejudge() -> None:
    """Docs and the messages the code prints (an extra missing) give install lines that work today."""
    shipped = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for package in ("tracer", "consumer", "metrics", "shared", "examples", "deploy"):
        shipped += sorted((ROOT / package).rglob("*.py"))
    wrong = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in shipped
        for match in FROM_PYPI.finditer(path.read_text(encoding="utf-8"))
    ]
    assert wrong == []
    assert FROM_PYPI.search("pip install 'tracejudge[redact]'") and FROM_PYPI.search("`pip install tracejudge`")
    assert not FROM_PYPI.search("pip install 'tracejudge @ git+https://x'") and not FROM_PYPI.search(
        "pip install './tracejudge[consumer]'"
    )


# timing-sensitive: asserts how long it took, so it runs alone (tests/run_suite.py's serial phase)
@pytest.mark.serial
def test_the_readme_snippet_is_judged_at_once_not_after_the_idle_timeout(
    broker: EmbeddedBroker, judge_server: JudgeServer, tmp_path: Path
) -> None:
    """The snippet run as a user's program (its own process) next to a consumer with the default 300 s idle timeout:
    its conversation is judged as soon as it ends, well within the timeout."""
    from tests.support.pipeline import RunningConsumer, consumer_settings, last_outcome, wait_for

    snippet = readme_snippet(README.read_text())
    (conversation,) = set(re.findall(r'session_id="([^"]+)"', snippet))
    judge_server.responder = judge_answer  # a verdict each judge accepts
    broker.create_topic("otlp_spans")  # the snippet's setup_tracing writes to the default topic
    settings = consumer_settings(broker.bootstrap_servers, "otlp_spans", session_idle_timeout=300.0)
    with RunningConsumer(settings) as consumer:
        script = tmp_path / "my_app.py"
        script.write_text(runnable_snippet(snippet, broker.bootstrap_servers))
        started = time.monotonic()
        subprocess.run([sys.executable, str(script)], check=True, timeout=120, cwd=tmp_path)
        wait_for(
            lambda: last_outcome(consumer.app.service, conversation) == "judged",
            timeout=120,
            what="the snippet's conversation judged",
        )
        took = time.monotonic() - started
    asked = [conversation_text(request) for request in judge_server.requests]
    assert any("Where is my parcel?" in text and "Thanks, that's all." in text for text in asked), asked
    assert took < settings.session_idle_timeout / 2, took
    print(f"\nthe README snippet's conversation judged {took:.1f} s after the program started")


def test_the_demos_next_steps_are_the_readmes_commands() -> None:
    """`tracejudge demo` ends with the five-minute path: the same port, model, flags and commands as the README."""
    from tracejudge.consumer.cli.demo import TRY_NEXT

    title, lines = TRY_NEXT[0]
    assert "five-minute path" in title
    blocks = quickstart_blocks(README.read_text())
    base_url = next(line for line in blocks["consumer"] if line.startswith("export OPENAI_BASE_URL="))
    base_url = base_url.split()[1].removeprefix("OPENAI_BASE_URL=")
    assert any(line.startswith(f"OPENAI_BASE_URL={base_url} OPENAI_API_KEY=placeholder") for line in lines), lines
    assert "  " + blocks["consumer"][-1] in lines, lines
    assert "--start-from earliest" in blocks["consumer"][-1]
    assert blocks["broker"][-1] in lines[0]
    assert blocks["agent"][1] in lines and blocks["agent"][2] in lines, lines


def test_readme_quickstart_blocks_are_plain_commands() -> None:
    blocks = quickstart_blocks(README.read_text())
    assert tuple(blocks) == BLOCKS
    for lines in blocks.values():
        assert lines and all(line.strip() and not line.rstrip().endswith("\\") for line in lines), lines
    assert blocks["broker"][-1] == "tracejudge broker"
    assert sum(line.startswith("export OPENAI_BASE_URL=") for line in blocks["consumer"]) == 1
    assert any(line.startswith("export OPENAI_API_KEY=") for line in blocks["consumer"])


class Terminal:
    """A bash fed commands on stdin in its own session, as a terminal runs what is pasted into it; Ctrl-C is SIGINT
    to its process group."""

    def __init__(self, name: str, cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._marks = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # EOF wakes the waiters
            self._changed.notify_all()

    def send(self, command: str) -> str:
        """Type `command`; returns the marker line bash prints with its exit code once it has finished."""
        assert self.process.stdin is not None
        self._marks += 1
        mark = f"__{self.name}_done_{self._marks}__"
        self.process.stdin.write(f"{command}\necho {mark}$?\n")
        self.process.stdin.flush()
        return mark

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for line in self.lines:
                    found = regex.search(line)
                    if found:
                        return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._reader.is_alive():  # timed out, or the terminal is gone
                    pytest.fail(f"{self.name}: no line matching {pattern!r} in {timeout:.0f}s:\n" + self.tail())
                self._changed.wait(min(remaining, 1.0))

    def run(self, command: str, timeout: float, *, check: bool = True) -> int:
        """Type `command` and wait for it to finish; its exit code (which must be 0 with `check`)."""
        mark = self.send(command)
        code = int(self.wait_for(re.escape(mark) + r"(\d+)$", timeout).group(1))
        assert code == 0 or not check, f"{self.name}: `{command}` exited {code}:\n{self.tail()}"
        return code

    def output_after(self, start: int) -> list[str]:
        with self._changed:
            return list(self.lines[start:])

    def ctrl_c(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)

    def tail(self, lines: int = 40) -> str:
        with self._changed:
            return "\n".join(self.lines[-lines:])

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)


def judge_answer(request: dict[str, Any]) -> Reply:
    """A judge that gives the verdicts the README shows: the unanswerable question is an honest fallback."""
    if metric_of(request) == "conversational_flow":
        label = "fully"
    else:
        label = "honest_fallback" if "swallow" in conversation_text(request) else "not_applicable"
    return Reply(content=json.dumps({"verdict": label, "evidence": [], "reason": "scripted judge"}))


def watched_rows(lines: list[str]) -> list[list[str]]:
    """`tracejudge watch`'s verdict rows: judged at, conversation, agent, judge, verdict, reason."""
    return [line.split("  ")[1:] for line in lines if line.startswith("  ") and "  support-bot  " in line]


def user_environment() -> dict[str, str]:
    """The user's shell: no venv active, no tracejudge or OpenAI settings, pip's cache as it is."""
    venv = os.environ.get("VIRTUAL_ENV")
    path = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (venv and p.startswith(venv)) and not p.startswith(str(ROOT))
    ]
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRACEJUDGE_", "OPENAI_", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE", "CALF_"))
    }
    env["PATH"] = os.pathsep.join(path)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # loopback only: LiteLLM's bundled price list, no download
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in reversed(opened):
        terminal.close()


# fixed ports 9092 and 9464 (the README's), a fresh clone and install: alone
@pytest.mark.serial
@pytest.mark.timeout(900)
def test_readme_five_minute_path_in_a_fresh_clone(tmp_path: Path, terminals: list[Terminal]) -> None:
    for tool in ("git", "bash", "curl"):  # what the path assumes on the user's machine
        if shutil.which(tool) is None:
            missing_part(f"{tool} (apt-get install -y {tool})")
    busy = [port for port in PORTS if port_in_use(port)]
    assert not busy, f"the README's ports {busy} are taken on this machine: the five-minute path needs them free"
    readme = README.read_text()
    blocks = quickstart_blocks(readme)
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        run_path(tmp_path, terminals, readme, blocks, timings, started)
    finally:
        print("five-minute path: " + ", ".join(f"{step} at {seconds:.1f}s" for step, seconds in timings.items()))


def run_path(
    tmp_path: Path,
    terminals: list[Terminal],
    readme: str,
    blocks: dict[str, list[str]],
    timings: dict[str, float],
    started: float,
) -> None:
    clone = tmp_path / "tracejudge"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    env = user_environment()

    with JudgeServer(responder=judge_answer) as judge:
        # Terminal 1: install, then the broker in the foreground.
        broker = Terminal("broker", clone, env)
        terminals.append(broker)
        *install, start_broker = blocks["broker"]
        for command in install:
            broker.run(command, timeout=600)
        timings["install"] = time.monotonic() - started
        broker_done = broker.send(start_broker)
        broker.wait_for(r"Kafka .* at 127\.0\.0\.1:9092", timeout=60)
        timings["broker ready"] = time.monotonic() - started

        # Terminal 2: the consumer, with the judge the user points OPENAI_BASE_URL at.
        consumer = Terminal("consumer", clone, env)
        terminals.append(consumer)
        *setup, start_consumer = blocks["consumer"]
        for command in setup:
            if command.startswith("export OPENAI_BASE_URL="):
                command = f"export OPENAI_BASE_URL={judge.base_url}"
            consumer.run(command, timeout=60)
        consumer_done = consumer.send(start_consumer)
        said = re.search(r"logs `(metrics at [^`]+)`;.*? it logs `(ready: consuming partitions [^`]+)`", readme, re.S)
        assert said is not None, "the README says which lines the consumer logs, and which one means ready"
        consumer.wait_for(re.escape(said.group(1)), timeout=120)
        timings["consumer metrics"] = time.monotonic() - started
        consumer.wait_for(re.escape(said.group(2)), timeout=120)
        timings["consumer ready"] = time.monotonic() - started
        lines = consumer.output_after(0)
        metrics_at = next(i for i, line in enumerate(lines) if said.group(1) in line)
        assert metrics_at < next(i for i, line in enumerate(lines) if said.group(2) in line)  # in the README's order

        # Terminal 3: the example agent, then /metrics until the judged conversations show.
        agent = Terminal("agent", clone, env)
        terminals.append(agent)
        *commands, look = blocks["agent"]
        for command in commands:
            agent.run(command, timeout=120)
        timings["agent done"] = time.monotonic() - started
        expected = re.search(r"```text\n(.*?)\n```", readme[readme.index("<!-- quickstart:agent -->") :], re.S)
        assert expected is not None, "the README shows what /metrics says"
        shown = expected.group(1).splitlines()
        deadline = time.monotonic() + 120
        while True:
            start = len(agent.lines)
            code = agent.run(look, timeout=30, check=False)  # grep exits 1 until the first verdict
            seen = [line for line in agent.output_after(start) if line.startswith("tracejudge_")]
            if sorted(seen) == sorted(shown):  # exactly the README's lines: what the user sees, no more
                assert code == 0
                break
            assert time.monotonic() < deadline, f"/metrics never showed {shown}; last:\n" + "\n".join(seen)
            time.sleep(0.5)  # a user running curl again; the condition above is the barrier
        timings["judged"] = time.monotonic() - started

        # `tracejudge watch`, as written (live; piped here, so appended), until it lists the three conversations'
        # verdicts with their reasons; Ctrl-C exits 0. Then `--once`, as a script runs it: the same verdicts, counted.
        (watch,) = blocks["watch"]
        start = len(agent.lines)
        watching = agent.send(watch)
        deadline = time.monotonic() + 60
        while len(watched_rows(agent.output_after(start))) < 6:  # the metrics count before the results are acked
            assert time.monotonic() < deadline, "watch never listed the verdicts:\n" + agent.tail()
            time.sleep(0.2)  # a user looking again; the count above is the barrier
        agent.ctrl_c()
        assert agent.wait_for(re.escape(watching) + r"(\d+)$", timeout=30).group(1) == "0", agent.tail()
        start = len(agent.lines)
        agent.run(f"{watch} --once", timeout=60)
        shown = agent.output_after(start)
        rows = watched_rows(shown)
        assert len(rows) == 6 and len({row[1] for row in rows}) == 3, shown
        assert all(row[2] == "support-bot" and row[5] == "scripted judge" for row in rows), shown
        assert "  by verdict: fully 3, not_applicable 2, honest_fallback 1" in shown, shown
        timings["watched"] = time.monotonic() - started

        # Each conversation judged once per metric by the model the README names, over real HTTP.
        model = re.search(r"--judge-model (\S+)", start_consumer)
        assert model is not None
        assert len(judge.requests) == 6 and {r["model"] for r in judge.requests} == {model.group(1)}
        with urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10) as response:
            metrics = response.read().decode()
        failed = r'^tracejudge_(?:judge_errors_total\{[^}]*|sessions_total\{[^}]*outcome="failed"[^}]*)\} (\S+)'
        failures = re.findall(failed, metrics, re.M)
        assert all(float(value) == 0 for value in failures), metrics

        # The "Wrap your agent" snippet, as a user runs it next to the consumer: it ends its conversation, so the
        # conversation is judged now, not after the 300 s idle timeout.
        snippet_conversations = len(set(re.findall(r'session_id="([^"]+)"', readme_snippet(readme))))
        (clone / "my_app.py").write_text(runnable_snippet(readme_snippet(readme), "127.0.0.1:9092"))
        snippet_started = time.monotonic()
        agent.run("python my_app.py", timeout=120)
        judged = f'tracejudge_sessions_total{{agent="support-bot",outcome="judged"}} {3 + snippet_conversations}.0'
        while True:
            with urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10) as response:
                metrics = response.read().decode()
            if judged in metrics.splitlines():
                break
            assert time.monotonic() - snippet_started < 120, "the snippet's conversation was not judged promptly"
            time.sleep(0.5)  # a user running curl again; the condition above is the barrier
        timings["snippet judged"] = time.monotonic() - started
        assert "tracejudge_sessions_open 0.0" in metrics.splitlines(), metrics
        assert len(judge.requests) == 6 + 2 * snippet_conversations

        # Ctrl-C in terminals 2 and 1: both stop cleanly.
        consumer.ctrl_c()
        assert consumer.wait_for(re.escape(consumer_done) + r"(\d+)$", timeout=60).group(1) == "0", consumer.tail()
        broker.ctrl_c()
        assert broker.wait_for(re.escape(broker_done) + r"(\d+)$", timeout=30).group(1) == "0", broker.tail()
        broker.wait_for(r"^broker stopped$", timeout=5)
    timings["stopped"] = time.monotonic() - started
