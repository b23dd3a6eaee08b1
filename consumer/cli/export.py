"""`tracejudge export`: the conversations behind chosen verdicts, as a dataset and a regression suite.

Read from the results topic (the consumer's `<group>-results`, found from --group-id alone, or --results-topic; no
group joined, no commits): a record carries its conversation's turns as the judge saw them (redacted, clipped,
windowed) when the consumer runs with `--results-transcript`; records without them are counted and said, never
exported half, and when none of the matching results has one, nothing is written and the one line says what to
switch on (exit 2, as the other "nothing to work with" answers). A result id read twice counts once, its newest
copy winning (a replay re-judged differently). One JSON line per conversation (its latest judged transcript that
matches), shaped as the seeds' `ConversationalEvalTestCase` (`name`, `turns`) with the verdict, reason, evidence,
model, rubric version, result id and trace id; `tracejudge.metrics.dataset.load_conversations(path)` reads it back.
`--pytest` writes a test module that re-judges each of them (REGRESSION_SUITE): it runs where it was made, in the
consumer's install, with `python FILE` (pytest optional), and says at its top which judge variables it needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from os.path import relpath
from pathlib import Path
from typing import Any

from ..judging.gold import LABELS, judge_name, labels_with, unknown_verdicts
from .compare import COMPARE_OPTIONS

EXIT_OK, EXIT_USAGE = 0, 2
EXPORT_OPTIONS = COMPARE_OPTIONS  # the same reader of the results topic: where it is and how to log


class ExportError(ValueError):
    """A usage error: one line on stderr, exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verdict",
        action="append",
        default=None,
        metavar="LABEL[,LABEL]",
        help="only these verdicts, e.g. hallucination,stall (repeatable; default every verdict)",
    )
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        type=judge_name,
        help="only this judge: a built-in or a rubric file's (repeatable; default all)",
    )
    parser.add_argument(
        "--mode",
        action="append",
        default=None,
        metavar="NAME[,NAME]",
        help="only failing verdicts about these failure modes, e.g. invented_policies (repeatable; default any)",
    )
    parser.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    parser.add_argument(
        "--from",
        dest="start",
        default=None,
        metavar="TIME",
        help="judged at or after (ISO 8601 or Unix seconds; default the topic's start)",
    )
    parser.add_argument("--to", dest="end", default=None, metavar="TIME", help="judged before: as --from (default now)")
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="at most N conversations, the latest judged (default all)"
    )
    parser.add_argument(
        "--include-shadow",
        action="store_true",
        help="also the shadow judge's verdicts (default: production verdicts only)",
    )
    parser.add_argument(
        "--output", required=True, metavar="PATH.jsonl", help="the dataset: one JSON line a conversation (required)"
    )
    parser.add_argument(
        "--pytest",
        default=None,
        metavar="test_PATH.py",
        help="also write a test module that re-judges every exported conversation: `python FILE` in the consumer's "
        "install, or pytest (default not written)",
    )


@dataclass
class Selection:
    verdicts: set[str] | None = None
    metrics: list[str] | None = None
    agent: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    limit: int | None = None
    include_shadow: bool = False
    modes: set[str] | None = None


@dataclass
class Export:
    lines: list[dict[str, Any]] = field(default_factory=list)
    records: int = 0  # results-topic records read
    matched: int = 0  # distinct results that matched the selection
    without_transcript: int = 0  # matched results written without --results-transcript (not exported)


def _judged_at(record: dict[str, Any]) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(record.get("judged_at")))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _matches(record: dict[str, Any], selection: Selection) -> bool:
    if record.get("verdict") is None or record.get("error") is not None:
        return False
    if record.get("shadow") and not selection.include_shadow:
        return False
    if selection.verdicts is not None and str(record.get("verdict")) not in selection.verdicts:
        return False
    if selection.modes is not None and record.get("failure_mode") not in selection.modes:
        return False
    if selection.metrics and record.get("metric") not in selection.metrics:
        return False
    if selection.agent is not None and record.get("agent") != selection.agent:
        return False
    if selection.start is not None or selection.end is not None:
        judged = _judged_at(record)
        if judged is None:
            return False
        if (selection.start is not None and judged < selection.start) or (
            selection.end is not None and judged >= selection.end
        ):
            return False
    return True


