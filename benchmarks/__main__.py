"""``python -m benchmarks [CASE ...] [--rounds N] [--quick]``: run cases, write the results.

Cases: step (1), tracking (2), checkpoint (3), ddp (4), import (5), cuda (6). Without a case
all run. Results go to ``benchmarks/results/<YYYY-MM-DD>-<host>.{json,md,png}``; a run of some
cases keeps the other cases already in that day's file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.harness import group_to_json, run_group

CASES: dict[str, tuple[str, str]] = {
    "step": ("benchmarks.case_step", "step overhead: hand loop, ember, accelerate, pytorch-accelerated, Lightning"),
    "tracking": ("benchmarks.case_tracking", "tracking cost: Run.log vs MLflow and TensorBoard; tracked Trainer"),
    "checkpoint": ("benchmarks.case_checkpoint", "checkpoints: save/load throughput, async_save stall"),
    "ddp": ("benchmarks.case_ddp", "data parallel: 2 gloo processes, hand DDP loop vs ember Trainer"),
    "import": ("benchmarks.case_import", "import time: import ember on top of import torch; ember --help"),
    "cuda": ("benchmarks.case_cuda", "CUDA: GPT-style model in bf16, hand loop vs ember Trainer"),
}
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    model = platform.processor() or "?"
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name"))  # fmt: skip
    except (OSError, StopIteration):
        pass
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA here",
    }


def run_cases(
    names: Sequence[str], rounds: int, quick: bool, isolate: bool = True, with_peers: bool = True, log: Any = print
) -> dict[str, Any]:
    """Run the named cases; return ``{name: {"title", "groups", "loadavg_before", ...}}``."""
    out: dict[str, Any] = {}
    for name in names:
        module, title = CASES[name]
        log(f"== case {name}: {title}")
        mod = importlib.import_module(module)
        before, t0 = list(os.getloadavg()), time.perf_counter()
        groups = [group_to_json(run_group(g, rounds, isolate, log)) for g in mod.groups(quick, with_peers)]
        out[name] = {
            "title": title,
            "note": (mod.__doc__ or "").strip(),
            "groups": groups,
            "loadavg_before": before,
            "loadavg_after": list(os.getloadavg()),
            "seconds": time.perf_counter() - t0,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    parser.add_argument("--inline", action="store_true", help="run contenders in this process (faster, less isolated)")
    parser.add_argument("--no-peers", action="store_true", help="only the hand loop and ember")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    args = parser.parse_args(argv)
    names = list(args.cases) or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    today = dt.date.today().isoformat()
    info = machine()
    stem = f"{today}-{info['host']}" + ("-quick" if args.quick else "")
    cases = run_cases(names, args.rounds, args.quick, not args.inline, not args.no_peers)
    record: dict[str, Any] = {
        "date": today,
        "machine": info,
        "command": "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
        "rounds": args.rounds,
        "quick": args.quick,
        "isolated": not args.inline,
        "cases": cases,
    }
    previous = args.out / f"{stem}.json"
    old = json.loads(previous.read_text()) if previous.exists() else None
    record = report.merge(old, record, CASES)
    record["targets"] = report.evaluate_targets(record["cases"])
    for path in report.write(record, args.out, stem):
        print(f"wrote {path}")
    for t in record["targets"]:
        print(f"  {t['status']:>12}  {t['target']}: {t['measured']} (limit {t['limit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
