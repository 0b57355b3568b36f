"""The ember command: quick help, `ember run` over torchrun, errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ember._run_report import failure_report
from tests.dist import ROOT


def _ember(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ember.cli", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_help_lists_every_command_without_importing_torch() -> None:
    code = "import sys; from ember.cli import build_parser; build_parser().format_help(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    help_text = _ember("--help").stdout
    for command in ("run", "runs", "checkpoint", "server", "login", "upload"):
        assert f"    {command}" in help_text


def test_unknown_command_is_one_clear_line() -> None:
    proc = _ember("runz")
    assert proc.returncode == 2 and "invalid choice: 'runz'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "ember_args", "script_args"),
    [
        # torchrun's form: options before SCRIPT are ember's, everything after it the script's
        (["train.py", "--lr", "0.1"], ["train.py"], ["--lr", "0.1"]),
        (["--nproc", "2", "train.py", "--lr", "0.1", "--nproc", "4"], ["--nproc", "2", "train.py"],
         ["--lr", "0.1", "--nproc", "4"]),
        (["--nproc=2", "-m", "pkg.train", "--lr", "0.1"], ["--nproc=2", "-m", "pkg.train"], ["--lr", "0.1"]),
        (["--nproc", "2", "--", "train.py", "--", "x"], ["--nproc", "2", "--", "train.py"], ["--", "x"]),
        # earlier ember's form: ember's options right after SCRIPT, up to the first other argument or `--`
        (["train.py", "--nproc", "2", "--", "--lr", "0.1"], ["train.py", "--nproc", "2"], ["--lr", "0.1"]),
        (["train.py", "--nproc", "2", "--lr", "0.1", "--nnodes", "3"], ["train.py", "--nproc", "2"],
         ["--lr", "0.1", "--nnodes", "3"]),
        (["train.py", "--max-restarts=1", "--", "--nproc", "4"], ["train.py", "--max-restarts=1"], ["--nproc", "4"]),
        (["train.py", "-m", "resnet", "--help"], ["train.py"], ["-m", "resnet", "--help"]),  # not options then
        (["--nproc", "2"], ["--nproc", "2"], []),  # no SCRIPT: argparse says it is missing
    ],
)  # fmt: skip
def test_ember_run_gives_the_script_every_argument_after_it_as_torchrun_does(
    argv: list[str], ember_args: list[str], script_args: list[str]
) -> None:
    from ember.cli import split_run_argv

    assert split_run_argv(argv) == (ember_args, script_args)


def test_python_dash_m_ember_is_the_ember_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "ember", "run", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "usage: ember run [--nproc N]" in proc.stdout and "--node-rank" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "ember", "runz"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice: 'runz'" in proc.stderr


@pytest.mark.multiprocess
def test_python_m_ember_run_m_module_passes_the_scripts_own_options(tmp_path: Path) -> None:
    env = {**os.environ, "EMBER_TEST_OUT": str(tmp_path), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "ember", "run", "--nproc", "2", "-m", "tests.scripts.report_world"]
    proc = subprocess.run([*argv, "--lr", "0.1", "--nproc", "3"], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world_size"] == 2 and r["argv"] == ["--lr", "0.1", "--nproc", "3"] for r in reports)


@pytest.mark.multiprocess
def test_node_rank_and_master_addr_start_a_job_of_two_machines_as_torchrun_does(tmp_path: Path) -> None:
    from tests.dist import free_port

    env = {**os.environ, "EMBER_TEST_OUT": str(tmp_path), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("PET_NNODES", None)
    port = str(free_port())
    script = str(ROOT / "tests" / "scripts" / "report_world.py")
    agents = [
        subprocess.Popen([sys.executable, "-m", "ember", "run", "--nnodes", "2", "--node-rank", str(node),
                          "--master-addr", "127.0.0.1", "--master-port", port, script, "--node", str(node)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (1, 0)
    ]  # fmt: skip
    for agent in agents:
        _, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [(r["rank"], r["world_size"], r["argv"]) for r in reports] == [
        (0, 2, ["--node", "0"]),
        (1, 2, ["--node", "1"]),
    ]


def test_a_module_that_is_not_there_is_one_error_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from ember.cli import main

    assert main(["run", "-m", "no_such_module_xyz.train", "--lr", "0.1"]) == 2
    assert "ember run: -m no_such_module_xyz.train: no module 'no_such_module_xyz'" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_ember_run_starts_n_processes_and_passes_script_arguments() -> None:
    with tempfile.TemporaryDirectory() as out:
        env = {"EMBER_TEST_OUT": out, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = _ember("run", str(ROOT / "tests" / "scripts" / "report_world.py"), "--nproc", "2", "--", "--lr", "0.1",
                      env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        reports = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["world_size"] == 2 and r["argv"] == ["--lr", "0.1"] and r["rdzv_fix"] == "1" for r in reports)


def test_a_training_scripts_imports_leave_the_sharded_checkpoint_stack_unloaded() -> None:
    """torch.distributed.checkpoint pulls in DTensor and sympy (~2.5 s here); only FSDP/TP saves need it."""
    code = (
        "import sys, ember; from ember.trainer import Trainer, hooks; from ember import track; "
        "import ember.checkpoint; ember.initialize; "
        "print(sorted(m for m in ('torch.distributed.checkpoint', 'sympy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.multiprocess
def test_a_failing_worker_s_own_error_is_the_last_thing_ember_run_prints(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, sys, time\n"
        "from ember import track\n"
        "if os.environ['RANK'] == '0':\n"
        "    run = track.create_run(name='fails')\n"
        "    raise ValueError('boom-42')\n"
        "time.sleep(60)  # rank 1: stopped by the launcher\n"
    )
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-m", "ember.cli", "run", str(script), "--nproc", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
        env={**os.environ, "EMBER_HOME": str(store)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.rstrip().splitlines()
    report = max(i for i, line in enumerate(lines) if line.startswith("ember run: "))
    assert lines[report].startswith("ember run: rank 0 (local rank 0, pid ") and "exit code 1" in lines[report]
    traceback = [
        "Traceback (most recent call last):",
        f'  File "{script}", line 5, in <module>',
        "    raise ValueError('boom-42')",
        "ValueError: boom-42",
    ]
    assert lines[report + 1 :] == traceback  # the worker's own frames, and nothing of the launcher after them
    assert (
        "ChildFailedError" not in proc.stdout
        and "ember/cli.py" not in proc.stdout
        and "ember/_worker.py" not in proc.stdout
    )
    # handled as the interpreter handles an uncaught error: the exit hook marks the run Failed
    (run,) = (store / "runs").iterdir()
    assert json.loads((run / "run.json").read_text())["status"] == "Failed"
    assert (run / "stdout.log").read_text().splitlines() == traceback


def _failure(tmp_path: Path, rank: int, exitcode: int, raised_at: float | None) -> ProcessFailure:
    """A worker's failure as the launcher sees it; ``raised_at`` writes the error file a raise leaves."""
    error_file = tmp_path / f"error-{rank}-{exitcode}.json"
    if raised_at is not None:
        info = {
            "py_callstack": f"Traceback of rank {rank}\n",
            "timestamp": str(int(raised_at)),
            "ember_time": raised_at,
        }
        error_file.write_text(json.dumps({"message": {"message": f"E{rank}", "extraInfo": info}}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(error_file))


def test_the_first_worker_to_raise_is_reported_not_one_stopped_or_failing_after_it(tmp_path: Path) -> None:
    failures = {
        0: _failure(tmp_path, 0, 1, 1000.7),  # lost its peer after rank 2 died, in the same second
        1: _failure(tmp_path, 1, -15, None),  # stopped by the launcher
        2: _failure(tmp_path, 2, 1, 1000.2),
    }
    text, code = failure_report(ChildFailedError("train.py", failures), None)
    assert code == 1
    assert text.startswith(
        "ember run: rank 2 (local rank 2, pid 102) failed with exit code 1; rank 0 failed after it; "
        "ember run stopped 1 other worker. Its error:"
    )
    assert text.rstrip().endswith("Traceback of rank 2")
    killed = {0: _failure(tmp_path, 0, -9, None)}
    text, code = failure_report(ChildFailedError("train.py", killed), None)
    assert code == 128 + 9 and text.endswith("failed with exit code 137, killed by signal 9 (SIGKILL)")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--nproc", "0"], "--nproc 0: give the number of processes per machine, 1 or more"),
        (["--nproc", "-2"], "--nproc -2"),
        (["--nnodes", "0"], "--nnodes '0': give the number of machines"),
        (["--nnodes", "3:2"], "--nnodes '3:2'"),
        (["--nnodes", "two"], "--nnodes 'two'"),
        (["--max-restarts", "-1"], "--max-restarts -1: give 0 (no restart) or more"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank 2: give 0 to 1 (--nnodes 2)"),
        (["--nnodes", "2", "--node-rank", "1"], "--node-rank with --nnodes 2 needs --master-addr HOST"),
        (["--nnodes", "1:2", "--node-rank", "0"], "--node-rank needs a fixed --nnodes, not '1:2'"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1"], "give either --node-rank"),
        (["--master-addr", "h"], "--master-addr goes with --node-rank"),
    ],
)
def test_bad_ember_run_numbers_are_one_clear_error_before_anything_starts(
    option: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ember.cli import main

    assert main(["run", *option, __file__]) == 2  # in this process: nothing was started
    err = capsys.readouterr().err
    assert f"ember: error: ember run: {message}" in err and "AssertionError" not in err


@pytest.mark.multiprocess
def test_ember_run_exits_with_the_scripts_own_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(75)\n")  # not 1: 75 is "preempted after saving", what schedulers requeue
    assert _ember("run", str(script)).returncode == 75


def test_a_script_with_a_syntax_error_ends_with_its_own_message(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text("x = (\n")
    proc = _ember("run", str(script))
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == "SyntaxError: '(' was never closed"


def test_subcommand_families_use_the_shared_helpers_not_the_ember_command() -> None:
    # ember.cli is the top of the command line; the families below it share ember._subcommands.
    import ast

    import ember

    root = Path(ember.__file__).parent
    families = [root / "track" / "cli.py", root / "checkpoint" / "cli.py", root / "server" / "cli.py"]
    for path in families:
        modules = {n.module for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        assert "ember.cli" not in modules and "ember._subcommands" in modules, path
    assert not (root / "_cli.py").exists()
