"""`python -m tracejudge.consumer` is `tracejudge` (default subcommand: consume)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    arguments = sys.argv[1:]
    if not arguments or arguments[0].startswith("-"):
        arguments = ["consume", *arguments]
    sys.exit(main(arguments))
