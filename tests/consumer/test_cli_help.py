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
    options = re.sub(r"\n\n[^\n ][^\n]*:\n", "\n", options)  # the section titles (Kafka:, Judge:, ...)
    epilog = options.find("\n\nexample")
    options = options if epilog < 0 else options[:epilog]
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", options):
        text = " ".join(block.split())
        flag = re.match(r"(?:-\w, )?(--[\w-]+)", text)
        assert flag is not None, block
        entries[flag.group(1)] = text
    entries.pop("--help")
    entries.pop("--version", None)
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


@pytest.mark.parametrize("command", ["demo", "backfill", "calibrate", "compare", "export", "modes"])
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


def test_every_setting_declares_its_help_section() -> None:
    """A Settings field without `group=` (one of settings.GROUPS) fails here by name; --help would list it last."""
    from tracejudge.consumer.settings import GROUPS

    ungrouped = [option.field for option in OPTIONS if option.group not in GROUPS]
    assert not ungrouped, f"Settings fields without a --help section (group=KAFKA, JUDGE, ...): {ungrouped}"


def test_consume_help_is_grouped_with_an_example() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", "consume", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    text = completed.stdout
    titles = ["Kafka:", "Judge:", "Sampling and budget:", "State:", "Outputs:", "Canary and shadow judge:"]
    positions = [text.find(f"\n{title}\n") for title in titles]
    assert all(p > 0 for p in positions) and positions == sorted(positions), text
    assert "Other (no group declared yet)" not in text
    sections = dict(zip(titles, re.split(r"\n(?:" + "|".join(map(re.escape, titles)) + r")\n", text)[1:], strict=True))
    assert "--bootstrap-servers" in sections["Kafka:"] and "--judge-model" in sections["Judge:"]
    assert "--metrics JUDGE[,JUDGE]" in sections["Judge:"] and "--metrics-port" in sections["Outputs:"]
    assert "--sample-rate" in sections["Sampling and budget:"] and "--shadow-judge-model" in text.split(titles[-1])[1]
    assert text.startswith("usage: tracejudge consume [OPTION ...]\n")  # not 46 lines of every flag
    example = text.split("\nexample")[1]
    assert "tracejudge consume --bootstrap-servers" in example and "--judge-model" in example
    metrics_help = " ".join(sections["Judge:"].split("--metrics JUDGE[,JUDGE]")[1].split("(env")[0].split())
    assert metrics_help.startswith("which judges run") and "--metrics-port" in metrics_help


def test_version() -> None:
    from importlib.metadata import version

    for command in (["--version"], ["consume", "--version"]):
        completed = subprocess.run(
            [sys.executable, "-m", "tracejudge.consumer", *command], capture_output=True, text=True, timeout=60
        )
        assert completed.returncode == 0, completed.stderr
        assert completed.stdout.strip() == f"tracejudge {version('tracejudge')}"


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["consume", "--judge-modle", "llama3.2"], "unrecognized argument --judge-modle: did you mean --judge-model?"),
        (["consume", "--metrics-prot=9000"], "unrecognized argument --metrics-prot: did you mean --metrics-port?"),
        (["backfill", "--form", "2026-01-01"], "unrecognized argument --form: did you mean --from?"),
        (["consme"], "unknown command 'consme': did you mean 'consume'?"),
    ],
)
def test_a_mistyped_flag_names_the_closest_one(argv: list[str], suggestion: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tracejudge.consumer", *argv], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines()[-1].endswith(suggestion), completed.stderr
    assert "Traceback" not in completed.stderr
    if argv[0] == "consume":  # the command's own short usage, not the top-level one
        assert completed.stderr.startswith("usage: tracejudge consume [OPTION ...]\n"), completed.stderr
