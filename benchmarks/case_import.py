"""Case 5, import time: ``import ember`` on top of ``import torch``, and ``ember --help``.

Each contender starts a fresh interpreter (``python -X importtime`` is not used: it adds its
own cost) and times it from outside; the child's CPU time comes from ``RUSAGE_CHILDREN``.
``import torch`` alone is the baseline. Since the difference of two whole-interpreter timings
drowns in this shared machine's noise, ember's own cost is also timed inside a fresh
interpreter that has imported torch first (``import ember`` alone, and with the names a
training script touches); that is the number the target is judged on.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.harness import Contender, Group, Outcome, Skipped, Timer

M = "benchmarks.case_import"

SNIPPETS = {
    "torch": "import torch",
    "torch+ember": "import torch, ember",
    "torch+ember API": "import torch, ember; ember.initialize; ember.Trainer; ember.hooks; ember.track",
}


def _timed_child(argv: list[str], timer: Timer) -> Outcome:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    timer.laps += 1
    return Outcome(work=1.0, cpu_s=cpu, wall_s=wall)


def python_import(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``python -c <snippet>`` in a fresh interpreter."""
    return _timed_child([sys.executable, "-c", SNIPPETS[str(params["snippet"])]], timer)


def import_after_torch(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """A fresh interpreter imports torch, then times ``import ember`` (plus ``params["touch"]``)
    itself: the difference of two whole-interpreter timings drowns in this machine's noise."""
    code = (
        "import time, torch\n"
        "t0 = time.perf_counter(); c0 = time.process_time()\n"
        f"import ember\n{params.get('touch', '')}\n"
        "print(time.perf_counter() - t0, time.process_time() - c0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall, cpu = (float(v) for v in proc.stdout.split()[-2:])
    timer.laps += 1
    return Outcome(work=1.0, cpu_s=cpu, wall_s=wall, extra={"import_ms": wall * 1e3})


def ember_help(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """The installed ``ember --help``."""
    exe = shutil.which("ember") or str(Path(sys.executable).with_name("ember"))
    if not Path(exe).exists():
        raise Skipped("the ember command is not installed (pip install -e .)")
    return _timed_child([exe, "--help"], timer)


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """Fresh interpreters importing torch, torch + ember; ``ember --help``."""
    contenders = (
        Contender("import torch", f"{M}:python_import", params={"snippet": "torch"}),
        Contender("import torch, ember", f"{M}:python_import", params={"snippet": "torch+ember"}),
        Contender("import torch, ember + touch Trainer/initialize/hooks/track", f"{M}:python_import",
                  params={"snippet": "torch+ember API"}),
        Contender("import ember after torch (timed in-process)", f"{M}:import_after_torch"),
        Contender("import ember + touch Trainer/initialize/hooks/track, after torch (in-process)",
                  f"{M}:import_after_torch",
                  params={"touch": "ember.initialize; ember.Trainer; ember.hooks; ember.track"}),
        Contender("ember --help", f"{M}:ember_help"),
    )  # fmt: skip
    return [Group("import time (fresh interpreter)", contenders, "import torch", {}, rel_tol=0.0, unit="ok")]
