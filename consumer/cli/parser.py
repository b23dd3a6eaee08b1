"""`tracejudge` commands: consume, demo, backfill, calibrate, compare, explain, export, watch, modes, broker; a module
each.

Invalid configuration: one clear line and exit code 2, before any I/O. What stops a start that the user can fix (a
metrics port in use: 2; Kafka not answering within `bootstrap_timeout_ms`: 69) is one line too, never a traceback.
Each command's module adds its own arguments; the consumer flags it takes come from `options.py` (Settings).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import textwrap
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from . import backfill, broker, calibrate, compare, demo, explain, export, modes, rejudge, watch
from .consume import calibration_refused, run_consume
from .options import EXIT_USAGE, add_consumer_flags, settings_from_args


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Lines broken at spaces only: a default such as `kafka-python` or a flag stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def run_demo(namespace: argparse.Namespace) -> int:
    # TRACEJUDGE_CALIBRATION applies to the demo too: refuse a bad report before the broker starts.
    if calibration_refused(settings_from_args(namespace).calibration):
        return EXIT_USAGE
    return demo.run_demo(namespace)


CONSUME_EXAMPLE = """\
example, a local OpenAI-compatible judge (Ollama) and a local Kafka:
  OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=placeholder \\
    tracejudge consume --bootstrap-servers 127.0.0.1:9092 --judge-model llama3.2 --start-from earliest

Every flag is also an environment variable (flag > variable > default): docs/configuration.md."""


def tracejudge_version() -> str:
    try:
        return f"tracejudge {version('tracejudge')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "tracejudge (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracejudge", description="Judge live LLM-agent conversations from Kafka.")
    parser.add_argument("--version", action="version", version=tracejudge_version())
    commands = parser.add_subparsers(dest="command", required=True)
    consume = commands.add_parser(
        "consume",
        help="assemble, sample and judge conversations from a Kafka topic",
        description="Assemble conversations from the span topic, sample them, judge them and export the verdicts, "
        "until SIGTERM or SIGINT.",
        usage="%(prog)s [OPTION ...]",
        epilog=CONSUME_EXAMPLE,
        formatter_class=_HelpFormatter,
    )
    consume.add_argument("--version", action="version", version=tracejudge_version())
    add_consumer_flags(consume)
    consume.set_defaults(handler=run_consume)
    demo_parser = commands.add_parser("demo", help="the whole pipeline on an embedded broker with a scripted agent")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=run_demo)
    backfill_parser = commands.add_parser("backfill", help="judge a past time range of the span topic")
    backfill.add_arguments(backfill_parser)
    backfill_parser.set_defaults(handler=backfill.run_backfill)
    calibrate_parser = commands.add_parser("calibrate", help="measure a judge model against a labelled gold set")
    calibrate.add_arguments(calibrate_parser)
    add_consumer_flags(calibrate_parser, only=calibrate.CALIBRATE_OPTIONS)
    calibrate_parser.set_defaults(handler=calibrate.run_calibrate)
    compare_parser = commands.add_parser(
        "compare", help="compare two judges' verdicts (primary and shadow) from the results topic"
    )
    compare.add_arguments(compare_parser)
    add_consumer_flags(compare_parser, only=compare.COMPARE_OPTIONS)
    compare_parser.set_defaults(handler=compare.run_compare)
    explain_parser = commands.add_parser(
        "explain", help="one conversation's story from Kafka: its turns, completion, sampling and judgements"
    )
    explain.add_arguments(explain_parser)
    add_consumer_flags(explain_parser, only=explain.EXPLAIN_OPTIONS)
    explain_parser.set_defaults(handler=explain.run_explain)
    export_parser = commands.add_parser(
        "export", help="the conversations behind chosen verdicts, as a dataset and a regression suite"
    )
    export.add_arguments(export_parser)
    add_consumer_flags(export_parser, only=export.EXPORT_OPTIONS)
    export_parser.set_defaults(handler=export.run_export)
    watch_parser = commands.add_parser(
        "watch", help="the verdicts as they reach the results topic: the latest with reasons, counts (--once: print)"
    )
    watch.add_arguments(watch_parser)
    add_consumer_flags(watch_parser, only=watch.WATCH_OPTIONS)
    watch_parser.set_defaults(handler=watch.run_watch)
    rejudge_parser = commands.add_parser(
        "rejudge", help="judge again, once, each conversation whose final outcome was failed (after a fix)"
    )
    rejudge.add_arguments(rejudge_parser)
    add_consumer_flags(rejudge_parser, only=rejudge.REJUDGE_OPTIONS)
    rejudge_parser.set_defaults(handler=rejudge.run_rejudge)
    modes_parser = commands.add_parser(
        "modes", help="propose: name failure modes from failing verdicts' reasons (a taxonomy file and a report)"
    )
    modes.add_arguments(modes_parser)
    add_consumer_flags(modes_parser, only=modes.MODES_OPTIONS)
    modes_parser.set_defaults(handler=modes.run_propose)
    # `tracejudge broker`: a local Kafka in one command for the quickstart.
    broker_parser = commands.add_parser("broker", help="a local Kafka (the embedded Tansu) on 127.0.0.1 until Ctrl-C")
    broker.add_arguments(broker_parser)
    broker_parser.set_defaults(handler=broker.run_broker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The command's own process, so LiteLLM's switches may be defaulted here (never in the library): the bundled
    # cost map and Anthropic beta headers instead of a blocking fetch at import or on the first Claude call.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    _refuse_unknown_command(parser, args)
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command in _subparsers(parser):  # before argparse's own checks (a missing required flag would hide a typo)
        _refuse_unknown_flags(parser, command, [arg for arg in args if arg.startswith("--") and arg != "--"])
    namespace, unknown = parser.parse_known_args(args)
    if unknown:
        _refuse_unknown_flags(parser, namespace.command, unknown, exhaustive=True)
    return int(namespace.handler(namespace))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _refuse_unknown_command(parser: argparse.ArgumentParser, args: list[str]) -> None:
    """`tracejudge consme`: the usage error names the closest command."""
    commands = _subparsers(parser)
    first = next((arg for arg in args if not arg.startswith("-")), None)
    if first is None or first in commands or args[0].startswith("-"):
        return
    close = difflib.get_close_matches(first, list(commands), n=1)
    if close:
        parser.error(f"unknown command {first!r}: did you mean {close[0]!r}?")


def _refuse_unknown_flags(
    parser: argparse.ArgumentParser, command: str, given: list[str], *, exhaustive: bool = False
) -> None:
    """A flag `command` does not take (nor abbreviates) is a usage error of that command (exit 2) naming the closest
    flag it takes; with `exhaustive`, `given` are argparse's leftovers and any of them is an error."""
    command_parser = _subparsers(parser).get(command, parser)
    flags = [flag for flag in command_parser._option_string_actions if flag.startswith("--")]
    for arg in given:
        if not arg.startswith("-"):
            continue
        flag = arg.split("=", 1)[0]
        if not exhaustive and any(known.startswith(flag) for known in flags):  # argparse takes abbreviations
            continue
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
        hint = f": did you mean {close[0]}?" if close else f" (see tracejudge {command} --help)"
        command_parser.error(f"unrecognized argument {flag}{hint}")
    if exhaustive:
        command_parser.error(f"unrecognized arguments: {' '.join(given)}")
