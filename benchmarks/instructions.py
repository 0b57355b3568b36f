"""Instructions per training step under callgrind: the step-overhead case without the noise.

``python -m benchmarks.instructions [--small 50] [--large 250] [--jobs 2]``
``python -m benchmarks.instructions --bytecodes [--small 10] [--large 30]``

On a shared VM the time of a ~0.7 ms step moves by 10–60% between runs, which hides an
overhead of a few percent. The number of instructions executed does not move: this runs each
contender of case 1 (tiny MLP, same code as ``benchmarks.case_step``) under
``valgrind --tool=callgrind`` twice, with ``small`` and ``large`` batches in one epoch, and
divides the difference of the totals by the difference of the steps. Start-up, imports and
``fit``'s set-up cancel out; what is left is the cost of one step, the data generation of one
batch included (the same for every contender).

Instructions are not time: cache misses and branch mispredictions are not counted, and a
vectorised kernel does more work per instruction than the interpreter. The figure is a noise-free
lower bound of the Python overhead, to read beside case 1's timings. Needs ``valgrind``;
takes ~25 minutes on 2 cores (callgrind runs ~50× slower than native; over an hour at load 10).
Writes ``benchmarks/results/<date>-<host>-instructions.{json,md}``.

``--bytecodes`` counts, in this process and in seconds, what the interpreter does per step
instead: Python bytecodes executed and Python functions called (``sys.settrace``), each function
listed, from the same difference of a long and a short run. It sees no C++ (torch's kernels and
dispatch are the same for every contender), and its counts never move with the load: it says
where ember's Python per step is. Writes ``<date>-<host>-bytecodes.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.case_step import contenders
from benchmarks.harness import Timer, resolve

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")


def _params(batches: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": "mlp", "batch_size": 64, "batches": batches, "epochs": 1, "seed": 0, **extra}


def worker(target: str, batches: int, extra_json: str) -> None:
    """Run one contender in this process (the child that callgrind watches)."""
    import torch

    torch.set_num_threads(1)
    resolve(target)(_params(batches, json.loads(extra_json)), Timer())


def count(target: str, batches: int, extra: dict[str, Any]) -> int:
    """Instructions the whole child process executed (valgrind's ``Collected`` total)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
            sys.executable, "-m", "benchmarks.instructions", "--worker", target, str(batches), json.dumps(extra),
        ]  # fmt: skip
        # src first: the ember of this tree, not the one the venv has installed
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {target} ({batches} batches) failed:\n{proc.stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def _traced(target: str, batches: int, extra: dict[str, Any]) -> tuple[Counter[str], Counter[str]]:
    """Bytecodes and calls, by ``file:function``, of one run of ``target`` (after an untraced one)."""
    resolve(target)(_params(batches, extra), Timer())  # imports and first-call work stay out
    ops: Counter[str] = Counter()
    calls: Counter[str] = Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
        if event == "opcode":
            ops[where] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            calls[where] += 1
        return tracer

    sys.settrace(tracer)
    try:
        resolve(target)(_params(batches, extra), Timer())
    finally:
        sys.settrace(None)
    return ops, calls


def bytecodes(small: int, large: int, out: Path) -> int:
    """``--bytecodes``: Python bytecodes and calls per step, per contender and per function."""
    import torch

    torch.set_num_threads(1)
    chosen = contenders(with_peers=False)
    steps = large - small
    rows, functions = [], {}
    for c in chosen:
        (ops_s, calls_s), (ops_l, calls_l) = (_traced(c.fn, n, dict(c.params)) for n in (small, large))
        per_op = {k: (ops_l[k] - ops_s[k]) / steps for k in ops_l}
        functions[c.name] = {k: round(v, 2) for k, v in sorted(per_op.items(), key=lambda kv: -kv[1]) if v >= 0.5}
        rows.append({"contender": c.name, "bytecodes_per_step": sum(per_op.values()),
                     "calls_per_step": (sum(calls_l.values()) - sum(calls_s.values())) / steps})  # fmt: skip
    base = rows[0]["bytecodes_per_step"]
    today, host = dt.date.today().isoformat(), socket.gethostname().split(".")[0]
    ember_files = ("trainer.py", "schedule.py", "batch.py", "engine.py", "metrics.py", "storage.py", "_bus.py",
                   "policies.py", "loss_check.py")  # fmt: skip
    target = "ember Trainer, default hooks"  # issue 6's contender
    last = functions[target]
    lines = [
        f"### Python bytecodes per step, tiny MLP 784-128-10, batch 64 ({today}, {host})",
        "",
        f"`python -m benchmarks.instructions --bytecodes --small {small} --large {large}`: `sys.settrace` counts "
        f"of a {large}- and a {small}-batch run, difference over {steps} steps (the C++ below Python is not seen).",
        "",
        "| contender | bytecodes per step | over the hand loop | Python calls per step |",
        "|---|---|---|---|",
        *(
            f"| {r['contender']} | {r['bytecodes_per_step']:,.0f} | {r['bytecodes_per_step'] - base:+,.0f} | "
            f"{r['calls_per_step']:,.0f} |"
            for r in rows
        ),
        "",
        f"ember's functions per step in the {target!r} contender:",
        "",
        "| function | bytecodes per step |",
        "|---|---|",
        *(f"| `{k}` | {v:,.0f} |" for k, v in last.items() if k.split(":")[0] in ember_files),
        "",
    ]
    record = {"date": today, "host": host, "python": sys.version.split()[0], "small": small, "large": large,
              "rows": rows, "functions": functions}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{today}-{host}-bytecodes"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=50, help="batches of the short run (default 50)")
    parser.add_argument("--large", type=int, default=250, help="batches of the long run (default 250)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="callgrind runs at once")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--bytecodes", action="store_true", help="count Python bytecodes in this process instead")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return 0
    if args.bytecodes:
        small = args.small if args.small != 50 else 10
        large = args.large if args.large != 250 else 30
        if not 0 < small < large:
            parser.error("need 0 < --small < --large")
        return bytecodes(small, large, args.out)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if not 0 < args.small < args.large:
        parser.error("need 0 < --small < --large")

    chosen = contenders(with_peers=False)
    jobs = [(c, n) for c in chosen for n in (args.small, args.large)]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        totals = list(pool.map(lambda job: count(job[0].fn, job[1], dict(job[0].params)), jobs))
    steps = args.large - args.small
    per_step = {c.name: (totals[2 * i + 1] - totals[2 * i]) / steps for i, c in enumerate(chosen)}
    base = per_step[chosen[0].name]
    rows = [{"contender": name, "instructions_per_step": round(v), "ratio": v / base} for name, v in per_step.items()]

    today, host = dt.date.today().isoformat(), socket.gethostname().split(".")[0]
    record = {"date": today, "host": host, "python": sys.version.split()[0], "small": args.small,
              "large": args.large, "rows": rows}  # fmt: skip
    lines = [
        f"### Instructions per step, tiny MLP 784-128-10, batch 64 ({today}, {host})",
        "",
        f"`python -m benchmarks.instructions --small {args.small} --large {args.large}`: callgrind totals of a "
        f"{args.large}- and a {args.small}-batch run, difference over {steps} steps.",
        "",
        "Work timed by the clock is overcounted: callgrind runs ~50x slower, so the progress bar, which "
        "redraws every 0.5 s, redraws ~50x more often per step than in a real run.",
        "",
        "| contender | instructions per step | ratio to the hand loop | overhead per step |",
        "|---|---|---|---|",
        *(
            f"| {r['contender']} | {r['instructions_per_step']:,} | {r['ratio']:.4f}x | "
            f"{r['instructions_per_step'] - round(base):+,} |"
            for r in rows
        ),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{today}-{host}-instructions"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
