"""`tracejudge modes propose`: a failure-mode taxonomy named from the judges' own reasons on the results topic.

The failing verdicts' reasons and evidence are the best summary of what went wrong that tracejudge holds; this reads
a sample of them (no group, no commit: as `export` does), asks the judge model to name at most `--max` modes, sorts
the sample into them and writes a taxonomy file that `consume --failure-modes` loads as it is, plus a report (count,
share and three conversations to read per mode). Every call goes through the judging backend and retry policy; the
estimated cost is shown first and, above `--max-cost`, nothing is spent without `--yes`. `--merge FILE` keeps a
team's names (dashboards stay comparable) and adds modes only for what lands in `other`.
Exit 0 written (or a dry run); 1 no failing verdict matched; 2 a usage error; 3 the judge model failed; 69 Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .compare import COMPARE_OPTIONS, EXIT_INTERRUPTED

if TYPE_CHECKING:
    from tracejudge.metrics.modes import Item

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_JUDGE = 0, 1, 2, 3
MODES_OPTIONS = COMPARE_OPTIONS | {"judge_model", "judge_timeout", "judge_retries"}
SMALL_SAMPLE = 30  # fewer failing verdicts than this: the modes are a guess, and said so


class ModesError(ValueError):
    """A usage error: one line on stderr, exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One action today; a positional (not nested subcommands) so the unknown-flag check sees this command's flags.
    propose = parser
    propose.add_argument(
        "action", choices=["propose"], help="propose: name modes from failing verdicts, write a taxonomy and a report"
    )
    propose.add_argument("--metric", default="failure_rate", help="the judge whose verdicts (default failure_rate)")
    propose.add_argument(
        "--verdict",
        action="append",
        default=None,
        metavar="LABEL[,LABEL]",
        help="the verdicts read (default the judge's failing verdicts, e.g. hallucination)",
    )
    propose.add_argument("--agent", default=None, help="only this agent's conversations (default all)")
    propose.add_argument(
        "--from",
        dest="start",
        default=None,
        metavar="TIME",
        help="judged at or after (ISO 8601 or Unix seconds; default no bound)",
    )
    propose.add_argument(
        "--to", dest="end", default=None, metavar="TIME", help="judged before: as --from (default no bound)"
    )
    propose.add_argument("--limit", type=int, default=200, help="the latest N failing verdicts read (default 200)")
    propose.add_argument("--max", dest="max_modes", type=int, default=8, help="at most N modes proposed (default 8)")
    propose.add_argument(
        "--output",
        default=None,
        metavar="PATH",
        help="the taxonomy file written, for consume --failure-modes (default none: the report only)",
    )
    propose.add_argument("--report", default=None, metavar="PATH", help="the report written (default printed)")
    propose.add_argument(
        "--merge",
        default=None,
        metavar="FILE",
        help="keep this taxonomy file's names, add modes only where other grew (default none)",
    )
    propose.add_argument(
        "--max-cost",
        type=float,
        default=1.0,
        metavar="USD",
        help="above this estimated cost: a dry run unless --yes (default 1.0)",
    )
    propose.add_argument("--yes", action="store_true", help="spend even above --max-cost (default off)")
    propose.add_argument("--dry-run", action="store_true", help="show the estimate and spend nothing (default off)")


def _item_text(record: dict[str, Any]) -> str:
    from tracejudge.metrics.modes import ITEM_CHARS

    evidence = record.get("evidence") or []
    quoted = "; ".join(str(e) for e in evidence) if isinstance(evidence, list) else str(evidence)
    text = " ".join(f"reason: {record.get('reason') or ''} evidence: {quoted}".split())
    return text[:ITEM_CHARS]


