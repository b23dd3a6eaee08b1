"""`tracejudge demo`: the whole pipeline in one command — embedded Tansu broker, a traced support agent playing
scripted conversations, the consumer in-process with /metrics, and a judge (a real LLM, or a scripted one offline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tracejudge.metrics import CustomLLMClient
from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_SYSTEM_PROMPT
from tracejudge.metrics.transcript import END, START

from .options import WATCH_OPTIONS, add_consumer_flags, settings_from_args

SCRIPTED_NOTICE = "scripted judge (offline demo): verdicts are the scenario labels, not an LLM's"


@dataclass(frozen=True)
class Scenario:
    id: str
    agent: str
    turns: tuple[tuple[str, str], ...]
    failure_rate: str
    flow: str
    ends: bool = True
    error_turn: int | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "atlantis",
        "support-bot",
        (
            (
                "What was the population of Atlantis in 2024?",
                "Atlantis is a mythical city, so there is no real population data. Did you mean a real city?",
            ),
            (
                "And the exact depth of the Mariana Trench today?",
                "About 10,935 m by recent sonar surveys; NOAA publishes the current figure.",
            ),
        ),
        "alternative_proposed",
        "fully",
    ),
    Scenario(
        "password-reset",
        "support-bot",
        (
            ("I need to reset my password", "Sure. Please confirm the e-mail address on your account."),
            ("It is the one I signed up with last year", "A reset link is on its way to that address."),
        ),
        "not_applicable",
        "fully",
    ),
    Scenario(
        "invented-api",
        "support-bot",
        (
            (
                "Which API version added the refund_v3 endpoint?",
                "Version 4.2, released on 14 March 2023, added refund_v3 with the parameter partial_amount_cents.",
            ),
            ("Great, and is it rate limited?", "Yes, 120 requests per minute per key."),
        ),
        "hallucination",
        "mostly",
    ),
    Scenario(
        "refund-policy",
        "billing-bot",
        (
            (
                "Can I get a refund after 90 days?",
                "Yes, our policy guarantees refunds up to 180 days, no questions asked.",
            ),
            ("Where is that written?", "It is in section 14.3 of the terms, updated last week."),
        ),
        "hallucination",
        "partial",
    ),
    Scenario(
        "invoice-stall",
        "billing-bot",
        (
            ("Why did my invoice total change?", "There can be many reasons for changes."),
            ("Which reason applies to me?", "Invoices can vary. Let me know if you need anything else."),
            ("Can you just check my account?", "There can be many reasons for changes."),
        ),
        "stall",
        "minor",
    ),
    Scenario(
        "weather-derail",
        "support-bot",
        (
            ("What's the weather in Paris tomorrow?", "Here is a lovely recipe for chocolate chip cookies."),
            ("I asked about the weather", "The football scores last night were 2-1."),
            ("Are you reading my messages?", "Cookies need 12 minutes at 180°C."),
        ),
        "mixed",
        "none",
    ),
    Scenario(
        "flight-status",
        "support-bot",
        (
            ("Is flight LH 400 delayed?", "I can't see live flight data, sorry."),
            ("Then where can I check?", "The airline's app or the airport's departures page show live status."),
        ),
        "alternative_proposed",
        "mostly",
    ),
    Scenario(
        "tool-error",
        "billing-bot",
        (
            ("Show my last payment", ""),
            ("Hello? Show my last payment", "Sorry, the payments tool failed a moment ago. I can't see it right now."),
        ),
        "honest_fallback",
        "partial",
        error_turn=0,
    ),
    Scenario(
        "ceo-phone",
        "support-bot",
        (("Give me the CEO's personal phone number", "I don't have personal contact details and can't share them."),),
        "honest_fallback",
        "fully",
    ),
    Scenario(
        "vat-question",
        "billing-bot",
        (
            ("Do you charge VAT for customers in Germany?", "Yes, German customers are charged 19% VAT."),
            ("Thanks, that's all", "You're welcome!"),
        ),
        "not_applicable",
        "mostly",
        ends=False,
    ),
)


# The built-in taxonomy's mode of each hallucinating scenario (metrics/rubrics/failure_rate.yaml).
DEMO_FAILURE_MODES = {"invented-api": "invented_features", "refund-policy": "invented_policies"}


class ScriptedJudge(CustomLLMClient):
    """Offline stand-in for an LLM: answers each conversation with its scenario's intended label."""

    def __init__(self, scenarios: tuple[Scenario, ...] = SCENARIOS) -> None:
        self.by_first_question = {s.turns[0][0]: s for s in scenarios}
        self.calls = 0

    async def chat_complete(self, messages: list[dict[str, str]], temperature: float) -> tuple[str, float | None]:
        self.calls += 1
        system, user = messages[0]["content"], messages[1]["content"]
        turns = json.loads(user.split(START, 1)[1].split(END, 1)[0])
        scenario = self.by_first_question.get(turns[0].get("user", ""))
        if scenario is None:
            return json.dumps({"verdict": "unknown-scenario", "reason": "not a demo conversation"}), None
        flow = system == CONVERSATIONAL_FLOW_SYSTEM_PROMPT
        label = scenario.flow if flow else scenario.failure_rate
        key = "key_issues" if flow else "evidence"
        answer: dict[str, Any] = {"verdict": label, key: [], "reason": f"scenario {scenario.id!r} is labelled {label}"}
        if not flow:  # what a hallucination is about (the built-in taxonomy); null for any other verdict
            answer["failure_mode"] = DEMO_FAILURE_MODES.get(scenario.id) if label == "hallucination" else None
        return json.dumps(answer), None

    def get_model_name(self) -> str:
        return "scripted-demo-judge"


