"""Shared fixtures: real parts only (Tansu broker, a local OpenAI-compatible judge server, Prometheus, promtool)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tests.support.judge_server import JudgeServer
from tracejudge.consumer.embedded_broker import BrokerUnavailable, EmbeddedBroker

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


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
