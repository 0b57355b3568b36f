"""What every ember subcommand family shares: run its commands and turn ember errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ember.errors import EmberError


def run_commands(add_commands: Callable[[argparse._SubParsersAction], None], argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with the commands ``add_commands`` registers and run the chosen handler.

    Returns the handler's exit code, or 2 after printing ``ember: error: ...`` for an EmberError.
    """
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except EmberError as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 2
