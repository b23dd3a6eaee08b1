"""Shared fixtures: real parts only (Tansu broker, a local OpenAI-compatible judge server, Prometheus, promtool)."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.support.judge_server import JudgeServer
from tracejudge.consumer.embedded_broker import BrokerUnavailable, EmbeddedBroker

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# Threads a library starts once per process and keeps for the process's life: not something a test started and left.
PROCESS_LIFETIME_THREADS = (
    "litellm-logging_",  # LiteLLM's logging worker: started by its first call, kept for the process, no way to stop it
)
# How long a test's own threads and processes get to end after its teardown before it fails for leaving them: a
# barrier (join / wait), so a clean test costs nothing.
LEAK_GRACE_S = 10.0


def _state(pid: int) -> str | None:
    """A process's state letter from /proc (Z: a zombie, ended with only its exit status left), None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def running_children() -> dict[int, str]:
    """This process's children still running, pid -> command."""
    children: dict[int, str] = {}
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            pids = [int(pid) for pid in task.read_text().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if _state(pid) not in (None, "Z"):
                children[pid] = command.strip()[:120]
    return children


@pytest.fixture(autouse=True)
def _closes_what_it_starts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test that leaves a thread or a child process running after its teardown: a Kafka client thread that
    outlives its test logs into a closed capture (`ValueError: I/O operation on closed file`) and costs later tests CPU.

    Autouse and function-scoped, it is set up after the session's and module's fixtures (their broker and consumers
    are not the test's) and torn down after the test's own fixtures, which must close what they started."""
    threads_before = set(threading.enumerate())
    children_before = set(running_children())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    threads = [
        thread
        for thread in threading.enumerate()
        if thread not in threads_before and not thread.name.startswith(PROCESS_LIFETIME_THREADS)
    ]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    children = {pid: command for pid, command in running_children().items() if pid not in children_before}
    while children and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a process's end: /proc has no wait for a process another object may reap
        children = {pid: command for pid, command in children.items() if _state(pid) not in (None, "Z")}
    left = [f"thread {thread.name!r}" for thread in threads if thread.is_alive()]
    left += [f"process {pid} ({command})" for pid, command in children.items()]
    if left:
        pytest.fail(f"{request.node.nodeid} left running after its teardown: {'; '.join(left)}", pytrace=False)


@pytest.fixture(autouse=True)
def _traced_apps_shut_down(_closes_what_it_starts: None) -> Iterator[None]:
    """The traced apps a test made (tests/support/pipeline.py's `traced_app`) are shut down after it, before the
    check above; a module's shared one stays up for the module."""
    from tests.support.pipeline import TRACED_APPS

    before = len(TRACED_APPS)
    yield
    made = TRACED_APPS[before:]
    del TRACED_APPS[before:]
    for provider in made:
        provider.shutdown()


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every consumer a test starts (in-process or `tracejudge consume`, which inherits the variable) keeps its local
    store in a directory of that test's own, never in the working tree; tests of the store pass their own."""
    monkeypatch.setenv("TRACEJUDGE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


def missing_part(what: str) -> None:
    """Under CI a missing broker, Prometheus or promtool fails the test; on a laptop it skips."""
    if IN_CI:
        pytest.fail(f"{what} is missing, and CI=true forbids skipping", pytrace=False)
    pytest.skip(f"{what} is missing")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing_part(f"{name} (apt-get install -y prometheus)")
    assert path is not None
    return path


@pytest.fixture
def judge_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[JudgeServer]:
    from tracejudge.metrics._response_modes import RESPONSE_MODES

    RESPONSE_MODES.forget()  # a new server is a new "provider": what a model accepted is learnt again
    server = JudgeServer().start()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    try:
        instance = EmbeddedBroker().start()
    except BrokerUnavailable as exc:
        missing_part(f"Tansu broker ({exc})")
        raise
    yield instance
    instance.stop()


@pytest.fixture
def topic(broker: EmbeddedBroker) -> str:
    name = f"spans-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions=3)
    return name