def play_scenarios(provider: Any, run_id: str, scenarios: tuple[Scenario, ...] = SCENARIOS) -> list[str]:
    """The example support agent, traced with @traced_agent, plays every scenario; returns the conversation ids."""
    from tracejudge.tracer import end_conversation, traced_agent

    class ToolFailed(RuntimeError):
        pass

    script: dict[str, tuple[str, bool]] = {}

    def agent_for(name: str) -> Any:
        @traced_agent(name, tracer_provider=provider)
        def answer(question: str, session_id: str) -> str:
            reply, fails = script[f"{session_id}\x00{question}"]
            if fails:
                raise ToolFailed("payments tool timed out")
            return reply

        return answer

    agents = {name: agent_for(name) for name in sorted({s.agent for s in scenarios})}
    ids = []
    for scenario in scenarios:
        conversation_id = f"{scenario.id}-{run_id}"
        ids.append(conversation_id)
        for index, (question, reply) in enumerate(scenario.turns):
            script[f"{conversation_id}\x00{question}"] = (reply, index == scenario.error_turn)
            try:
                agents[scenario.agent](question, session_id=conversation_id)
            except ToolFailed:
                pass  # the agent's error turn is recorded on its span; the app carries on
        if scenario.ends:
            end_conversation(conversation_id, agent=scenario.agent, tracer_provider=provider)
    provider.force_flush()
    return ids


def expected_summary(scenarios: tuple[Scenario, ...] = SCENARIOS) -> dict[str, dict[str, float]]:
    """What the scripted judge must produce per agent: hallucination rate and mean flow score."""
    from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS

    out: dict[str, dict[str, float]] = {}
    for agent in sorted({s.agent for s in scenarios}):
        mine = [s for s in scenarios if s.agent == agent]
        out[agent] = {
            "conversations": len(mine),
            "hallucination_rate": sum(s.failure_rate == "hallucination" for s in mine) / len(mine),
            "flow_score": sum(CONVERSATIONAL_FLOW_WEIGHTS[s.flow] for s in mine) / len(mine),
        }
    return out


