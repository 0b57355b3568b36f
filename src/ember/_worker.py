"""What each ``ember run`` worker runs first: the script (or ``-m`` module), as Python would run it.

``ember run`` starts every worker as ``python -u -c "import ember._worker; ember._worker.main()"
[-m] SCRIPT ARGS...`` so that an uncaught error is reported the interpreter's way and also
reaches the launcher (torchelastic's error file), and so that the launcher learns the worker's
rank, pid and exit code (:mod:`ember._supervisor`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

STATUS_ENV = "EMBER_RUN_STATUS_DIR"
"""The folder, private to one ``ember run``, where its workers leave their start and exit records
(:mod:`ember._supervisor` reads them)."""

LAUNCHER_ENV = "EMBER_RUN_LAUNCHER_PID"
"""The pid of the ``ember run`` whose workers these are (:func:`follow_launcher`)."""

_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def main() -> None:
    """Run ``sys.argv[1]`` as ``python SCRIPT ARGS...`` would, inside an ``ember run`` worker.

    An uncaught exception is handled as the interpreter handles it (``sys.last_*`` set for exit
    handlers such as ember.track's, ``sys.excepthook`` prints it, exit code 1) with the
    traceback starting at the script, and is also written to the torchelastic error file the
    launcher reads. The process group, if the script made one, is left cleanly at exit (as
    after ``ember.launch``). The launcher gets a start record before the script runs and the
    exit code when it ends through Python; a launcher that dies sends the worker SIGTERM.
    """
    follow_launcher()
    announce()
    try:
        if sys.argv[1] == "-m":
            _run_module(sys.argv[2], sys.argv[3:])
        else:
            _run_script(*sys.argv[1:])
    except SystemExit as stop:
        record_exit(stop.code)
        raise
    record_exit(0)


def _run_script(script: str, *script_args: str) -> None:
    """Run ``script`` as ``python SCRIPT ARGS...`` would."""
    import importlib.machinery
    import types

    from ember._exit import leave_process_group_at_exit

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


def _run_module(name: str, args: list[str]) -> None:
    """Run module ``name`` as ``python -m NAME ARGS...`` would, inside an ``ember run`` worker."""
    import importlib.util
    import runpy

    from ember._exit import leave_process_group_at_exit

    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.getcwd()  # python -m puts the current folder first
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")  # a package runs its __main__
    sys.argv = [spec.origin if spec is not None and spec.origin else name, *args]
    leave_process_group_at_exit()
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except Exception as exc:  # noqa: BLE001 - reported exactly as the interpreter would, then exit 1
        _uncaught(exc, sys.argv[0])
        sys.exit(1)


def _uncaught(exc: BaseException, path: str) -> None:
    """Report an exception that ended the script: traceback from the script's frame on."""
    import json
    import time
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next  # drop _worker's frame: the script's are the user's
    tb = tb or exc.__traceback__  # raised before the script's first line ran (e.g. a module not found)
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


def record_path(folder: Path, attempt: int, rank: int, kind: str) -> Path:
    """Where a worker's ``kind`` record ("start" or "exit") goes in the launcher's status folder."""
    return folder / f"{attempt}-{rank}.{kind}"


def announce() -> None:
    """Record this worker's rank, attempt and pid for the launcher (under ``ember run`` only)."""
    folder = os.environ.get(STATUS_ENV)
    if folder:
        record = {"rank": _env_int("RANK"), "local_rank": _env_int("LOCAL_RANK"), "pid": os.getpid()}
        _write(record_path(Path(folder), _attempt(), record["rank"], "start"), record)


def follow_launcher() -> None:
    """Linux: have the kernel send this worker SIGTERM when the launcher dies.

    ``ember run`` killed with SIGKILL (the OOM killer, ``kill -9``) cannot stop its workers, and
    torchrun starts them in sessions of their own: they would train on, orphaned, holding their
    devices and the checkpoint folder's lock. With ``PR_SET_PDEATHSIG`` they get SIGTERM instead,
    which a ``fit`` with a CheckpointHook turns into a preemption save. A launcher that died
    before this ran is noticed by the parent pid, and the same signal is sent at once.
    """
    launcher = _env_int(LAUNCHER_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    if prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0 and os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGTERM)


def record_exit(code: object) -> None:
    """Record the exit code the script ended with (``SystemExit.code`` as Python maps it), and when."""
    folder = os.environ.get(STATUS_ENV)
    if folder:
        value = 0 if code is None else code if isinstance(code, int) else 1
        _write(record_path(Path(folder), _attempt(), _env_int("RANK"), "exit"), {"code": value, "time": time.time()})


def _env_int(name: str) -> int:
    value = os.environ.get(name, "0")
    return int(value) if value.isdigit() else 0


def _attempt() -> int:
    return _env_int("TORCHELASTIC_RESTART_COUNT")


def _write(path: Path, record: dict[str, Any]) -> None:
    """Write a record by rename, so the launcher never reads half of one; a failure only loses detail."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        print(f"ember: could not leave a record for ember run in {path.parent}: {exc}", flush=True)
