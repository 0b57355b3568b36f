"""The local store as the work grows: lookups by name, ``runs export`` and the logging queue.

Three parts (issue 18, items 11 and 12), each run in fresh processes so that one cannot warm or
bloat another:

* ``lookups``: stores of 100, 1,000 and 10,000 runs (written directly in ember's layout: a
  ``run.json``, a ``platform.json`` and 20 ``train`` points each); in one process per store,
  the median of ``--repeat`` calls, after one warm-up, of ``ember runs show NAME``, ``ember
  runs compare`` of 10 runs by whole folder name and by unique prefix, and ``ember runs ls``.
* ``export``: one run of 10^5, 10^6 (and with ``--huge`` 10^7) ``train`` points of two metrics;
  ``ember runs export --format csv|json --output FILE`` in a fresh process each: wall time and
  the process's peak resident memory (``ru_maxrss``) over its resident memory before the call.
* ``logging``: ``Run.log`` of 5 x 10^6 points of one metric in a tight loop, in a fresh process:
  its peak resident memory over the same process with the run open and nothing logged yet, and
  the values enqueued per second.

    .venv/bin/python -m benchmarks.store_scale                 # all three, ~5 min
    .venv/bin/python -m benchmarks.store_scale lookups --sizes 100 10000
    .venv/bin/python -m benchmarks.store_scale export --huge   # adds 10^7 points (~10 min, ~700 MB of disk)

``--src DIR`` runs the same measurements against another checkout's ``src`` (an older ember), for
a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.harness import python_json

_POINT = '{{"step":{s},"epoch":{e},"time":{t:.3f},"metrics":{{"loss":{l!r},"acc":{a!r}}}}}\n'


def _meta(name: str, i: int) -> dict[str, object]:
    start = f"2026-01-01T00:{i // 3600 % 60:02d}:{i // 60 % 60:02d}.{i % 1000:03d}+00:00"
    return {"format": "ember.run/1", "id": uuid.uuid4().hex, "name": name, "folder": "default", "labels": [],
            "description": "", "status": "Complete", "start_time": start, "end_time": start,
            "heartbeat": start, "pid": 1, "hostname": "bench", "hparams": {"lr": 0.001 * (i % 7), "seed": i},
            "resumes": []}  # fmt: skip


def _write_run(runs: Path, name: str, i: int, points: int) -> Path:
    folder = runs / f"{name}_260101_000000_{i:06d}"
    (folder / "metrics").mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(_meta(name, i), indent=2) + "\n")
    (folder / "platform.json").write_text("{}\n")
    (folder / "stdout.log").write_text("")
    with open(folder / "metrics" / "train.jsonl", "w") as f:
        for s in range(0, points, 100_000):
            f.write("".join(_POINT.format(s=k, e=k // 1000, t=1.7e9 + k, l=1.0 / (k + 1), a=k * 1e-7)
                            for k in range(s, min(points, s + 100_000))))  # fmt: skip
    return folder


def _python(src: Path, code: str) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter with ``src`` first on the path; it prints one JSON line."""
    return python_json(code, env={"PYTHONPATH": str(src)})


