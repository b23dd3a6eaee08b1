"""The consumer's settings as command-line flags, shared by every subcommand, and docs/configuration.md's table.

Settings (consumer/settings.py) is the one definition of an option: its flag, environment variable, default, help
and docs link. The flags, their --help and the table are made from it here, so none can drift; flag names,
variables and defaults are contracts. `python -m tracejudge.consumer.cli.options --markdown` prints the table,
`--write docs/configuration.md` (`make options-table`) puts it in the page, tests/docs checks the page has it.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .._errors import EXIT_USAGE
from ..settings import GROUPS, UNGROUPED, Settings

EXIT_JUDGE_UNAVAILABLE = 3  # the startup judge check got no answer (auth, unknown model, server down)
# docs/configuration.md's table sits between these two lines.
TABLE_START = "<!-- options table: generated from consumer/settings.py by `make options-table`; do not edit -->"
TABLE_END = "<!-- end of options table -->"


@dataclass(frozen=True, slots=True)
class Option:
    """One Settings field as a flag."""

    field: str
    flag: str
    env: str
    default: Any
    description: str
    metavar: str | None  # a Literal's choices (`a|b`) unless the field names one
    repeatable: bool  # given once per value (argparse `append`)
    boolean: bool  # `--x` / `--no-x`; a flag that already says no (`--no-results`) is a switch alone
    see: str | None  # a docs page (relative to docs/) the table links to
    group: str | None  # its section of --help and of the table (settings.GROUPS); None: not declared yet


def _option(name: str) -> Option:
    field = Settings.model_fields[name]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    metavar = extra.get("metavar")
    if metavar is None and typing.get_origin(field.annotation) is typing.Literal:
        metavar = "|".join(str(choice) for choice in typing.get_args(field.annotation))
    return Option(
        field=name,
        flag=str(extra.get("flag") or "--" + name.replace("_", "-")),
        env=str(field.validation_alias),
        default=field.default,
        description=str(field.description),
        metavar=None if metavar is None else str(metavar),
        repeatable=bool(extra.get("repeatable")),
        boolean=field.annotation is bool,
        see=None if extra.get("see") is None else str(extra["see"]),
        group=None if extra.get("group") is None else str(extra["group"]),
    )


# Every consumer option, in Settings' order (the order within each --help section).
OPTIONS: tuple[Option, ...] = tuple(_option(name) for name in Settings.model_fields)
BY_FIELD: dict[str, Option] = {option.field: option for option in OPTIONS}


def section(option: Option) -> str:
    """The --help section (and docs table) an option is listed under; a field without a known group: UNGROUPED."""
    return option.group if option.group in GROUPS else UNGROUPED


def by_section(options: Sequence[Option] = OPTIONS) -> list[tuple[str, list[Option]]]:
    """The options by section, in GROUPS' order (UNGROUPED last), each in Settings' order; empty sections left out."""
    order = [*GROUPS, UNGROUPED]
    return [
        (name, [o for o in options if section(o) == name]) for name in order if any(section(o) == name for o in options)
    ]


# The canary and the shadow judge watch a running consumer's judge: nothing to do in backfill or the demo.
WATCH_OPTIONS = (
    "canary_interval",
    "canary_dataset",
    "canary_accuracy_floor",
    "canary_margin",
    "shadow_judge_model",
    "shadow_sample_rate",
    "shadow_budget_share",
)

# Notifications per verdict are the live consumer's: a backfill never notifies.
NOTIFY_OPTIONS = (
    "notify_url",
    "notify_on",
    "notify_format",
    "notify_secret",
    "trace_url_template",
    "notify_rate_limit",
    "notify_retry_for",
)


def shown_default(value: Any) -> str:
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def field_help(name: str, default: str | None = None) -> str:
    """`description (env TRACEJUDGE_X, default Y)` of a Settings field; `default` replaces Y where a command differs."""
    option = BY_FIELD[name]
    shown = shown_default(option.default) if default is None else default
    return f"{option.description} (env {option.env}, default {shown})".replace("%", "%%")


def add_consumer_flags(
    parser: argparse.ArgumentParser,
    *,
    skip: Collection[str] = (),
    only: Collection[str] | None = None,
    defaults: Mapping[str, str] | None = None,
) -> None:
    """Add the flags of every field in `only` (default all) not in `skip`; `defaults` are the defaults this command
    shows instead."""
    chosen = [o for o in OPTIONS if o.field not in skip and (only is None or o.field in only)]
    for title, options in by_section(chosen):
        group = parser.add_argument_group(title)
        for option in options:
            _add_flag(group, option, defaults)


def _add_flag(group: argparse._ArgumentGroup, option: Option, defaults: Mapping[str, str] | None) -> None:
    extra: dict[str, Any] = {}
    if option.metavar is not None:
        extra["metavar"] = option.metavar
    if option.repeatable:
        extra["action"] = "append"
    elif option.boolean and option.flag.startswith("--no-"):  # `--no-results`, never `--no-no-results`
        extra["action"] = "store_true"
    elif option.boolean:
        extra["action"] = argparse.BooleanOptionalAction
    help_text = field_help(option.field, (defaults or {}).get(option.field))
    group.add_argument(option.flag, dest=option.field, default=argparse.SUPPRESS, help=help_text, **extra)


def settings_from_args(namespace: argparse.Namespace, *, skip: Sequence[str] = ()) -> Settings:
    """Explicit flags over TRACEJUDGE_* variables over defaults; raises SystemExit(2) with one line if invalid."""
    given = {k: v for k, v in vars(namespace).items() if k in BY_FIELD and k not in skip}
    try:
        return Settings.from_options(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        alias = ".".join(str(part) for part in error.get("loc", ()))
        field = next((o.field for o in OPTIONS if o.env == alias), alias)
        where = f"{BY_FIELD[field].flag} / {alias}" if field in BY_FIELD else alias or "configuration"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        print(f"tracejudge: invalid configuration: {where}: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """docs/configuration.md's tables of every option, one per --help section: flag, environment variable, default,
    what it does."""
    parts = []
    for title, options in by_section():
        lines = [f"### {title}", "", "| flag | environment variable | default | what it does |", "|---|---|---|---|"]
        for option in options:
            value = f" {option.metavar}" if option.metavar else ""
            flag = f"`{option.flag}{value}`"
            if option.boolean and not option.flag.startswith("--no-"):
                flag += f" / `--no-{option.flag.removeprefix('--')}`"
            default = shown_default(option.default)
            default = default if default in ("none", "on", "off") else f"`{default}`"
            what = option.description + (f" ([more]({option.see}))" if option.see else "")
            lines.append(f"| {_cell(flag)} | `{option.env}` | {_cell(default)} | {_cell(what)} |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def with_table(page: str) -> str:
    """`page` with the text between TABLE_START and TABLE_END replaced by the current table."""
    head, start, rest = page.partition(TABLE_START + "\n")
    _old, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"the page has no {TABLE_START!r} … {TABLE_END!r} block")
    return head + start + markdown_table() + end + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tracejudge.consumer.cli.options", description="The consumer options as a markdown table."
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the table")
    group.add_argument("--write", metavar="PAGE.md", help="replace the table in PAGE.md (docs/configuration.md)")
    namespace = parser.parse_args(argv)
    if namespace.markdown:
        sys.stdout.write(markdown_table())
        return 0
    page = Path(namespace.write)
    try:
        page.write_text(with_table(page.read_text(encoding="utf-8")), encoding="utf-8")
    except (OSError, ValueError) as exc:
        print(f"options: {page}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
