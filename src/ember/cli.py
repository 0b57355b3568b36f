"""The ``ember`` command line: ``ember run``, ``ember runs ...``, ``ember checkpoint ...``.

Subcommands import what they need when they run, so ``ember --help`` answers quickly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

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


# Each `ember run` worker starts here (``python -u -c _WORKER script args...``) instead of at the
# script itself, so that its uncaught error reaches the launcher (see _worker).
_WORKER = "import ember.cli; ember.cli._worker()"


def _run(args: argparse.Namespace) -> int:
    """``ember run``: start ``script`` on N local processes with torchrun.

    When a worker fails, the launcher's own report is one line naming the worker, followed by
    that worker's traceback, so the error is the last thing printed; the exit code is the
    worker's (128 + N for a worker killed by signal N).
    """
    _check_run_arguments(args)  # before torch is imported: a typo answers at once
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from ember.errors import LaunchError

    if not os.path.isfile(args.script):
        raise LaunchError(f"ember run: script {args.script!r} is not a file; pass the path of a Python script")
    # Restarted gloo workers fail to reconnect to a shared rendezvous store (pytorch #135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    argv = [f"--nproc_per_node={args.nproc}", f"--nnodes={args.nnodes}", f"--max_restarts={args.max_restarts}"]
    if args.rdzv_endpoint:
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
            "free port on it) and --rdzv-id JOB, the same on every machine"
        )
    _check_operator_nnodes(args.nnodes)
    if args.rdzv_conf:
        argv.append(f"--rdzv_conf={args.rdzv_conf}")
    if args.max_restarts:
        # A restarted worker resumes from the newest checkpoint (Trainer.fit(resume=None) reads it).
        os.environ.setdefault("EMBER_RESUME", "auto")
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # as torchrun itself picks it
    argv += ["--no-python", python, "-u", "-c", _WORKER, args.script, *args.script_args]
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as failed:
        return _report_failure(failed)
    except RendezvousError as exc:  # a machine missing, an endpoint unreachable: not a worker's error
        raise LaunchError(f"ember run: {exc}") from None
    return 0


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


def _worker() -> None:
    """Run ``sys.argv[1]`` as ``python SCRIPT ARGS...`` would, inside an ``ember run`` worker.

    An uncaught exception is handled as the interpreter handles it (``sys.last_*`` set for exit
    handlers such as ember.track's, ``sys.excepthook`` prints it, exit code 1) with the
    traceback starting at the script, and is also written to the torchelastic error file the
    launcher reads. The process group, if the script made one, is left cleanly at exit (as
    after ``ember.launch``).
    """
    import importlib.machinery
    import types

    from ember._exit import leave_process_group_at_exit

    script, *script_args = sys.argv[1:]
    path = os.path.abspath(script)
    sys.argv = [script, *script_args]
    if not getattr(sys.flags, "safe_path", False):  # python -P / PYTHONSAFEPATH: no script folder on the path
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # in place of -c's ''
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main  # classes defined in the script pickle as __main__.X
    leave_process_group_at_exit()
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)  # not this module's __future__
        exec(code, main.__dict__)
    except Exception as exc:  # noqa: BLE001 - reported exactly as the interpreter would, then exit 1
        _uncaught(exc, path)
        sys.exit(1)


def _uncaught(exc: BaseException, path: str) -> None:
    """Report an exception that ended the script: traceback from the script's frame on."""
    import json
    import time
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next  # drop _worker's frame: the script's are the user's
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    sys.last_exc = exc  # type: ignore[attr-defined]  # Python 3.12's name; ember.track reads either
    sys.excepthook(type(exc), exc, tb)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    now = time.time()
    # torchelastic's error file format; "ember_time" orders failures within one second.
    info = {"py_callstack": text, "timestamp": str(int(now)), "ember_time": now}
    try:
        with open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": info}}, f)
    except OSError as e:
        print(f"ember: could not write the error file {error_file} for the launcher: {e}", file=sys.stderr)


def _report_failure(failed: ChildFailedError) -> int:
    """Print which worker failed first and its traceback, last; return the exit code to use.

    The first failure is the earliest worker that raised (its error file holds a traceback),
    else the earliest that exited with an error code, else the earliest of all (killed by a
    signal). The agent stops the other workers with SIGTERM when one fails.
    """
    failures = failed.failures

    def raised(rank: int) -> bool:
        return isinstance(failures[rank].error_file_data.get("message"), dict)

    def when(rank: int) -> tuple[float, int]:
        message = failures[rank].error_file_data.get("message")
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        return float(extra.get("ember_time", failures[rank].timestamp)), rank

    ranks = sorted(failures, key=when)
    rank = next((r for r in ranks if raised(r)), None)
    if rank is None:
        rank = next((r for r in ranks if failures[r].exitcode > 0), ranks[0])
    first = failures[rank]
    code = first.exitcode if first.exitcode > 0 else 128 - first.exitcode if first.exitcode < 0 else 1
    others = len(failures) - 1
    head = f"ember run: rank {rank} (local rank {first.local_rank}, pid {first.pid}) failed with exit code {code}"
    if others:
        head += f"; {others} other worker{'s' if others > 1 else ''} stopped"
    if raised(rank):
        body = failures[rank].error_file_data["message"].get("extraInfo", {}).get("py_callstack", first.message)
        print(f"{head}. Its error:\n{str(body).rstrip()}", file=sys.stderr, flush=True)
    elif first.exitcode < 0:
        print(f"{head}: killed by signal {-first.exitcode} ({first.signal_name()})", file=sys.stderr, flush=True)
    else:
        print(f"{head} without an exception (sys.exit, os._exit or native code); its output is above",
              file=sys.stderr, flush=True)  # fmt: skip
    return code


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
    run.add_argument("--rdzv-conf", help="torchrun's rendezvous settings, e.g. join_timeout=600,last_call_timeout=30")
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