def turns_of(transcript: list[Any]) -> tuple[list[dict[str, str]], int]:
    """The judged transcript's turns as test-case turns, and how many the judge's window omitted."""
    turns: list[dict[str, str]] = []
    omitted = 0
    for item in transcript:
        if not isinstance(item, dict):
            continue
        if "omitted" in item:
            digits = "".join(ch for ch in str(item["omitted"]) if ch.isdigit())
            omitted += int(digits) if digits else 0
            continue
        turns.append({"input": str(item.get("user") or ""), "actual_output": str(item.get("assistant") or "")})
    return turns, omitted


_RESULT_KEYS = (
    "metric",
    "verdict",
    "failure_mode",
    "score",
    "reason",
    "evidence",
    "model",
    "rubric_version",
    "result_id",
    "shadow",
)


def select(records: Sequence[dict[str, Any]], selection: Selection) -> Export:
    """One line per conversation: its latest matching transcript (highest version, then latest judged), with every
    matching result of that transcript. A result written twice (a replay: the same result id) counts once, and its
    newest copy (the last read: a result id's records share a partition) is the one that stands: a replay re-judged
    differently overrides the earlier verdict, also when the newer one no longer matches. A copy without a verdict
    (a replay whose judge call failed) overrides nothing: the verdict already given stands."""
    export = Export(records=len(records))
    newest: dict[str, dict[str, Any]] = {}
    for record in records:
        result_id = record.get("result_id")
        if isinstance(result_id, str):
            if record.get("verdict") is None and result_id in newest:
                continue  # a failed re-judgement: no verdict to replace the one on the topic
            newest.pop(result_id, None)  # re-inserted: the dict keeps the order of each id's newest copy
            newest[result_id] = record
    by_transcript: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in newest.values():
        if not _matches(record, selection):
            continue
        export.matched += 1
        if not isinstance(record.get("transcript"), list):
            export.without_transcript += 1
            continue
        key = (str(record.get("conversation_id")), str(record.get("content_id")))
        by_transcript.setdefault(key, []).append(record)
    latest: dict[str, list[dict[str, Any]]] = {}
    for (conversation_id, _content), results in by_transcript.items():
        current = latest.get(conversation_id)
        if current is None or _order(results) > _order(current):
            latest[conversation_id] = results
    chosen = sorted(latest.values(), key=_order, reverse=True)
    if selection.limit is not None:
        chosen = chosen[: selection.limit]
    metric_order = {name: i for i, name in enumerate(selection.metrics or sorted(LABELS))}
    for results in sorted(chosen, key=_order):  # oldest first in the file
        results.sort(  # a judge not in the order (a rubric file's): after the known ones, by name
            key=lambda r: (
                metric_order.get(str(r.get("metric")), len(metric_order)),
                str(r.get("metric")),
                bool(r.get("shadow")),
            )
        )
        export.lines.append(line_of(results))
    return export


def _order(results: list[dict[str, Any]]) -> tuple[int, str]:
    first = results[0]
    version = first.get("version")
    return (version if isinstance(version, int) else 0, str(max(str(r.get("judged_at")) for r in results)))


def line_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A ConversationalEvalTestCase's keys (`name`, `turns`) and the first result's verdict at the top level; every
    matching result of this transcript under `results`."""
    first = results[0]
    turns, omitted = turns_of(first["transcript"])
    line: dict[str, Any] = {
        "name": first.get("conversation_id"),
        "turns": turns,
        "conversation_id": first.get("conversation_id"),
        "agent": first.get("agent"),
        **{key: first.get(key) for key in _RESULT_KEYS},
        "trace_id": first.get("trace_id"),
        "content_id": first.get("content_id"),
        "version": first.get("version"),
        "turns_omitted": omitted,
        "judged_at": first.get("judged_at"),
        "results": [{key: record.get(key) for key in _RESULT_KEYS} for record in results],
    }
    return line


REGRESSION_SUITE = '''"""Regression suite written by `tracejudge export` ({when}): {count}, {what}.

How to run it: in the environment tracejudge's consumer is installed in (from a clone:
`pip install './tracejudge[consumer]'`, where ./tracejudge is the clone), with the judge's variables set as for
`tracejudge consume`:

    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=placeholder python {name}