def lookups(src: Path, sizes: list[int], repeat: int, tmp: Path) -> None:
    print(f"lookups by name (median of {repeat}, seconds)")
    print(f"{'runs':>7}  {'show NAME':>10}  {'compare 10 names':>16}  {'compare 10 prefixes':>19}  {'ls':>8}")
    for size in sizes:
        home = tmp / f"store-{size}"
        runs = home / "runs"
        for i in range(size):
            _write_run(runs, f"run{i:05d}", i, 20)
        names = sorted(p.name for p in runs.iterdir())
        chosen = names[:: max(1, size // 10)][:10]
        prefixes = [n.split("_")[0] for n in chosen]
        result = _python(
            src,
            f"""
            import contextlib, io, json, statistics, time
            from ember.track.cli import main
            def timed(argv):
                times = []
                for _ in range({repeat} + 1):
                    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                        t = time.perf_counter(); assert main(argv) == 0; times.append(time.perf_counter() - t)
                return statistics.median(times[1:])
            store = ["--store", {str(home)!r}]
            print(json.dumps({{
                "show": timed(["runs", "show", {chosen[0]!r}, *store]),
                "compare": timed(["runs", "compare", *{chosen!r}, *store]),
                "prefixes": timed(["runs", "compare", *{prefixes!r}, *store]),
                "ls": timed(["runs", "ls", *store]),
            }}))
        """,
        )
        print(f"{size:>7,}  {result['show']:>10.4f}  {result['compare']:>16.4f}  {result['prefixes']:>19.4f}  "
              f"{result['ls']:>8.3f}", flush=True)  # fmt: skip
        shutil.rmtree(home)


def export(src: Path, sizes: list[int], tmp: Path) -> None:
    print("runs export (one fresh process each): seconds, and peak memory over the process before the call")
    print(f"{'points':>11}  {'format':>6}  {'seconds':>8}  {'peak +MB':>9}  {'output MB':>9}")
    for size in sizes:
        home = tmp / f"export-{size}"
        folder = _write_run(home / "runs", "long", 0, size)
        for fmt in ("csv", "json"):
            out = tmp / f"out.{fmt}"
            result = _python(
                src,
                f"""
                import json, resource, time
                from ember.track.cli import main
                def rss_mb():  # resident now, from /proc (ru_maxrss is the peak)
                    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
                before = rss_mb()
                t = time.perf_counter()
                assert main(["runs", "export", {folder.name!r}, "--format", {fmt!r}, "--output", {str(out)!r},
                             "--store", {str(home)!r}]) == 0
                seconds = time.perf_counter() - t
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(json.dumps({{"seconds": seconds, "peak": peak - before}}))
            """,
            )
            print(f"{size:>11,}  {fmt:>6}  {result['seconds']:>8.1f}  {result['peak']:>9.0f}  "
                  f"{out.stat().st_size / 1e6:>9.0f}", flush=True)  # fmt: skip
            out.unlink()
        shutil.rmtree(home)


def log_queue(src: Path, points: int, tmp: Path) -> None:
    result = _python(
        src,
        f"""
        import json, resource, time
        from ember import track
        def rss_mb():
            return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
        run = track.create_run(name="tight", home={str(tmp / "log-store")!r})
        run.log("train", {{"loss": 0.0}}, step=0)
        run.flush()
        idle = rss_mb()  # the run open, its writer thread started, nothing queued
        t = time.perf_counter()
        for step in range(1, {points}):
            run.log("train", {{"loss": float(step)}}, step=step)
        enqueue = time.perf_counter() - t
        run.finish()
        durable = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({{"peak": peak - idle, "rate": {points} / enqueue, "durable": durable}}))
    """,
    )
    print(
        f"logging {points:,} points in a tight loop: peak {result['peak']:.0f} MB over the idle run, "
        f"{result['rate']:,.0f} values/s enqueued, all on disk after {result['durable']:.1f} s"
    )
    shutil.rmtree(tmp / "log-store", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help="lookups, export, logging (default: all)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000], help="runs per store")
    parser.add_argument("--points", type=int, nargs="+", default=[100_000, 1_000_000], help="points to export")
    parser.add_argument("--huge", action="store_true", help="also export 10^7 points")
    parser.add_argument("--log-points", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src",
                        help="the ember source tree to measure (default: this checkout's)")  # fmt: skip
    args = parser.parse_args()
    args.parts = args.parts or ["lookups", "export", "logging"]
    unknown = set(args.parts) - {"lookups", "export", "logging"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: choose among lookups, export, logging")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"ember from {args.src}; load average {load}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="ember-store-scale-"))
    began = time.perf_counter()
    try:
        if "lookups" in args.parts:
            lookups(args.src, args.sizes, args.repeat, tmp)
        if "export" in args.parts:
            export(args.src, [*args.points, *([10_000_000] if args.huge else [])], tmp)
        if "logging" in args.parts:
            log_queue(args.src, args.log_points, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"done in {time.perf_counter() - began:.0f} s; load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
