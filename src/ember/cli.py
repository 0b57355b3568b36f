"""The ``ember`` command line: ``ember run``, ``ember runs ...``, ``ember checkpoint ...``.

Subcommands import what they need when they run, so ``ember --help`` answers quickly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Subcommand families live next to the code they drive. Each module's add_commands() registers
# its commands; it is imported only when one of them runs, so `ember --help` needs no torch.
_FAMILIES: dict[str, tuple[str, str]] = {
    "runs": ("ember.track.cli", "list, show, compare, export and remove tracked runs"),
    "checkpoint": ("ember.checkpoint.cli", "inspect a checkpoint, or export its model weights"),
    "server": ("ember.server.cli", "run the tracking server, or administer it"),
    "login": ("ember.server.cli", "store a tracking server's address and your API key"),
    "logout": ("ember.server.cli", "forget the stored server credentials"),
    "upload": ("ember.server.cli", "upload a run, an artifact, or a whole local store"),
    "ui": ("ember.server.cli", "browse a local store's runs in the web console (loopback, no login)"),
}


def _run(args: argparse.Namespace) -> int:
    """``ember run``: start ``script`` on N local processes with torchrun."""
    from torch.distributed import run as torchrun

    # Restarted gloo workers fail to reconnect to a shared rendezvous store (pytorch #135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = [f"--nproc_per_node={args.nproc}", f"--nnodes={args.nnodes}", f"--max_restarts={args.max_restarts}"]
    if args.rdzv_endpoint:
        argv += ["--rdzv_backend=c10d", f"--rdzv_endpoint={args.rdzv_endpoint}"]
        if args.rdzv_id:
            argv.append(f"--rdzv_id={args.rdzv_id}")
    elif args.nnodes == "1":
        argv.append("--standalone")
    if args.max_restarts:
        # A restarted worker resumes from the newest checkpoint (Trainer.fit(resume=None) reads it).
        os.environ.setdefault("EMBER_RESUME", "auto")
    argv += [args.script, *args.script_args]
    torchrun.main(argv)
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``command`` names the subcommand whose family to load in full."""
    parser = argparse.ArgumentParser(prog="ember", description="Train PyTorch models; track and inspect runs.")
    parser.add_argument("--version", action="version", version=f"ember {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a training script on N processes (torchrun underneath)",
        usage="ember run SCRIPT [--nproc N] [--nnodes N] [--rdzv-endpoint HOST:PORT] [--max-restarts N] [-- ARGS...]",
    )
    run.add_argument("script", help="the Python script to run")
    run.add_argument("--nproc", type=int, default=1, help="processes per machine (default 1)")
    run.add_argument("--nnodes", default="1", help="machines, or MIN:MAX for elastic jobs (default 1)")
    run.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous for several machines")
    run.add_argument("--rdzv-id", help="a job id shared by all machines")
    run.add_argument("--max-restarts", type=int, default=0, help="restart failed workers this many times")
    run.add_argument("script_args", nargs="*", help="arguments for the script, after `--`")
    run.set_defaults(handler=_run)

    loaded = {_FAMILIES[command][0]} if command in _FAMILIES else set()
    for module in loaded:
        importlib.import_module(module).add_commands(sub)
    for name, (module, help_text) in _FAMILIES.items():
        if module not in loaded:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ember`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    script_args: list[str] = []
    if command == "run" and "--" in argv:  # ember's options before `--`, the script's after it
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if command == "run":
        args.script_args = [*args.script_args, *script_args]
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    from ember.errors import EmberError

    try:
        return int(handler(args) or 0)
    except EmberError as exc:
        print(f"ember: error: {exc}", file=sys.stderr)
        return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ember")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