OPENAI_BASE_URL and OPENAI_API_KEY (any value for a local server) for an OpenAI-compatible server (Ollama, vLLM,
llama.cpp); for a hosted model only its provider's key (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY, ...).
Without them it stops at once with one line naming the missing variable. Where pytest is installed too
(`pip install pytest`: not part of the consumer's install), `python -m pytest {name}` runs the same tests.
The judge model is TRACEJUDGE_JUDGE_MODEL (default: the recorded one, {models}). LiteLLM's bundled price list is
used (no download).

Each test re-judges one exported conversation, its turns exactly as the production judge saw them (redacted,
windowed), with the metric that judged it:

- Re-judging the recorded answers (the default): a test fails when the verdict is no longer the recorded one, i.e.
  the judge (model, rubric, prompt) no longer judges the conversation as production did.
- With TRACEJUDGE_REPLAY_AGENT=package.module:function, the user turns are replayed through your agent
  (`function(history, user_message) -> answer`, sync or async; history: the replayed turns so far, as
  `EvalTestCase`s) and the new transcript is judged: a test fails while the conversation is still judged as it was,
  so the suite passes once the changed agent or prompt no longer fails these conversations.
"""

from __future__ import annotations

import os
import sys

# Before LiteLLM is imported (by tracejudge.metrics): its bundled price list, not a fetch from the internet.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import importlib
import inspect
from pathlib import Path

from tracejudge.metrics import (
    ConversationalFlowRateMetric,
    EvalTestCase,
    FailureRateMetric,
    evaluate_conversations,
)
from tracejudge.metrics.compat import ConversationalEvalTestCase
from tracejudge.metrics.dataset import load_conversations
from tracejudge.metrics.rubric import Rubric, metric_class

DATASET = Path(__file__).parent / {dataset}
CASES = load_conversations(DATASET)
JUDGES = {{"failure_rate": FailureRateMetric, "conversational_flow": ConversationalFlowRateMetric}}
# The rubric files' judges among the exported results, as their files said when exported (`--judge-file`).
RUBRICS = {rubrics}
JUDGES.update({{name: metric_class(Rubric.model_validate(rubric)) for name, rubric in RUBRICS.items()}})
REPLAY_AGENT = os.environ.get("TRACEJUDGE_REPLAY_AGENT")
PARAMS = [(case, result) for case in CASES for result in case.results]
IDS = [f"{{case.name}}-{{result['metric']}}" for case, result in PARAMS]


def judge_model(recorded: dict) -> str:
    return os.environ.get("TRACEJUDGE_JUDGE_MODEL") or recorded["model"]


def missing_variable(model: str) -> str | None:
    """One line naming the variable the judge `model` needs and lacks, or None (LiteLLM's own resolution)."""
    import litellm

    from tracejudge.metrics.judge_check import judge_endpoint

    endpoint = judge_endpoint(model)
    if endpoint.key_missing:
        if endpoint.provider != "openai":
            return f"{{endpoint.key_variable}} is not set: the judge {{model}} ({{endpoint.provider}}) needs its key"
        return (
            f"{{endpoint.key_variable}} is not set: the judge {{model}} needs it (for a local OpenAI-compatible server "
            "any value, with OPENAI_BASE_URL pointing at the server)"
        )
    bare = endpoint.litellm_model.partition("/")[2]
    known = (litellm.model_cost.get(bare) or {{}}).get("litellm_provider") == "openai"
    served = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
    if endpoint.provider == "openai" and not known and not served:
        return (
            f"OPENAI_BASE_URL is not set: the judge {{model}} is no OpenAI model; point OPENAI_BASE_URL at the "
            "OpenAI-compatible server that serves it (e.g. http://127.0.0.1:11434/v1)"
        )
    return None


PROBLEM = next(filter(None, map(missing_variable, sorted({{judge_model(r) for _, r in PARAMS}}))), None)


def pytest_generate_tests(metafunc) -> None:
    """pytest's hook (in the module: no import of pytest needed to run the file with python alone)."""
    if "recorded" in metafunc.fixturenames:
        metafunc.parametrize(("case", "recorded"), PARAMS, ids=IDS)


def _agent():
    module, _, name = (REPLAY_AGENT or "").partition(":")
    return getattr(importlib.import_module(module), name)


def _replayed(case: ConversationalEvalTestCase) -> ConversationalEvalTestCase:
    agent, history = _agent(), []
    for turn in case.turns:
        answer = agent(list(history), turn.input)
        if inspect.isawaitable(answer):
            answer = asyncio.run(answer)
        history.append(EvalTestCase(input=turn.input, actual_output=str(answer)))
    return ConversationalEvalTestCase(name=case.name, turns=history)


def test_conversation(case: ConversationalEvalTestCase, recorded: dict) -> None:
    if PROBLEM is not None:  # these tests fail with one line; a team's other tests in the same run still run
        import pytest

        pytest.fail(f"{{Path(__file__).name}}: {{PROBLEM}}", pytrace=False)
    judge = JUDGES[recorded["metric"]](judge_model(recorded))
    conversation = _replayed(case) if REPLAY_AGENT else ConversationalEvalTestCase(name=case.name, turns=case.turns)
    result = asyncio.run(evaluate_conversations([conversation], [judge]))[0].metrics[0]
    assert result.error is None, f"no verdict for {{case.name}}: {{result.error}}"
    rubric = ""
    if result.rubric_version != recorded["rubric_version"]:
        rubric = f" (rubric {{result.rubric_version}}, recorded under {{recorded['rubric_version']}})"
    if REPLAY_AGENT:
        assert result.verdict != recorded["verdict"], (
            f"{{case.name}} (trace {{case.trace_id}}) is still judged {{result.verdict}}{{rubric}}: {{result.reason}}"
        )
    else:
        assert result.verdict == recorded["verdict"], (
            f"{{case.name}} (trace {{case.trace_id}}) was judged {{recorded['verdict']}} in production, now "
            f"{{result.verdict}}{{rubric}}: {{result.reason}}"
        )


def main() -> int:
    """`python FILE`: every test, one line each; exit 0 all passed, 1 one failed, 2 the judge lacks a variable."""
    if PROBLEM is not None:
        print(f"{{Path(__file__).name}}: {{PROBLEM}}", file=sys.stderr)
        return 2
    failed = 0
    for (case, recorded), name in zip(PARAMS, IDS, strict=True):
        try:
            test_conversation(case, recorded)
        except AssertionError as exc:
            failed += 1
            print(f"FAILED {{name}}: {{exc}}")
        else:
            print(f"passed {{name}}")
    print(f"{{len(PARAMS) - failed}} passed, {{failed}} failed" if failed else f"{{len(PARAMS)}} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def regression_suite(dataset: Path, test_file: Path, export: Export, what: str, judge_files: Sequence[str] = ()) -> str:
    """ExportError where an exported result's judge is a rubric file's and no --judge-file gives it."""
    models = sorted({str(r.get("model")) for line in export.lines for r in line["results"]})
    rubrics = _rubrics_of(export, judge_files)
    return REGRESSION_SUITE.format(
        rubrics=repr(rubrics),
        when=datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC"),
        count=f"{len(export.lines)} conversation{'' if len(export.lines) == 1 else 's'}",
        what=what,
        models=", ".join(models) or "none",
        name=test_file.name,
        dataset=json.dumps(relpath(dataset.resolve(), test_file.resolve().parent)),
    )


def _rubrics_of(export: Export, judge_files: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The rubric of each exported judge that is not a built-in, from --judge-file (the file as it is now)."""
    from tracejudge.metrics.judges import BUILTIN_JUDGES, file_judges

    wanted = sorted({str(r.get("metric")) for line in export.lines for r in line["results"]} - set(BUILTIN_JUDGES))
    if not wanted:
        return {}
    files = file_judges(list(judge_files))
    missing = [name for name in wanted if name not in files]
    if missing:
        raise ExportError(
            f"--pytest: the exported results of {', '.join(missing)} are re-judged with their rubric: pass its file "
            "with --judge-file PATH; nothing written"
        )
    return {name: files[name].rubric.model_dump(mode="json") for name in wanted}


def _absent(records: Sequence[dict[str, Any]], selection: Selection) -> list[str]:
    """A line for each --metric and --mode no record on the topic has (a typo, or nothing judged yet)."""
    problems = []
    judges = sorted({str(r.get("metric")) for r in records if r.get("metric")})
    for metric in selection.metrics or ():
        if metric not in judges:
            problems.append(
                f"--metric {metric}: no result of that judge on the topic (judges there: {', '.join(judges) or 'none'})"
            )
    modes = sorted({str(r.get("failure_mode")) for r in records if r.get("failure_mode")})
    for mode in sorted(selection.modes or ()):
        if mode not in modes:
            problems.append(
                f"--mode {mode}: no verdict about that mode on the topic (modes there: {', '.join(modes) or 'none'})"
            )
    return problems


def _usage(message: str) -> int:
    print(f"tracejudge export: {message}", file=sys.stderr)
    return EXIT_USAGE


def selection_from(namespace: argparse.Namespace, labels: dict[str, tuple[str, ...]] | None = None) -> Selection:
    """ExportError for a bad selection. `labels`: each known judge's (default the built-ins')."""
    from .backfill import parse_time

    verdicts = None
    if namespace.verdict:
        verdicts = {v.strip() for item in namespace.verdict for v in item.split(",") if v.strip()}
        unknown, known = unknown_verdicts(verdicts, namespace.metric, LABELS if labels is None else labels)
        if unknown:
            raise ExportError(
                f"--verdict: unknown {', '.join(unknown)}; known: {', '.join(sorted(known))} (a rubric file's judge: "
                "name it with --metric NAME)"
            )
    modes = None
    if getattr(namespace, "mode", None):
        modes = {m.strip() for item in namespace.mode for m in item.split(",") if m.strip()}
    try:
        start = parse_time(namespace.start) if namespace.start else None
        end = parse_time(namespace.end) if namespace.end else None
    except ValueError as exc:
        raise ExportError(f"invalid time: {exc}") from None
    if start is not None and end is not None and start >= end:
        raise ExportError(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    if namespace.limit is not None and namespace.limit < 1:
        raise ExportError(f"--limit must be at least 1, got {namespace.limit}")
    return Selection(
        verdicts, namespace.metric, namespace.agent, start, end, namespace.limit, namespace.include_shadow, modes
    )


def run_export(namespace: argparse.Namespace) -> int:
    """0 (also when nothing matched: said); 2 for a usage error or matching results without a transcript (nothing
    to export: said, nothing written); 69 when Kafka does not answer; 130 on Ctrl-C."""
    from .._logging import configure_logging
    from .compare import NO_RESULTS_TOPIC, results_or_exit
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    try:
        selection = selection_from(namespace, labels_with(settings.judge_files))
    except ExportError as exc:
        return _usage(str(exc))
    if not settings.results_topic_name():
        return _usage(NO_RESULTS_TOPIC)
    output = Path(namespace.output)
    test_file = Path(namespace.pytest) if namespace.pytest else None
    for path, flag in ((output, "--output"), (test_file, "--pytest")):
        if path is not None and not path.resolve().parent.is_dir():
            return _usage(f"{flag}: directory {path.resolve().parent} does not exist")
    configure_logging(settings.log_level, settings.log_format)
    records = results_or_exit(settings, "export")
    if isinstance(records, int):
        return records
    export = select(records, selection)
    for problem in _absent(records, selection):  # a misspelt judge or mode exports nothing: say what is there
        print(f"tracejudge export: {problem}", file=sys.stderr)
    if test_file is not None:
        try:
            _rubrics_of(export, settings.judge_files)  # before anything is written
        except ExportError as exc:
            return _usage(str(exc))
    if not export.lines and export.without_transcript:  # an empty file would look like "nothing matched"
        return _usage(
            f"{export.without_transcript} matching results carry no transcript, so there is nothing to export: run "
            "`tracejudge consume` with --results-transcript (TRACEJUDGE_RESULTS_TRANSCRIPT=true) to keep the turns "
            "as judged with each result (conversations judged from then on can be exported); nothing written"
        )
    try:
        with output.open("w", encoding="utf-8") as out:
            for line in export.lines:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        if test_file is not None:
            what = ", ".join(sorted(selection.verdicts)) if selection.verdicts else "every verdict"
            if selection.modes:
                what += f" about {', '.join(sorted(selection.modes))}"
            test_file.write_text(
                regression_suite(output, test_file, export, what, settings.judge_files), encoding="utf-8"
            )
    except OSError as exc:
        return _usage(f"cannot write: {exc.strerror or exc}")
    except ExportError as exc:  # checked above; kept so a rubric file edited meanwhile still says one line
        return _usage(str(exc))
    print(
        f"tracejudge export: {len(export.lines)} conversations written to {output} ({export.matched} matching results "
        f"of {export.records} records read)" + (f"; regression suite {test_file}" if test_file else "")
    )
    if export.without_transcript:
        print(
            f"tracejudge export: {export.without_transcript} matching results carry no transcript and were left out: "
            "run the consumer with --results-transcript (TRACEJUDGE_RESULTS_TRANSCRIPT=true) to keep the turns as "
            "judged with each result",
            file=sys.stderr,
        )
    return EXIT_OK
