"""The measuring machinery: contenders, interleaved rounds, timing, statistics, the work check.

A *case* is a set of *groups*; a group is a set of contenders that did the same work and are
compared with each other (one of them is the baseline, e.g. the hand-written loop). Each
round runs every contender of a group once, in an order rotated by the round number, so a
slow spell on this shared machine hits every contender alike rather than one of them.

A contender is a function ``fn(params, timer) -> Outcome``: it builds what it needs, wraps
only the timed region in ``with timer:``, and returns a number that proves what work it did
(the final loss, the number of values stored). By default each run happens in a fresh Python
process (``python -m benchmarks._worker``), so one contender's imports, threads and global
settings cannot leak into another's timing; ``isolate=False`` runs them in this process (the
smoke test does, to stay fast).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 900


class NotInstalled(Exception):
    """Raised by a contender whose peer library is not installed."""


class Skipped(Exception):
    """Raised by a contender that cannot run here (no CUDA, a missing ember feature)."""


class Timer:
    """Measures process CPU time and wall time of the ``with`` blocks it wraps (summed)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.laps = 0
        self._start: tuple[float, float] | None = None

    def __enter__(self) -> Timer:
        self._start = (time.process_time(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        cpu0, wall0 = self._start
        self.wall_s += time.perf_counter() - wall0
        self.cpu_s += time.process_time() - cpu0
        self.laps += 1
        self._start = None


@dataclass
class Outcome:
    """What a contender reports besides the timer.

    Attributes:
        work: a number every contender of the group must reproduce (final loss, values stored).
        extra: more numbers for the report (values/s, MB/s, stall per save...).
        cpu_s/wall_s: set these when the contender timed itself (e.g. in child processes);
            otherwise the harness reads its :class:`Timer`.
    """

    work: float
    extra: dict[str, float] = field(default_factory=dict)
    cpu_s: float | None = None
    wall_s: float | None = None


ContenderFn = Callable[[Mapping[str, Any], Timer], Outcome]


@dataclass(frozen=True)
class Contender:
    """One way of doing a group's work.

    Attributes:
        name: shown in the table.
        fn: ``"module:function"`` (importable in a fresh process).
        needs: modules that must import for it to run (peers); missing ones: "not installed".
        params: extra parameters for this contender only.
    """

    name: str
    fn: str
    needs: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    """Contenders doing the same work, compared to ``baseline``.

    Attributes:
        name: e.g. ``"tiny MLP"``.
        contenders: in the order of the table.
        baseline: name of the contender the ratios are relative to.
        params: shared parameters (sizes, seed).
        rel_tol: how far a contender's ``work`` may be from the baseline's (relative).
        torch_threads: torch's intra-op threads in the worker.
        unit: what ``work`` is (for the table).
        scale_key: when contenders do different amounts of the same work (MLflow logs fewer
            values), the parameter that counts it: ratios are then per unit of work.
    """

    name: str
    contenders: tuple[Contender, ...]
    baseline: str
    params: Mapping[str, Any]
    rel_tol: float = 1e-5
    torch_threads: int = 1
    unit: str = "final loss"
    scale_key: str | None = None


@dataclass
class Sample:
    """One timed run of one contender."""

    round: int
    cpu_s: float
    wall_s: float
    work: float
    extra: dict[str, float]


@dataclass
class ContenderResult:
    """All rounds of one contender, and the summary the report shows."""

    name: str
    status: str = "ok"  # ok | not installed | skipped | failed | different work
    note: str = ""
    samples: list[Sample] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class GroupResult:
    """One group's contenders, baseline and tolerance."""

    name: str
    baseline: str
    unit: str
    rel_tol: float
    params: dict[str, Any]
    contenders: list[ContenderResult]


# -- running one contender --------------------------------------------------------------------
def resolve(spec: str) -> ContenderFn:
    """Import ``"module:function"``."""
    module, _, name = spec.partition(":")
    fn: ContenderFn = getattr(importlib.import_module(module), name)
    return fn


def run_inline(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run one contender in this process, in a scratch directory that is removed afterwards
    (runs, checkpoints and peer stores go there); return ``{"status", ...}``."""
    saved_cwd, saved_env = os.getcwd(), {k: os.environ.get(k) for k in SCRATCH_ENV}
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as scratch:
        os.chdir(scratch)
        os.environ.update(EMBER_HOME=str(Path(scratch) / ".ember"), MLFLOW_ALLOW_FILE_STORE="true")
        try:
            return _run_here(spec)
        finally:
            os.chdir(saved_cwd)
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


SCRATCH_ENV = ("EMBER_HOME", "MLFLOW_ALLOW_FILE_STORE")


def _run_here(spec: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(spec["torch_threads"]))
    for module in spec["needs"]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return {"status": "not installed", "note": f"{module}: {exc}"}
    timer = Timer()
    try:
        outcome = resolve(spec["fn"])(spec["params"], timer)
    except NotInstalled as exc:
        return {"status": "not installed", "note": str(exc)}
    except Skipped as exc:
        return {"status": "skipped", "note": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported in the table, the other contenders go on
        return {"status": "failed", "note": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    if outcome.cpu_s is None and timer.laps == 0:
        return {"status": "failed", "note": "the contender never entered its timer"}
    return {
        "status": "ok",
        "cpu_s": outcome.cpu_s if outcome.cpu_s is not None else timer.cpu_s,
        "wall_s": outcome.wall_s if outcome.wall_s is not None else timer.wall_s,
        "work": outcome.work,
        "extra": outcome.extra,
    }


def run_isolated(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run one contender in a fresh interpreter, in a scratch directory, with one BLAS thread."""
    threads = str(spec["torch_threads"])
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONPATH=_pythonpath())
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._worker"],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=WORKER_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"status": "failed", "note": f"timed out after {WORKER_TIMEOUT_S} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"status": "failed", "note": f"worker exited {proc.returncode}: {' | '.join(tail)}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def python_json(
    code: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 3600
) -> dict[str, Any]:
    """Run ``code`` (dedented) in a fresh interpreter and return the JSON object its last line prints.

    ``env`` is added to this process's environment (e.g. ``PYTHONPATH`` of another checkout).

    Raises:
        RuntimeError: the interpreter failed, with the end of its stderr.
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"the measurement failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _pythonpath() -> str:
    parts = [str(ROOT), str(ROOT / "src")]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


# -- a group, round by round --------------------------------------------------------------------
def run_group(group: Group, rounds: int, isolate: bool = True, log: Callable[[str], None] = print) -> GroupResult:
    """Run every contender of ``group`` ``rounds`` times, interleaved, and summarise."""
    results = {c.name: ContenderResult(c.name) for c in group.contenders}
    active = list(group.contenders)
    for r in range(rounds):
        shift = r % max(1, len(active))
        for contender in active[shift:] + active[:shift]:
            res = results[contender.name]
            if res.status != "ok":
                continue
            spec = {
                "fn": contender.fn,
                "needs": list(contender.needs),
                "params": {**group.params, **contender.params},
                "torch_threads": group.torch_threads,
            }
            out = run_isolated(spec) if isolate else run_inline(spec)
            if out["status"] != "ok":
                res.status, res.note = out["status"], out.get("note", "")
                if out.get("traceback"):
                    log(out["traceback"])
                log(f"  [{group.name}] {contender.name}: {res.status} ({res.note})")
                continue
            res.samples.append(Sample(r, out["cpu_s"], out["wall_s"], out["work"], out.get("extra", {})))
            log(f"  [{group.name}] round {r + 1}/{rounds} {contender.name}: cpu {out['cpu_s']:.3f} s, "
                f"wall {out['wall_s']:.3f} s, {group.unit} {out['work']:.6g}")  # fmt: skip
    _summarise(group, results)
    return GroupResult(
        group.name, group.baseline, group.unit, group.rel_tol, _plain(group.params), list(results.values())
    )


def _spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4)
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "q1": q1, "q3": q3}


def _summarise(group: Group, results: Mapping[str, ContenderResult]) -> None:
    for res in results.values():
        if res.status != "ok" or not res.samples:
            continue
        res.summary = {
            "cpu_s": _spread([s.cpu_s for s in res.samples]),
            "wall_s": _spread([s.wall_s for s in res.samples]),
            "work": statistics.median(s.work for s in res.samples),
            "work_range": [min(s.work for s in res.samples), max(s.work for s in res.samples)],
            "extra": {
                k: _spread([s.extra[k] for s in res.samples if k in s.extra])
                for k in sorted({k for s in res.samples for k in s.extra})
            },
        }
    base = results.get(group.baseline)
    if base is None or base.status != "ok" or not base.samples:
        return
    base_work = base.summary["work"]
    base_by_round = {s.round: s for s in base.samples}
    units = {c.name: float({**group.params, **c.params}.get(group.scale_key, 1)) if group.scale_key else 1.0
             for c in group.contenders}  # fmt: skip
    for res in results.values():
        if res.status != "ok" or not res.samples:
            continue
        s = res.summary
        scale = units[base.name] / units[res.name]  # per unit of work when the amounts differ
        s["ratio_cpu"] = s["cpu_s"]["median"] / base.summary["cpu_s"]["median"] * scale
        s["ratio_wall"] = s["wall_s"]["median"] / base.summary["wall_s"]["median"] * scale
        paired = [x.cpu_s / base_by_round[x.round].cpu_s * scale for x in res.samples if x.round in base_by_round]
        s["ratio_cpu_paired"] = _spread(paired) if paired else None
        worst = max(abs(w - base_work) for w in s["work_range"])
        s["work_diff"] = worst / max(abs(base_work), 1e-12)
        if not math.isfinite(s["work_diff"]) or s["work_diff"] > group.rel_tol:
            res.status = "different work"
            res.note = (
                f"{group.unit} {s['work']:.8g} vs the baseline's {base_work:.8g} "
                f"(relative difference {s['work_diff']:.2e} > tolerance {group.rel_tol:g})"
            )


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def group_to_json(result: GroupResult) -> dict[str, Any]:
    """A JSON-ready dict of a group's result."""
    data = asdict(result)
    return _plain(data)