def sample_of(records: Sequence[dict[str, Any]], selection: Any, limit: int) -> list[Item]:
    """The latest `limit` distinct matching verdicts (a result id read twice counts once, its newest copy)."""
    from tracejudge.metrics.modes import Item

    from .export import _judged_at, _matches

    newest: dict[str, dict[str, Any]] = {}
    for record in records:
        if _matches(record, selection):
            key = str(record.get("result_id") or id(record))
            newest.pop(key, None)
            newest[key] = record
    chosen = sorted(newest.values(), key=lambda r: (_judged_at(r) is None, _judged_at(r) or 0), reverse=False)
    chosen = chosen[-limit:]
    return [Item(str(r.get("conversation_id") or ""), _item_text(r)) for r in chosen]


def report_text(metric: str, items: Sequence[Item], modes: Sequence[tuple[str, str]], assigned: Sequence[str]) -> str:
    from tracejudge.metrics.modes import OTHER_MODE

    counts = Counter(assigned)
    total = len(items)
    lines = [f"{metric}: {total} failing verdicts sorted into {len(modes)} modes (+ other)", ""]
    for name, description in [*modes, (OTHER_MODE, "none of the above")]:
        ids = [items[i].conversation_id for i, mode in enumerate(assigned) if mode == name][:3]
        share = counts[name] / total if total else 0.0
        lines.append(f"{name:<28} {counts[name]:>5} {share:>6.1%}  {description}")
        lines.append(f"{'':<28} read: {', '.join(ids) if ids else '-'}")
    lines.append(f"{'total':<28} {sum(counts.values()):>5} {1 if total else 0:>6.1%}")
    return "\n".join(lines) + "\n"


def taxonomy_yaml(metric: str, modes: Sequence[tuple[str, str]], merged: dict[str, list[dict[str, Any]]]) -> str:
    import yaml

    kept = {str(entry["name"]): entry for entry in merged.get(metric, [])}  # a kept mode keeps its alert_share
    entries = [kept.get(name, {"name": name, "description": description}) for name, description in modes]
    data = {**merged, metric: entries}
    header = "# tracejudge modes propose: load with `tracejudge consume --failure-modes FILE`\n"
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def _usage(message: str) -> int:
    print(f"tracejudge modes propose: {message}", file=sys.stderr)
    return EXIT_USAGE


def _checked(namespace: argparse.Namespace, settings: Any) -> tuple[Any, list[tuple[str, str]], dict[str, Any]]:
    """The selection, the kept modes and the merged file's entries; ModesError for what a user got wrong."""
    from tracejudge.metrics.judges import judge_classes
    from tracejudge.metrics.rubric import MAX_FAILURE_MODES, RubricError, failure_mode_lists

    from ..judging.gold import labels_with
    from .export import ExportError, Selection, selection_from

    judges = judge_classes(settings.judge_files)
    if namespace.metric not in judges:
        raise ModesError(f"--metric: unknown judge {namespace.metric!r}; known: {', '.join(judges)}")
    failing = tuple(getattr(judges[namespace.metric], "failing_verdicts", ()))
    if not namespace.verdict and not failing:
        raise ModesError(f"--metric {namespace.metric}: the judge has no failing verdicts; name them with --verdict")
    if not 1 <= namespace.max_modes <= MAX_FAILURE_MODES:
        raise ModesError(f"--max must be 1..{MAX_FAILURE_MODES}, got {namespace.max_modes}")
    if namespace.max_cost < 0:
        raise ModesError(f"--max-cost must not be negative, got {namespace.max_cost:g}")
    for path, flag in ((namespace.output, "--output"), (namespace.report, "--report")):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise ModesError(f"{flag}: directory {Path(path).resolve().parent} does not exist")
    view = argparse.Namespace(
        verdict=namespace.verdict or [",".join(failing)],
        metric=[namespace.metric],
        agent=namespace.agent,
        start=namespace.start,
        end=namespace.end,
        limit=namespace.limit,
        include_shadow=False,
    )
    try:
        chosen = selection_from(view, labels_with(settings.judge_files))
    except ExportError as exc:
        raise ModesError(str(exc)) from None
    selection = Selection(chosen.verdicts, chosen.metrics, chosen.agent, chosen.start, chosen.end)
    keep: list[tuple[str, str]] = []
    merged: dict[str, Any] = {}
    if namespace.merge:
        try:
            lists = failure_mode_lists(namespace.merge, judges)
        except RubricError as exc:
            raise ModesError(f"--merge: {exc}") from None
        for judge, modes in lists.items():
            merged[judge] = [mode.model_dump(exclude_none=True) for mode in modes]
        keep = [(mode.name, mode.description) for mode in lists.get(namespace.metric, ())]
    return selection, keep, merged


