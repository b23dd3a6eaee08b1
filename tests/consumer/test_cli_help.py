"""`--help` documents every flag: what it does, its environment variable and its default (made from Settings)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache

import pytest

from tracejudge.consumer.cli.options import OPTIONS, shown_default

# Every consume flag → (environment variable, default as --help shows it), made from Settings, the one definition
# (tracejudge.consumer.cli.options). The names and defaults are contracts: a change shows in docs/configuration.md's
# generated table, which tests/docs/test_docs.py holds to the committed page.
CONSUME_FLAGS = {option.flag: (option.env, shown_default(option.default)) for option in OPTIONS}


@cache
def help_entries(*command: str) -> dict[str, str]:
    """Each option's help text from the real `tracejudge ... --help`, whitespace collapsed, keyed by its long flag."""
    env = {**os.environ, "COLUMNS": "100"}
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *command, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    options = completed.stdout.split("\noptions:\n", 1)[1]
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", options):
        text = " ".join(block.split())
        flag = re.match(r"(?:-\w, )?(--[\w-]+)", text)
        assert flag is not None, block
        entries[flag.group(1)] = text
    entries.pop("--help")
    return entries


def test_the_options_are_the_settings_fields() -> None:
    from tracejudge.consumer.settings import Settings

    assert [option.field for option in OPTIONS] == list(Settings.model_fields)
    assert len(set(CONSUME_FLAGS)) == len(OPTIONS)  # no two fields share a flag
    assert CONSUME_FLAGS["--agent-sample-rate"] == ("TRACEJUDGE_AGENT_SAMPLE_RATES", "none")
    assert CONSUME_FLAGS["--bootstrap-servers"] == ("TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")


def test_consume_help_names_env_var_and_default_of_every_flag() -> None:
    entries = help_entries("consume")
    assert set(entries) == set(CONSUME_FLAGS)
    for flag, (env, default) in CONSUME_FLAGS.items():
        assert f"(env {env}, default {default})" in entries[flag], entries[flag]
        description = entries[flag].split(f"(env {env}")[0].split(maxsplit=2)[2]
        assert len(description.strip()) > 5, entries[flag]  # a description, not only the variable


@pytest.mark.parametrize("command", ["demo", "backfill", "calibrate", "compare"])
def test_every_flag_of_every_command_has_help_with_its_default(command: str) -> None:
    entries = help_entries(command)
    assert entries
    for flag, text in entries.items():
        assert "default" in text or "(required)" in text, text
        if flag in CONSUME_FLAGS:
            assert f"(env {CONSUME_FLAGS[flag][0]}, default " in text, text


def test_demo_shows_its_own_defaults() -> None:
    entries = help_entries("demo")
    assert "(env TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS, default an embedded broker)" in entries["--bootstrap-servers"]
    assert "(env TRACEJUDGE_JUDGE_MODEL, default a scripted judge)" in entries["--judge-model"]
