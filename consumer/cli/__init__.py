"""The `tracejudge` commands: one module per command, the flags shared by all of them in `options.py`.

The commands sit above the service (`app.py`, `service.py`): nothing else in `tracejudge.consumer` imports this
package (an import-linter contract). `main` imports the parser when called, so `python -m
tracejudge.consumer.cli.options` (the flag table) runs without loading the commands.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The `tracejudge` entry point (`tracejudge.consumer.cli:main`)."""
    from .parser import main as run

    return run(argv)
