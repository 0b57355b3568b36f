"""What the ``ember`` subcommands share: running a handler, ember errors as one line, output paths.

``ember.cli`` is the ``ember`` command itself; the subcommand families (``ember.track.cli``,
``ember.checkpoint.cli``, ``ember.server.cli``) sit below it and use this module, never it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ember.errors import EmberError

AddCommands = Callable[[argparse._SubParsersAction], None]
"""A family's ``add_commands(subparsers)``: it registers the family's commands on the ``ember``
command's subparsers (what ``parser.add_subparsers()`` returned), and each command sets
``handler``, a function of the parsed arguments that returns the exit code. ``ember.cli`` calls
it with its own subparsers; :func:`run_commands` runs a family on its own.

Example:
    >>> run_commands(ember.track.cli.add_commands, ["runs", "ls"])
"""


def run_commands(add_commands: AddCommands, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with the commands ``add_commands`` registers and run the chosen handler.

    Returns the handler's exit code, or 2 after printing ``ember: error: ...`` for an EmberError.
    """
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return run_handler(args)


def run_handler(args: argparse.Namespace) -> int:
    """Call ``args.handler(args)``: its exit code, or 2 after printing ``ember: error: ...`` for an EmberError."""
    try:
        return int(args.handler(args) or 0)
    except EmberError as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 2


def output_file(path: str, what: str, error: type[EmberError]) -> Path:
    """``path`` as a file a command may write (create or replace), or ``error`` saying why not.

    A directory, or a parent folder that is missing or not a folder, is refused: commands never
    create folders the user did not ask for.

    Example:
        >>> output_file("out/model.pt", "checkpoint export OUT", CheckpointError)
    """
    out = Path(path)
    if out.is_dir():
        raise error(f"{what} {path!r} is a directory: give a file name in it, e.g. {str(out / 'model.pt')!r}")
    parent = out.parent
    if not parent.is_dir():
        state = "is not a folder" if parent.exists() else "does not exist"
        raise error(f"{what} {path!r}: its folder {str(parent)!r} {state}; create it first or choose another path")
    return out
