"""Checkpoint saves and loads from 10 MB to 3 GB of training state (issue 18, item 14).

The state is case 3's (``benchmarks.case_checkpoint``): a wide MLP after one Adam step, so
parameters plus two Adam moments, sized to 10 MB, 100 MB, 300 MB, 1 GB and 3 GB. Each
measurement runs in a fresh process, and each process saves ``--saves`` times (each to a new
file, flushed to disk and deleted outside the timer before the next), because the first save of
a process behaved differently from later ones. Contenders, in an order rotated by the round:

* ``torch.save`` (page cache only: not durable), ``torch.save`` + ``fsync``,
  ``ember.checkpoint.save(path, trainer)`` (temporary file, write-behind, fsync, rename, folder
  fsync; the zip records keep their CRC-32s, so the file passes ``unzip -t``), and the same with
  ``skip_zip_crc=True`` (``ember, no CRC``: records without CRC-32s, which ``torch.load`` never
  checks);
* with ``--loads``: the whole state, ``torch.load`` + ``load_state_dict`` vs
  ``ember.checkpoint.load``; the model's weights alone, ``torch.load`` of a ``.pt`` vs
  safetensors' ``load_file`` (each + ``load_state_dict``) vs ``ember.checkpoint.model_state`` of
  the full checkpoint. Files are read right after being written (from the page cache).

Reported: per size and contender, the median over ``--rounds`` of the first save of a process
and of the later ones, in seconds and in MB/s of state.

    .venv/bin/python -m benchmarks.checkpoint_sizes                       # ~10 min, 3 rounds
    .venv/bin/python -m benchmarks.checkpoint_sizes --sizes 10 100 --rounds 1 --loads
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import python_json

ROOT = Path(__file__).resolve().parents[1]
SAVERS = ("torch.save", "torch.save+fsync", "ember", "ember, no CRC")


def hidden_for(megabytes: float) -> int:
    """The wide MLP's width whose state (parameters and two Adam moments, float32) is ``megabytes``."""
    params = megabytes * 1e6 / 12
    return max(8, round((-794 + math.sqrt(794**2 + 8 * params)) / 4))


def _measure(code: str, cwd: Path) -> dict[str, object]:
    return python_json(code, env={"OMP_NUM_THREADS": "1"}, cwd=cwd, timeout=1800)


_SETUP = """
import json, os, time, torch
from pathlib import Path
torch.set_num_threads(1)
from benchmarks.case_checkpoint import _Setup
s = _Setup({{"hidden": {hidden}, "batches": 2}})
mb = s.state_bytes() / 1e6
def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
"""


def save_times(how: str, hidden: int, saves: int, cwd: Path) -> dict[str, object]:
    return _measure(
        _SETUP.format(hidden=hidden)
        + f"""
from ember import checkpoint
times = []
for i in range({saves}):
    path = Path(f"state-{{i}}.ckpt")
    t = time.perf_counter()
    if {how!r}.startswith("ember"):
        checkpoint.save(path, s.trainer, skip_zip_crc={how!r} == "ember, no CRC")
    else:
        torch.save(s.state(), path)
        if {how!r} == "torch.save+fsync":
            fsync(path)
    times.append(time.perf_counter() - t)
    fsync(path)
    path.unlink()
print(json.dumps({{"mb": mb, "times": times}}))
""",
        cwd,
    )


def load_times(hidden: int, cwd: Path) -> dict[str, object]:
    return _measure(
        _SETUP.format(hidden=hidden)
        + """
from ember import checkpoint
from safetensors.torch import load_file, save_file
torch.save(s.state(), "torch.pt"); torch.save(s.model.state_dict(), "weights.pt")
save_file({k: v.contiguous() for k, v in s.model.state_dict().items()}, "weights.safetensors")
checkpoint.save("ember.ckpt", s.trainer)
def timed(fn):
    t = time.perf_counter(); fn(); return time.perf_counter() - t
def torch_state():
    state = torch.load("torch.pt", map_location="cpu", weights_only=True)
    s.model.load_state_dict(state["model"]); s.optimizer.load_state_dict(state["optimizer"])
result = {
    "mb": mb,
    "state: torch.load": timed(torch_state),
    "state: ember.load": timed(lambda: checkpoint.load("ember.ckpt", s.trainer)),
    "weights: torch.load": timed(lambda: s.model.load_state_dict(torch.load("weights.pt", weights_only=True))),
    "weights: safetensors": timed(lambda: s.model.load_state_dict(load_file("weights.safetensors"))),
    "weights: ember.model_state": timed(lambda: s.model.load_state_dict(checkpoint.model_state("ember.ckpt"))),
}
for name in ("torch.pt", "weights.pt", "weights.safetensors", "ember.ckpt"):
    os.unlink(name)
print(json.dumps(result))
""",
        cwd,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 100, 300, 1000, 3000], help="MB of state")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--saves", type=int, default=3, help="saves per process (the first is reported apart)")
    parser.add_argument("--loads", action="store_true", help="also time loads (one process per size and round)")
    parser.add_argument("--savers", nargs="+", choices=SAVERS, default=list(SAVERS), help="contenders (default: all)")
    args = parser.parse_args()
    savers = tuple(args.savers)
    work = Path(tempfile.mkdtemp(prefix="ember-ckpt-sizes-", dir=Path.cwd()))
    os.symlink(ROOT / "benchmarks", work / "benchmarks")  # the subprocesses import the harness from cwd
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    began = time.perf_counter()
    try:
        header = f"{'state':>8}  {'contender':<17}  {'first save':>12}  {'later saves':>12}  {'MB/s (later)':>12}"
        print("saves: median over rounds, seconds\n" + header)
        for size in args.sizes:
            hidden = hidden_for(size)
            firsts: dict[str, list[float]] = {h: [] for h in savers}
            laters: dict[str, list[float]] = {h: [] for h in savers}
            mb = 0.0
            for r in range(args.rounds):
                turn = r % len(savers)
                for how in savers[turn:] + savers[:turn]:
                    got = save_times(how, hidden, args.saves, work)
                    times = [float(t) for t in got["times"]]  # type: ignore[union-attr]
                    mb = float(got["mb"])  # type: ignore[arg-type]
                    firsts[how].append(times[0])
                    laters[how].extend(times[1:])
            for how in savers:
                first, later = statistics.median(firsts[how]), statistics.median(laters[how] or firsts[how])
                print(f"{mb:>6.0f}MB  {how:<17}  {first:>12.3f}  {later:>12.3f}  {mb / later:>12,.0f}", flush=True)
        if args.loads:
            print("\nloads: median over rounds, seconds (files just written: read from the page cache)")
            for size in args.sizes:
                rows = [load_times(hidden_for(size), work) for _ in range(args.rounds)]
                mb = float(rows[0]["mb"])  # type: ignore[arg-type]
                shown = "  ".join(
                    f"{k}: {statistics.median(float(r[k]) for r in rows):.3f}"  # type: ignore[arg-type]
                    for k in rows[0]
                    if k != "mb"
                )
                print(f"{mb:>6.0f}MB  {shown}", flush=True)
    finally:
        for item in work.iterdir():
            item.unlink()
        work.rmdir()
    print(f"done in {time.perf_counter() - began:.0f} s; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