def _sample(registry: Any, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def summarise(registry: Any, agents: list[str]) -> dict[str, dict[str, Any]]:
    from tracejudge.metrics.conversational_flow import CONVERSATIONAL_FLOW_WEIGHTS
    from tracejudge.metrics.failure_rate import FAILURE_RATE_WEIGHTS

    summary: dict[str, dict[str, Any]] = {}
    for agent in agents:
        verdicts = {
            f"{metric}:{label}": int(
                _sample(registry, "tracejudge_verdicts_total", agent=agent, metric=metric, verdict=label)
            )
            for metric, labels in (
                ("failure_rate", FAILURE_RATE_WEIGHTS),
                ("conversational_flow", CONVERSATIONAL_FLOW_WEIGHTS),
            )
            for label in labels
        }
        summary[agent] = {
            "conversations": int(_sample(registry, "tracejudge_sessions_total", agent=agent, outcome="judged")),
            "failed": int(_sample(registry, "tracejudge_sessions_total", agent=agent, outcome="failed")),
            "hallucination_rate": registry.get_sample_value("tracejudge_hallucination_rate", {"agent": agent}),
            "flow_score": registry.get_sample_value("tracejudge_flow_score", {"agent": agent}),
            "verdicts": {k: v for k, v in verdicts.items() if v},
            "failure_modes": _modes_of(registry, agent),
        }
    return summary


def _modes_of(registry: Any, agent: str) -> dict[str, int]:
    """`metric:verdict:mode` → count for the agent's failing verdicts (tracejudge_failure_modes_total)."""
    modes: dict[str, int] = {}
    for family in registry.collect():
        if family.name != "tracejudge_failure_modes":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels.get("agent") == agent and sample.value:
                modes[f"{labels['metric']}:{labels['verdict']}:{labels['mode']}"] = int(sample.value)
    return modes


# Consumer flags the demo sets itself (its own topic, group and idle timeout) or has no use for.
DEMO_SKIPS = ("topic", "group_id", "start_from", "session_idle_timeout", "calibration", "judge_check", *WATCH_OPTIONS)
DEMO_DEFAULTS = {  # what --help shows as the demo's defaults
    "bootstrap_servers": "an embedded broker",
    "judge_model": "a scripted judge",
    "metrics_host": "127.0.0.1",
    "metrics_port": "a free port",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_consumer_flags(parser, skip=DEMO_SKIPS, defaults=DEMO_DEFAULTS)
    parser.add_argument(
        "--serve", action="store_true", help="keep running after the demo for Prometheus and Grafana (default off)"
    )
    parser.add_argument(
        "--seconds-idle", type=float, default=3.0, help="the demo's conversation idle timeout (default %(default)s)"
    )


def run_demo(namespace: argparse.Namespace) -> int:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from prometheus_client import CollectorRegistry
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from tracejudge.tracer import setup_tracing

    from .._logging import configure_logging
    from ..app import build_app
    from ..embedded_broker import EmbeddedBroker
    from ..emit.prometheus import family_total

    console = Console()
    configure_logging("WARNING")
    given = vars(namespace)
    real_model = given.get("judge_model") or os.environ.get("TRACEJUDGE_JUDGE_MODEL")
    broker = None
    bootstrap = given.get("bootstrap_servers") or os.environ.get("TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS")
    run_id = uuid.uuid4().hex[:6]
    topic = f"tracejudge_demo_{run_id}"
    if not bootstrap:
        broker = EmbeddedBroker().start()
        bootstrap = broker.bootstrap_servers
        console.print(f"[bold]embedded Kafka broker[/bold] (Tansu) on {bootstrap}")
    else:
        console.print(f"[bold]Kafka[/bold] at {bootstrap}")
    namespace.bootstrap_servers = bootstrap
    settings = settings_from_args(namespace).model_copy(
        update={
            "topic": topic,
            "group_id": f"tracejudge-demo-{run_id}",
            "start_from": "earliest",
            "session_idle_timeout": namespace.seconds_idle,
            "commit_interval": 0.5,
            "kafka_config": {
                "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000,
                **given_kafka_config(namespace),
            },
        }
    )
    if "metrics_port" not in given:
        settings = settings.model_copy(update={"metrics_port": 0, "metrics_host": "127.0.0.1"})
    # The demo's group is new each run: its local store would only be litter in the clone, unless asked for.
    scratch = None
    if "state_dir" not in given and not os.environ.get("TRACEJUDGE_STATE_DIR"):
        scratch = tempfile.mkdtemp(prefix="tracejudge-demo-state-")
        settings = settings.model_copy(update={"state_dir": scratch})
    judge: Any
    if real_model:
        judge = None
        console.print(f"[bold]judge:[/bold] {real_model} through LiteLLM (a real LLM)")
    else:
        judge = ScriptedJudge()
        console.print(f"[bold yellow]judge: {SCRIPTED_NOTICE}[/bold yellow]")
    try:
        if broker is not None:
            broker.create_topic(topic, partitions=3)
        else:
            _create_topic(bootstrap, topic)
        app = build_app(settings, judge=judge, registry=CollectorRegistry())
        consumer_thread = threading.Thread(target=app.run, name="demo-consumer", daemon=True)
        consumer_thread.start()
        app.service.ready.wait(30)
        console.print(f"[bold]metrics:[/bold] {app.metrics_url}")
        provider = setup_tracing(
            "tracejudge-demo-agent",
            kafka_bootstrap_servers=bootstrap,
            topic=topic,
            set_global=False,
            schedule_delay_millis=100,
        )
        total = len(SCENARIOS)
        registry = app.registry
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            traced = progress.add_task("conversations traced  ", total=total)
            assembled = progress.add_task("conversations complete", total=total)
            judged = progress.add_task("conversations judged  ", total=total)
            ids = play_scenarios(provider, run_id)
            progress.update(traced, completed=len(ids))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                done = sum(
                    _sample(registry, "tracejudge_sessions_total", agent=agent, outcome=outcome)
                    for agent in {s.agent for s in SCENARIOS}
                    for outcome in ("judged", "failed", "sampled_out", "skipped_budget")
                )
                completed = family_total(registry, "tracejudge_conversations_completed")  # sent to the judge queue
                progress.update(assembled, completed=min(total, int(completed)))
                progress.update(judged, completed=done)
                if done >= total:
                    break
                time.sleep(0.2)
        agents = sorted({s.agent for s in SCENARIOS})
        summary = summarise(registry, agents)
        _print_summary(console, summary, registry, Table)
        console.print(f"\n[bold]/metrics:[/bold] {app.metrics_url}")
        if judge is not None:
            console.print(f"[yellow]{SCRIPTED_NOTICE}[/yellow]")
        console.print(closing_text(scripted=judge is not None), highlight=False, soft_wrap=True)
        summary_path = os.environ.get("TRACEJUDGE_DEMO_SUMMARY")
        if summary_path:
            with open(summary_path, "w", encoding="utf-8") as handle:
                json.dump({"agents": summary, "expected": expected_summary(), "scripted": judge is not None}, handle)
        if namespace.serve:
            console.print("[bold]--serve:[/bold] running until Ctrl-C (Prometheus can scrape the URL above)")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        provider.shutdown()
        app.service.request_stop()
        consumer_thread.join(60)
        return 0
    finally:
        if broker is not None:
            broker.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


SUMMARY_COLUMNS = ("agent", "judged", "failed", "hallucination rate", "flow score")
# Every number the demo prints, explained at its end (tests/demo checks each column of the summary is here).
WHAT_THE_NUMBERS_MEAN = (
    ("judged", 'conversations both judges scored (tracejudge_sessions_total{outcome="judged"})'),
    (
        "failed",
        "conversations a judge could not score (timeout, provider error, an answer outside the labels): counted "
        "with a reason in tracejudge_judge_errors_total, never given a score",
    ),
    (
        "hallucination rate",
        "share of the agent's recent judged conversations (last 100, within 15 min) whose Failure Rate verdict is "
        "hallucination: 0.00 is none, 1.00 is all (tracejudge_hallucination_rate)",
    ),
    (
        "flow score",
        "mean Conversational Flow score over the same window: fully 1.0, mostly 0.9, partial 0.7, minor 0.3, "
        "none 0.0; 0.7 and above passes (tracejudge_flow_score)",
    ),
    (
        "verdicts",
        "every label a judge gave, per agent and metric (tracejudge_verdicts_total): the counts behind both rates",
    ),
    ("judge calls / cost", "LLM calls made and their price as LiteLLM reports it (a scripted judge costs $0)"),
)

TRY_NEXT = (
    (
        "Your own agent, end to end (the README's five-minute path)",
        (
            "tracejudge broker     # terminal 1: a local Kafka (the embedded Tansu) on 127.0.0.1:9092",
            "# terminal 2: the judge is your local OpenAI-compatible server (Ollama here; vLLM :8000/v1, llama.cpp "
            ":8080/v1)",
            "OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=placeholder \\",
            "  tracejudge consume --bootstrap-servers 127.0.0.1:9092 --judge-model llama3.2 --start-from earliest",
            "# terminal 3, once terminal 2 logged `ready: consuming partitions [0]`:",
            "TRACEJUDGE_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 EXAMPLE_CHATS=3 EXAMPLE_PAUSE_S=0 python "
            "examples/support_agent.py",
            "curl -s http://127.0.0.1:9464/metrics | grep -E '^tracejudge_(sessions|verdicts)_total' | grep -v ' 0.0$'",
        ),
    ),
    (
        "This demo with a real LLM as the judge",
        (
            "OPENAI_API_KEY=sk-... tracejudge demo --judge-model gpt-4o-mini",
            "(or OPENAI_BASE_URL + a placeholder OPENAI_API_KEY for a local OpenAI-compatible server)",
        ),
    ),
    (
        "Prometheus and Grafana",
        (
            "tracejudge demo --serve     # keeps /metrics up until Ctrl-C; point a Prometheus scrape job at it",
            "cd deploy && docker compose up --build     # Kafka, consumer, Prometheus + alerts, Grafana dashboard",
        ),
    ),
    (
        "How far to trust the judge",
        ("tracejudge calibrate --judge-model gpt-4o-mini   # accuracy and kappa against the built-in gold set",),
    ),
)


def closing_text(*, scripted: bool) -> str:
    """The demo's last words: what each number above means and what to run next (tested in tests/demo)."""
    lines = ["", "[bold]What the numbers mean[/bold]"]
    lines += [f"  [bold]{name}[/bold]: {meaning}" for name, meaning in WHAT_THE_NUMBERS_MEAN]
    if scripted:
        lines.append(
            "  With the scripted judge the verdicts are each scenario's intended label, so the rates show what the "
            "pipeline computes, not how good an LLM judge is."
        )
    lines += ["", "[bold]What to try next[/bold]"]
    for title, commands in TRY_NEXT:
        lines.append(f"  [bold]{title}[/bold]")
        lines += [f"    {command}" for command in commands]
    return "\n".join(lines)


def given_kafka_config(namespace: argparse.Namespace) -> dict[str, Any]:

    return settings_from_args(namespace).kafka_config


def _create_topic(bootstrap: str, topic: str) -> None:
    from ..kafka import KafkaClients

    with KafkaClients(bootstrap).admin("tracejudge-demo") as admin:  # replication -1: the cluster's default
        admin.create_topics({topic: {"num_partitions": 3, "replication_factor": -1}})


def _print_summary(console: Any, summary: dict[str, dict[str, Any]], registry: Any, table_cls: Any) -> None:
    from ..emit.prometheus import family_total

    table = table_cls(title="tracejudge demo: per agent")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, no_wrap=True)
    for agent, row in summary.items():
        rate, flow = row["hallucination_rate"], row["flow_score"]
        table.add_row(
            agent,
            str(row["conversations"]),
            str(row["failed"]),
            "—" if rate is None else f"{rate:.2f}",
            "—" if flow is None else f"{flow:.2f}",
        )
    console.print(table)
    verdicts = table_cls(title="verdicts")
    for column in ("agent", "metric", "verdict", "count"):
        verdicts.add_column(column, no_wrap=True)
    for agent, row in summary.items():
        for key, count in sorted(row["verdicts"].items()):
            metric, verdict = key.split(":")
            verdicts.add_row(agent, metric, verdict, str(count))
    console.print(verdicts)
    modes = table_cls(title="what the failures are about (tracejudge_failure_modes_total)")
    for column in ("agent", "metric", "verdict", "mode", "count"):
        modes.add_column(column, no_wrap=True)
    for agent, row in summary.items():
        for key, count in sorted(row.get("failure_modes", {}).items()):
            modes.add_row(agent, *key.split(":"), str(count))
    if modes.row_count:
        console.print(modes)
    calls = family_total(registry, "tracejudge_judge_latency_seconds", "_count")
    cost = family_total(registry, "tracejudge_judge_cost_usd")
    console.print(f"judge calls: {int(calls)}   judge cost: ${cost:.4f}")
