"""The ``ember`` command line: ``ember run``, ``ember runs ...``, ``ember checkpoint ...``.

Subcommands import what they need when they run, so ``ember --help`` answers quickly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

# Subcommand families live next to the code they drive. Each module's add_commands() registers
# its commands; it is imported only when one of them runs, so `ember --help` needs no torch.
_FAMILIES: dict[str, tuple[str, str]] = {
    "runs": ("ember.track.cli", "list, show, compare, export and remove tracked runs"),
    "checkpoint": ("ember.checkpoint.cli", "inspect a checkpoint, or export its model weights"),
    "server": ("ember.server.cli", "run the tracking server, or administer it"),
    "login": ("ember.server.cli", "store a tracking server's address and your API key"),
    "logout": ("ember.server.cli", "forget the stored server credentials"),
    "upload": ("ember.server.cli", "upload a run, an artifact, or a whole local store"),
    "ui": ("ember.server.cli", "browse a local store's runs in the web console (loopback, via the link it prints)"),
}


# `ember run`'s options: (names, argparse keywords). Named as torchrun names them, with dashes.
_RUN_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--nproc",), {"type": int, "default": 1, "help": "processes per machine (default 1)"}),
    (("--nnodes",), {"default": "1", "help": "machines, or MIN:MAX for elastic jobs (default 1)"}),
    (
        ("--node-rank",),
        {
            "type": int,
            "help": "this machine's rank, 0 to nnodes-1: a fixed (static) rendezvous "
            "at --master-addr, instead of --rdzv-endpoint's",
        },
    ),
    (("--master-addr",), {"help": "with --node-rank: the address of the machine of rank 0"}),
    (("--master-port",), {"type": int, "default": 29500, "help": "with --node-rank: a free port on it"}),
    (("--rdzv-endpoint",), {"help": "HOST:PORT of the rendezvous for several machines"}),
    (("--rdzv-id",), {"help": "a job id shared by all machines"}),
    (("--rdzv-conf",), {"help": "torchrun's rendezvous settings, e.g. join_timeout=600,last_call_timeout=30"}),
    (("--max-restarts",), {"type": int, "default": 0, "help": "restart failed workers this many times"}),
    (
        ("--shutdown-timeout",),
        {
            "type": int,
            "default": 25,
            "help": "seconds the workers get to save and exit after a SIGTERM/SIGINT before they are killed "
            "(default 25: under the 30 s Slurm and Kubernetes wait before their SIGKILL)",
        },
    ),
    (
        ("--finish-timeout",),
        {
            "type": float,
            "help": "stop the workers still running this many seconds after one finished with exit code 0 "
            "(exit code 124); default: wait, with a warning after 60 s",
        },
    ),
    (("-m", "--module"), {"action": "store_true", "help": "SCRIPT is a module, run as `python -m SCRIPT` runs it"}),
]


# The options `ember run SCRIPT --nproc 2 -- ARGS` (ember's form before torchrun's) could take after SCRIPT.
_EARLIER_OPTIONS = frozenset({"--nproc", "--nnodes", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--max-restarts"})

# Each `ember run` worker starts here (``python -u -c _WORKER [-m] script args...``) instead of at
# the script itself, so that its uncaught error reaches the launcher (see ember._worker).
_WORKER = "import ember._worker; ember._worker.main()"


def _run(args: argparse.Namespace) -> int:
    """``ember run``: start ``script`` on N local processes with torchrun.

    When a worker fails, the launcher's own report is one line naming the first worker that
    failed and how, followed by that worker's traceback, so the error is the last thing printed;
    the exit code is the worker's (128 + N for a worker killed by signal N). SIGTERM or SIGINT
    is passed on to the workers, which get ``--shutdown-timeout`` seconds to save; the exit code
    is then 75 if they all saved (see :mod:`ember._supervisor` and docs/launch.md).
    """
    _check_run_arguments(args)  # before torch is imported: a typo answers at once
    from torch.distributed import run as torchrun

    from ember.errors import LaunchError

    if args.module:
        _check_module(args.script)
    elif not os.path.isfile(args.script):
        raise LaunchError(f"ember run: script {args.script!r} is not a file; pass the path of a Python script")
    # Restarted gloo workers fail to reconnect to a shared rendezvous store (pytorch #135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = [f"--nproc_per_node={args.nproc}", f"--nnodes={args.nnodes}", f"--max_restarts={args.max_restarts}"]
    if args.node_rank is not None:  # torchrun's static rendezvous: each machine says its rank
        address = args.master_addr or "127.0.0.1"  # one machine only, checked in _check_run_arguments
        argv += [f"--node_rank={args.node_rank}", f"--master_addr={address}", f"--master_port={args.master_port}"]
    elif args.rdzv_endpoint:
        from ember import _rendezvous

        _rendezvous.check_endpoint(args.rdzv_endpoint)
        _rendezvous.register()  # torch's c10d rendezvous, whose failures name the endpoint and the nodes seen
        argv += [f"--rdzv_backend={_rendezvous.BACKEND}", f"--rdzv_endpoint={args.rdzv_endpoint}"]
        if args.rdzv_id:
            argv.append(f"--rdzv_id={args.rdzv_id}")
    elif args.nnodes in ("1", "1:1"):
        argv.append("--standalone")
    elif "PET_MASTER_ADDR" not in os.environ:  # else torchrun's static rendezvous, as in a Kubeflow TrainJob
        raise LaunchError(
            f"ember run: --nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the first machine's address and a "
            "free port on it) and --rdzv-id JOB, the same on every machine; or, as with torchrun, --node-rank R "
            "(0 to nnodes-1, a different one on each machine) and --master-addr HOST"
        )
    _check_operator_nnodes(args.nnodes)
    if args.rdzv_conf:
        argv.append(f"--rdzv_conf={args.rdzv_conf}")
    if args.max_restarts:
        # A restarted worker resumes from the newest checkpoint (Trainer.fit(resume=None) reads it).
        os.environ.setdefault("EMBER_RESUME", "auto")
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # as torchrun itself picks it
    target = ["-m", args.script] if args.module else [args.script]
    argv.append(f"--shutdown-timeout={args.shutdown_timeout}")
    options = torchrun.parse_args([*argv, "--no-python", python])
    # Set, not parsed: torchrun's argparse would read the script's `--nproc 3` as its own option.
    options.training_script_args = ["-u", "-c", _WORKER, *target, *args.script_args]
    return _supervise(torchrun.run, options, args)


def _supervise(run: Any, options: argparse.Namespace, args: argparse.Namespace) -> int:
    """Run torchrun's ``run(options)`` with ember's watch on the workers; print the report; the exit code."""
    import shutil
    import tempfile
    from pathlib import Path

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from ember import _run_report, _supervisor
    from ember.errors import LaunchError

    options.signals_to_handle = _supervisor.torch_signals(options.signals_to_handle)
    folder = Path(tempfile.mkdtemp(prefix="ember-run-"))
    try:
        with _supervisor.supervised(folder, args.finish_timeout, args.shutdown_timeout) as watcher:
            try:
                run(options)
                return 0
            except ChildFailedError as failed:
                ended: ChildFailedError | SignalException = failed
            except SignalException as stop:
                ended = stop
            except RendezvousError as exc:  # a machine missing, an endpoint unreachable: not a worker's error
                raise LaunchError(f"ember run: {exc}") from None
        # Out of the block: a signal now ends this process at once, with nothing left to stop.
        if isinstance(ended, ChildFailedError):
            text, code = _run_report.failure_report(ended, watcher)
        else:
            text, code = _run_report.stop_report(ended.sigval, watcher, args.shutdown_timeout)
        print(text, file=sys.stderr, flush=True)
        return code
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the workers' records, in a private temporary folder


def _check_operator_nnodes(nnodes: str) -> None:
    """Refuse to start a one-machine job in a pod that a Kubernetes operator made part of a bigger one.

    Operators set ``PET_NNODES`` for torchrun, which reads it; ``ember run`` passes ``--nnodes``
    itself, so without this each pod would train a job of its own.
    """
    from ember.errors import LaunchError

    pet = os.environ.get("PET_NNODES")
    if pet is not None and pet != nnodes:
        raise LaunchError(
            f"ember run: --nnodes {nnodes}, but PET_NNODES={pet} (set by a Kubernetes operator) says this job spans "
            f'{pet} machines: pass --nnodes "$PET_NNODES" --nproc "$PET_NPROC_PER_NODE", or make torchrun the '
            "container command"
        )


def _check_run_arguments(args: argparse.Namespace) -> None:
    """``ember run``'s numbers, checked before anything starts (torchrun only asserts them)."""
    from ember.errors import LaunchError

    if args.nproc < 1:
        raise LaunchError(f"ember run: --nproc {args.nproc}: give the number of processes per machine, 1 or more")
    low, _, high = str(args.nnodes).partition(":")
    try:
        sizes = [int(low), int(high or low)]
    except ValueError:
        sizes = [0, 0]
    if not 1 <= sizes[0] <= sizes[1]:
        raise LaunchError(
            f"ember run: --nnodes {args.nnodes!r}: give the number of machines, 1 or more, or MIN:MAX with "
            "1 <= MIN <= MAX for an elastic job"
        )
    if args.max_restarts < 0:
        raise LaunchError(f"ember run: --max-restarts {args.max_restarts}: give 0 (no restart) or more")
    if args.shutdown_timeout < 0:
        raise LaunchError(f"ember run: --shutdown-timeout {args.shutdown_timeout}: give 0 seconds or more")
    if args.finish_timeout is not None and not 0 < args.finish_timeout < float("inf"):
        raise LaunchError(f"ember run: --finish-timeout {args.finish_timeout}: give a number of seconds above 0")
    if args.node_rank is None:
        if args.master_addr:
            raise LaunchError("ember run: --master-addr goes with --node-rank (a fixed rendezvous), as in torchrun")
        return
    if args.rdzv_endpoint:
        raise LaunchError(
            "ember run: give either --node-rank with --master-addr (fixed ranks) or --rdzv-endpoint (ranks given "
            "by the rendezvous), not both"
        )
    if sizes[0] != sizes[1]:
        raise LaunchError(f"ember run: --node-rank needs a fixed --nnodes, not {args.nnodes!r}")
    if not 0 <= args.node_rank < sizes[0]:
        raise LaunchError(
            f"ember run: --node-rank {args.node_rank}: give 0 to {sizes[0] - 1} (--nnodes {args.nnodes}), "
            "a different one on each machine"
        )
    if sizes[0] > 1 and not args.master_addr:
        raise LaunchError(
            f"ember run: --node-rank with --nnodes {args.nnodes} needs --master-addr HOST, the address of the "
            "machine of node rank 0 (and --master-port, default 29500)"
        )


