"""The ember command: quick help, `ember run` over torchrun, errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

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
