"""What the multi-process figures share: a ``--worker`` run under torchrun, and the results files.

The figures of ``moe_traffic`` and ``precision_memory`` need several processes: each module has
a ``--worker OUT`` mode that measures inside the job and writes JSON to ``OUT`` from rank 0
(:func:`torchrun_json`); :func:`write_figure` keeps the table in ``benchmarks/results``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def torchrun_json(module: str, world: int, *args: str, timeout: float = 900) -> Any:
    """``python -m torch.distributed.run --nproc_per_node=world -m module --worker OUT *args``; OUT's JSON.

    Raises:
        subprocess.CalledProcessError: the job failed (its output is in the exception).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--standalone",
               "-m", module, "--worker", str(out), *args]  # fmt: skip
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, timeout=timeout, capture_output=True)
        return json.loads(out.read_text())


def write_figure(stem: str, text: str, data: Any) -> None:
    """Write ``text`` (markdown) and ``data`` (JSON) to ``benchmarks/results/<date>-<stem>.{md,json}``; print it."""
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / f"{dt.date.today()}-{stem}.md").write_text(text)
    (results / f"{dt.date.today()}-{stem}.json").write_text(json.dumps(data, indent=1))
    print(text)