def _check_module(name: str) -> None:
    """Refuse ``ember run -m NAME`` when no top-level package or module of that name is importable.

    Only the top level is looked up: finding ``pkg.mod`` would import ``pkg`` in the launcher.
    """
    import importlib.util

    from ember.errors import LaunchError

    top = name.partition(".")[0]
    sys.path.insert(0, os.getcwd())  # where the workers look first, as `python -m` does
    try:
        found = bool(top) and importlib.util.find_spec(top) is not None
    finally:
        sys.path.pop(0)
    if not found:
        raise LaunchError(
            f"ember run: -m {name}: no module {top!r} in the current folder or on the path (PYTHONPATH); "
            "give a module name, e.g. -m mypackage.train"
        )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; ``command`` names the subcommand whose family to load in full."""
    parser = argparse.ArgumentParser(prog="ember", description="Train PyTorch models; track and inspect runs.")
    parser.add_argument("--version", action="version", version=f"ember {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a training script on N processes (torchrun underneath)",
        usage="ember run [--nproc N] [--nnodes N] [--node-rank R --master-addr HOST] [--rdzv-endpoint HOST:PORT] "
        "[--max-restarts N] [--shutdown-timeout S] [--finish-timeout S] [-m] SCRIPT [ARGS...]",
        description="Options before SCRIPT are ember's; everything after it goes to the script, as with torchrun.",
    )
    for names, kwargs in _RUN_OPTIONS:
        run.add_argument(*names, **kwargs)
    run.add_argument("script", metavar="SCRIPT", help="the Python script to run (with -m: a module name)")
    run.add_argument("script_args", metavar="ARGS", nargs="*", help="the script's own arguments")
    run.set_defaults(handler=_run)

    loaded = {_FAMILIES[command][0]} if command in _FAMILIES else set()
    for module in loaded:
        importlib.import_module(module).add_commands(sub)
    for name, (module, help_text) in _FAMILIES.items():
        if module not in loaded:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ember`` command (and of ``python -m ember``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    script_args: list[str] = []
    if command == "run":
        cut = argv.index("run") + 1
        ember_args, script_args = split_run_argv(argv[cut:])
        argv = [*argv[:cut], *ember_args]
    args = parser.parse_args(argv)
    if command == "run":
        args.script_args = script_args
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    from ember._subcommands import run_handler
    from ember.logging import setup_output

    setup_output()  # ember's records to stderr, unless the application configured logging
    return run_handler(args)


def split_run_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split what follows ``ember run`` into ember's arguments (ending with SCRIPT) and the script's.

    As with torchrun, options before SCRIPT are ember's and every argument after it is the
    script's. For scripts started the way earlier ember versions documented (``ember run
    train.py --nproc 2 -- --lr 0.1``), ember's own options right after SCRIPT are still ember's
    when none came before it, up to the first other argument; a ``--`` there ends them and is
    dropped. Only the options of that form count (not ``-m``, ``--node-rank``, ``--help``...),
    so a script's own ``-m`` or ``--help`` stays the script's.

    Returns:
        ``(ember_args, script_args)``; ``ember_args`` is what argparse reads.

    Example:
        >>> split_run_argv(["--nproc", "2", "train.py", "--lr", "0.1"])
        (['--nproc', '2', 'train.py'], ['--lr', '0.1'])
        >>> split_run_argv(["train.py", "--nproc", "2", "--lr", "0.1"])
        (['train.py', '--nproc', '2'], ['--lr', '0.1'])
    """
    takes_value = {name for names, kwargs in _RUN_OPTIONS if kwargs.get("action") is None for name in names}
    flags = {"-h", "--help"} | {name for names, kwargs in _RUN_OPTIONS for name in names} - takes_value

    def option_length(i: int) -> int:
        """How many arguments the ember option at ``i`` spans (0 when it is not one of ember's)."""
        name = argv[i].split("=", 1)[0]
        if argv[i] in flags:
            return 1
        if name in takes_value:
            return 1 if "=" in argv[i] else 2
        return 0

    i = 0
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-"):
        i += option_length(i) or 1  # an unknown option: argparse names it
    if i < len(argv) and argv[i] == "--":
        i += 1  # `ember run [OPTIONS] -- SCRIPT`
    if i >= len(argv):
        return list(argv), []
    script = i
    i += 1
    if script == 0:  # nothing before SCRIPT: the earlier form, with the options it had then
        while i < len(argv) and argv[i].split("=", 1)[0] in _EARLIER_OPTIONS:
            i += option_length(i)
        ember_args = [*argv[:i]]
        if i < len(argv) and argv[i] == "--":
            i += 1
        return ember_args, list(argv[i:])
    return list(argv[: script + 1]), list(argv[script + 1 :])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ember")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
