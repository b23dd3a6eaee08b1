"""The base install (`pip install ./tracejudge`, from a clone) is what tracing needs, nothing more: no gRPC, no
phonenumbers.

Read from pyproject.toml, and checked against what the tracer really loads: a fresh interpreter imports the tracer and
builds a provider with its OTLP/HTTP exporter, and every distribution it loaded must come with the base dependencies.
Kafka-free: building a provider without bootstrap servers connects to nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NOT_FOR_TRACING = {"grpcio", "phonenumbers", "opentelemetry-exporter-otlp", "litellm", "pydantic", "pydantic-settings"}


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def top_level_modules(code: str) -> set[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted({{name.partition('.')[0] for name in sys.modules}})))"
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return set(json.loads(completed.stdout.splitlines()[-1]))


def loaded_by_tracing(code: str) -> set[str]:
    """The top-level modules `import tracejudge.tracer` and `code` load in a fresh interpreter (not its start-up's)."""
    return top_level_modules(f"import tracejudge.tracer\n{code}") - top_level_modules("")


def base_closure() -> set[str]:
    """The base dependencies and everything they pull in (their own unconditional requirements), as installed."""
    closure: set[str] = set()
    pending = list(names(PROJECT["dependencies"]))
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        closure.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return closure


def test_base_dependencies_leave_out_grpc_phonenumbers_and_the_judges() -> None:
    base = names(PROJECT["dependencies"])
    assert base & NOT_FOR_TRACING == set()
    assert "grpcio" not in base_closure() and "phonenumbers" not in base_closure()
    extras = {extra: names(requirements) for extra, requirements in PROJECT["optional-dependencies"].items()}
    # Moved, not dropped: the consumer's OTLP output (grpc or http) and its default redactor still install with it.
    assert {"opentelemetry-exporter-otlp", "phonenumbers", "pydantic"} <= extras["consumer"]
    assert extras["redact"] == {"phonenumbers"}
    assert PROJECT["optional-dependencies"]["all"] == ["tracejudge[redact,judges,consumer,demo,test,librdkafka]"]


def test_import_tracer_loads_neither_grpc_nor_phonenumbers() -> None:
    code = (
        "from tracejudge.tracer import setup_tracing\n"
        "setup_tracing(otlp_endpoint='http://127.0.0.1:4318', service_name='svc', set_global=False)\n"
        "from tracejudge.tracer.exporter import KafkaSpanExporter\n"
        "import kafka  # the exporter's producer, imported when it is built\n"
    )
    loaded = loaded_by_tracing(code)
    assert {"grpc", "phonenumbers", "litellm", "pydantic"} & loaded == set()
    assert {"opentelemetry", "kafka", "google"} <= loaded  # the check saw the tracer's real imports

    # A module some installed distribution provides must come with the base install (a namespace such as `google`
    # is shared by several distributions: one of them in the base is enough).
    closure = base_closure() | {"tracejudge"}
    by_module = metadata.packages_distributions()
    outside = {
        module: by_module[module]
        for module in loaded - set(sys.stdlib_module_names)
        if module in by_module and not {canonicalize_name(name) for name in by_module[module]} & closure
    }
    assert outside == {}, f"tracing loads modules the base install does not bring: {outside}"


def test_the_redactor_door_says_which_extra_is_missing() -> None:
    """`tracejudge.tracer.redact` (traced_agent(redactor=redact_pii)) without phonenumbers: one clear line."""
    blocked = "import sys; sys.modules['phonenumbers'] = None\nimport tracejudge.tracer.redact"
    completed = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    assert completed.returncode != 0
    last = completed.stderr.strip().splitlines()[-1]
    assert (
        last == "ImportError: tracejudge.tracer.redact needs phonenumbers (the redact extra): pip install phonenumbers"
    )

    works = "from tracejudge.tracer.redact import redact_pii; print(redact_pii('mail sam@example.com'))"
    completed = subprocess.run([sys.executable, "-c", works], capture_output=True, text=True, timeout=60)
    assert completed.stdout.strip() == "mail [EMAIL]", completed.stderr