def run_propose(namespace: argparse.Namespace) -> int:
    from tracejudge.metrics.modes import JudgeFailed, ModesJudge, estimate, price, run_rounds

    from .._logging import configure_logging
    from .compare import results_or_exit
    from .options import settings_from_args

    settings = settings_from_args(namespace)
    try:
        selection, keep, merged = _checked(namespace, settings)
    except ModesError as exc:
        return _usage(str(exc))
    configure_logging(settings.log_level, settings.log_format)
    records = results_or_exit(settings, "modes propose")
    if isinstance(records, int):
        return records
    items = sample_of(records, selection, namespace.limit)
    what = f"{namespace.metric} {'/'.join(sorted(selection.verdicts or ()))}"
    if not items:
        print(
            f"tracejudge modes propose: no {what} verdicts on the results topic match; nothing to name", file=sys.stderr
        )
        return EXIT_NOTHING
    if len(items) < SMALL_SAMPLE:
        print(
            f"tracejudge modes propose: only {len(items)} failing verdicts: the modes are a guess; read them",
            file=sys.stderr,
        )
    input_tokens, output_tokens = estimate(settings.judge_model, items, namespace.max_modes, keep)
    cost = price(settings.judge_model, input_tokens, output_tokens)
    priced = f"about ${cost:.4f}" if cost is not None else "price unknown (not in LiteLLM's price map)"
    print(
        f"tracejudge modes propose: {len(items)} {what} verdicts; estimated judge cost with {settings.judge_model}: "
        f"{priced} ({input_tokens} input + {output_tokens} output tokens at most)"
    )
    if namespace.dry_run or (cost is not None and cost > namespace.max_cost and not namespace.yes):
        why = "--dry-run" if namespace.dry_run else f"above --max-cost ${namespace.max_cost:g}; --yes to spend it"
        print(f"tracejudge modes propose: dry run ({why}): nothing spent, nothing written")
        return EXIT_OK
    judge = ModesJudge(settings.judge_model, retries=settings.judge_retries, timeout=settings.judge_timeout)
    try:
        modes, assigned, notes = asyncio.run(run_rounds(judge, items, namespace.max_modes, keep))
    except JudgeFailed as exc:
        print(f"tracejudge modes propose: {exc}; nothing written", file=sys.stderr)
        return EXIT_JUDGE
    except KeyboardInterrupt:
        print("tracejudge modes propose: interrupted (Ctrl-C): nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    report = report_text(namespace.metric, items, modes, assigned)
    try:
        if namespace.output:
            Path(namespace.output).write_text(taxonomy_yaml(namespace.metric, modes, merged), encoding="utf-8")
        if namespace.report:
            Path(namespace.report).write_text(report, encoding="utf-8")
    except OSError as exc:
        return _usage(f"cannot write: {exc.strerror or exc}")
    if not namespace.report:
        print(report, end="")
    for note in notes:
        print(f"tracejudge modes propose: {note}")
    spent = f"${judge.cost_usd:.4f}" if judge.priced else "unpriced"
    written = f"; taxonomy {namespace.output}" if namespace.output else " (no --output: nothing written)"
    print(f"tracejudge modes propose: {judge.calls} judge calls, {spent}{written}")
    return EXIT_OK
