"""A fault sweep over what issue 31 changed: ``ember run``, checkpoint folders, the tracking store, YAML.

    PYTHONPATH=src:. python scripts/fault_sweep.py [--only GROUP ...] [--json OUT]

Not a test (it takes minutes and starts hundreds of processes): a measurement, whose counts go in
the issue's report. Every case runs in a fresh process (or launch) with a time limit and is
classified by what the user would see:

``clear``
    one ember error naming the problem (an ``EmberError``; on the command line ``ember: error:``
    and exit 2; for ``ember run`` the documented report and exit code), or, where nothing is
    wrong, the right result;
``traceback``
    a raw Python traceback (an exception that is not ember's);
``hang``
    no answer within the case's time limit;
``silent``
    accepted, or a wrong result, where an error was due;
``data loss``
    a checkpoint, run or file lost or damaged by ember's handling;
``code``
    a hostile payload ran (it writes a marker file).

Groups: ``launch`` (signals to ``ember run`` and its workers at several points), ``checkpoint``
(hostile files in a checkpoint folder, readers ``fit(resume="auto")``, ``ember checkpoint
inspect|export``, ``checkpoint.read``; kill -9 / SIGTERM during a fit), ``store`` (hostile files
in a run folder, readers ``ember runs ls|show|export|compare`` and ``track.load_run``), ``yaml``
(config files and ``config_path``), ``calls`` (public calls changed by the issue, with hostile
arguments).

Each hostile file is one of: ``fifo`` (a named pipe in its place), ``device`` (a link to
``/dev/zero``), ``link-out`` (a link to a copy of the file outside the folder), ``bomb`` (a YAML
alias bomb or JSON nested 100,000 deep, for text files), ``truncated`` (the first half of its
bytes), ``hostile-pickle`` (for checkpoints: a pickle whose load would write the marker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
OUTCOMES = ("clear", "traceback", "hang", "silent", "data loss", "code")


@dataclass
class Result:
    group: str
    name: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Sweep:
    work: Path
    only: set[str] = field(default_factory=set)
    results: list[Result] = field(default_factory=list)

    def add(self, group: str, name: str, outcome: str, detail: str = "", seconds: float = 0.0) -> None:
        assert outcome in OUTCOMES or outcome == "ok", outcome
        result = Result(group, name, "clear" if outcome == "ok" else outcome, detail[:300], seconds)
        self.results.append(result)
        mark = "  " if result.outcome == "clear" else "!!"
        print(f"{mark} {group:<10} {result.outcome:<9} {seconds:5.1f}s  {name}: {detail[:160]}", flush=True)


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    base.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    base.update(extra)
    return base


def run(argv: list[str], cwd: Path, timeout: float, **extra: str) -> tuple[int | None, str, str, float]:
    """(exit code or None when it hung, stdout, stderr, seconds); the process group is killed on a hang."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - started
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, time.monotonic() - started


# --- Python snippets: the case decides clear / silent; the harness sees hangs, tracebacks, markers ---------

SNIPPET = """
import json, sys, traceback
from ember.errors import EmberError
def verdict(outcome, detail=""):
    print("VERDICT " + json.dumps([outcome, str(detail)[:300]]), flush=True)
def refused(call, contains=None):
    try:
        call()
    except EmberError as e:
        ok = contains is None or contains in str(e)
        verdict("clear" if ok else "silent", str(e) if ok else f"unexpected message: {e}")
        return
    verdict("silent", "accepted")
try:
{body}
except EmberError as e:
    verdict("clear", e)
except BaseException as e:
    if isinstance(e, SystemExit) and e.code in (0, None):
        raise
    traceback.print_exc()
    verdict("traceback", f"{type(e).__name__}: {e}")
"""


def python_case(sweep: Sweep, group: str, name: str, body: str, cwd: Path, timeout: float = 60,
                marker: Path | None = None, **extra: str) -> None:  # fmt: skip
    code = SNIPPET.replace("{body}", textwrap.indent(textwrap.dedent(body), "    "))
    rc, out, err, seconds = run([PY, "-c", code], cwd, timeout, **extra)
    verdicts = [json.loads(line[8:]) for line in out.splitlines() if line.startswith("VERDICT ")]
    if marker is not None and marker.exists():
        sweep.add(group, name, "code", "the payload ran", seconds)
    elif rc is None:
        sweep.add(group, name, "hang", f"no answer in {timeout:g} s", seconds)
    elif verdicts:
        outcome, detail = verdicts[-1]
        sweep.add(group, name, outcome, detail, seconds)
    elif "Traceback" in err:
        sweep.add(group, name, "traceback", err.strip().splitlines()[-1], seconds)
    else:
        sweep.add(group, name, "traceback" if rc else "silent", f"rc={rc} {err.strip()[-200:]}", seconds)


def cli_case(sweep: Sweep, group: str, name: str, argv: list[str], cwd: Path, expect: Callable[[int, str, str], str],
             timeout: float = 60, marker: Path | None = None, **extra: str) -> None:  # fmt: skip
    """``python -m ember ARGV``; ``expect(rc, out, err)`` returns the outcome when it did not hang or traceback."""
    rc, out, err, seconds = run([PY, "-m", "ember", *argv], cwd, timeout, **extra)
    if marker is not None and marker.exists():
        sweep.add(group, name, "code", "the payload ran", seconds)
    elif rc is None:
        sweep.add(group, name, "hang", f"no answer in {timeout:g} s", seconds)
    elif "Traceback (most recent call last)" in err:
        sweep.add(group, name, "traceback", err.strip().splitlines()[-1], seconds)
    else:
        outcome = expect(rc, out, err)
        sweep.add(group, name, outcome, f"rc={rc} {(err.strip() or out.strip())[-220:]}", seconds)


def refusal(rc: int, out: str, err: str) -> str:
    """The command refused with one ``ember: error:`` line and exit 2."""
    return "clear" if rc == 2 and err.strip().startswith("ember: error:") else "silent"


# --- hostile files ----------------------------------------------------------------------------

YAML_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
JSON_BOMB = "[" * 100_000 + "]" * 100_000


def make_hostile(path: Path, variant: str, outside: Path, marker: Path) -> None:
    """Replace the file ``path`` by the hostile ``variant`` (its original bytes are kept outside for ``link-out``)."""
    original = path.read_bytes() if path.is_file() else b""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if variant == "fifo":
        os.mkfifo(path)
    elif variant == "device":
        os.symlink("/dev/zero", path)
    elif variant == "link-out":
        outside.mkdir(parents=True, exist_ok=True)
        copy = outside / path.name
        copy.write_bytes(original)
        os.symlink(copy, path)
    elif variant == "bomb":  # a complete line: an append-only file's torn last line is skipped by design
        path.write_text((JSON_BOMB if path.suffix in (".json", ".jsonl") else YAML_BOMB) + "\n")
    elif variant == "truncated":
        path.write_bytes(original[: len(original) // 2])
    elif variant == "hostile-pickle":
        import pickle

        class Payload:
            def __reduce__(self) -> tuple[Any, ...]:
                return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

        import io
        import zipfile

        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:  # torch's zip layout: archive/data.pkl
            z.writestr("archive/data.pkl", pickle.dumps({"meta": Payload()}, protocol=2))
            z.writestr("archive/version", "3\n")
        path.write_bytes(buffer.getvalue())
    else:
        raise ValueError(variant)


# --- setups ---------------------------------------------------------------------------------------


def make_store(home: Path) -> None:
    """Two finished runs (metrics, an image, lineage to an artifact) in ``home``."""
    code = f"""
import numpy as np
from ember import track
for name in ("alpha", "beta"):
    run = track.create_run(name=name, hparams={{"lr": 0.1}}, home={str(home)!r})
    for step in range(5):
        run.log("train", {{"loss": 1.0 / (step + 1)}}, step=step)
    run.log_image("samples", np.zeros((4, 4, 3), np.uint8), step=1)
    art = track.create_artifact(name=name + "-model", home={str(home)!r})
    art.add_reference("s3://bucket/x")
    run.mark_output(art)
    run.finish()
"""
    subprocess.run([PY, "-c", code], env=env(), check=True, capture_output=True)


TRAIN = """
import os, sys, time
import torch
from torch import nn
import ember
from ember.trainer import Trainer, hooks
from tests.models import tiny_dataset, tiny_mlp
torch.set_num_threads(1)
if "RANK" in os.environ:
    ember.launch_from_torch(config={"seed": 0})
model = tiny_mlp(0)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dl = ember.get_dataloader(tiny_dataset(int(os.environ.get("N", "64")), 1), batch_size=8)
engine, dl, *_ = ember.initialize(model, opt, nn.CrossEntropyLoss(), dl)
class Pace(hooks.BaseHook):
    def after_train_iter(self, *a):
        time.sleep(float(os.environ.get("PACE", "0")))
        if self.trainer.cur_step == 3 and os.environ.get("READY"):
            with open(os.environ["READY"] + "." + os.environ.get("RANK", "0"), "w") as f:
                f.write(str(os.getpid()))
hook = hooks.CheckpointHook(sys.argv[1], every_n_steps=int(os.environ.get("EVERY", "4")), every_n_epochs=None,
                            keep_last=int(os.environ.get("KEEP", "3")))
Trainer(engine).fit(dl, epochs=int(os.environ.get("EPOCHS", "2")), hooks=[hook, Pace()], resume="auto")
"""


def make_checkpoints(folder: Path, script: Path) -> None:
    subprocess.run([PY, str(script), str(folder)], env=env(EVERY="2", KEEP="100"), check=True, capture_output=True,
                   cwd=ROOT)  # fmt: skip


# --- groups ---------------------------------------------------------------------------------------


def group_store(sweep: Sweep) -> None:
    base = sweep.work / "store-base"
    make_store(base)
    runs = sorted((base / "runs").iterdir())
    victim_rel = {
        "run.json": "run.json",
        "platform.json": "platform.json",
        "metrics/train.jsonl": "metrics/train.jsonl",
        "lineage.jsonl": "lineage.jsonl",
        "images.jsonl": "images.jsonl",
        "stdout.log": "stdout.log",
        "run folder": "",
    }
    variants = ["fifo", "device", "link-out", "bomb", "truncated"]
    readers = {
        "runs ls": lambda home, name: ["runs", "ls", "--store", str(home)],
        "runs show": lambda home, name: ["runs", "show", "--store", str(home), name],
        "runs export json": lambda home, name: [
            "runs",
            "export",
            "--store",
            str(home),
            name,
            "--format",
            "json",
            "--output",
            str(home.parent / "out.json"),
        ],
        "runs compare": lambda home, name: ["runs", "compare", "--store", str(home), name, runs[1].name],
    }
    for rel_name, rel in victim_rel.items():
        for variant in variants:
            if rel == "" and variant in ("bomb", "truncated"):
                continue  # a folder is not a text file
            case = sweep.work / f"store-{len(sweep.results)}"
            home = case / "store"
            shutil.copytree(base, home, symlinks=True)
            victim = home / "runs" / runs[0].name
            target = victim / rel if rel else victim
            if rel == "":  # the run folder itself: moved outside, a link left in its place
                outside = case / "outside"
                outside.mkdir()
                shutil.move(str(victim), outside / victim.name)
                if variant == "link-out":
                    os.symlink(outside / victim.name, victim)
                elif variant == "fifo":
                    os.mkfifo(victim)
                else:
                    os.symlink("/dev/zero", victim)
            else:
                make_hostile(target, variant, case / "outside", case / "marker")
            for reader, argv in readers.items():

                def expect(rc: int, out: str, err: str, reader: str = reader, rel: str = rel, v: str = variant) -> str:
                    # a torn last line of an append-only file is a write in progress: skipped by design
                    benign = rel in ("stdout.log", "images.jsonl") or (rel.endswith(".jsonl") and v == "truncated")
                    if reader == "runs ls":
                        line = next((x for x in out.splitlines() if x.startswith(runs[0].name)), "")
                        if rel in ("platform.json", "lineage.jsonl", "stdout.log", "images.jsonl"):
                            return "clear" if rc == 0 and line else "silent"  # ls does not read these
                        if rel == "metrics/train.jsonl" and v == "truncated":
                            return "clear" if rc == 0 and line else "silent"
                        return "clear" if rc == 0 and "Damaged" in line else "silent"
                    if reader == "runs show":
                        if benign:
                            return "clear" if rc in (0, 1) else "silent"
                        return "clear" if rc in (1, 2) and ("damage" in out or "error" in err) else "silent"
                    if reader == "runs export json":
                        if (rel in ("stdout.log", "images.jsonl", "lineage.jsonl") or benign) and rc == 0:
                            return "clear"  # not part of the export, read safely, or a torn last line skipped
                        return refusal(rc, out, err)
                    unread = rel in ("platform.json", "lineage.jsonl")  # compare reads run.json and metrics
                    return "clear" if (rc == 0 and "Damaged" in out) or rc == 2 or benign or unread else "silent"

                cli_case(sweep, "store", f"{rel_name} {variant} / {reader}", argv(home, runs[0].name), case, expect,
                         timeout=30, marker=case / "marker")  # fmt: skip
            python_case(sweep, "store", f"{rel_name} {variant} / track.load_run", f"""
                from ember import track
                run = track.load_run({str(victim)!r})
                run.images(); run.lineage()
                lazy = ("stdout.log", "lineage.jsonl", "platform.json", "metrics/train.jsonl")  # read when asked
                torn = {rel!r} == "images.jsonl" and {variant!r} == "truncated"  # a write in progress
                verdict("clear" if {rel!r} in lazy or torn else "silent", "loaded")
            """, case, timeout=30)  # fmt: skip
            originals_intact = all((home / "runs" / r.name / "run.json").is_file() for r in runs[1:])
            if not originals_intact:
                sweep.add("store", f"{rel_name} {variant} / other runs", "data loss", "another run's run.json is gone")


def group_yaml(sweep: Sweep) -> None:
    case = sweep.work / "yaml"
    case.mkdir()
    files = {
        "bomb.yaml": YAML_BOMB,
        "deep.json": JSON_BOMB,
        "deep.yaml": "[" * 100_000 + "]" * 100_000,
        "truncated.yaml": "name: x\nhparams: {lr: [1, 2",
        "python.yaml": "x: !!python/object/apply:os.system ['touch " + str(case / "marker") + "']\n",
        "bigint.yaml": "x: " + "9" * 5000 + "\n",
    }
    for name, text in files.items():
        (case / name).write_text(text)
    os.mkfifo(case / "fifo.yaml")
    os.symlink("/dev/zero", case / "zero.yaml")
    (case / "dir.yaml").mkdir()
    targets = [*files, "fifo.yaml", "zero.yaml", "dir.yaml", "missing.yaml"]
    for target in targets:
        path = case / target
        python_case(sweep, "yaml", f"load_config({target})", f"""
            import ember.config
            refused(lambda: ember.config.load_config({str(path)!r}))
        """, case, timeout=30, marker=case / "marker")  # fmt: skip
        if target.endswith(".yaml"):
            for call in ("track.create_run", "em.create_run"):
                python_case(sweep, "yaml", f"{call}(config_path={target})", f"""
                    from ember import track
                    from ember.compat.t9k import em
                    refused(lambda: {call}(config_path={str(path)!r}))
                """, case, timeout=30, marker=case / "marker", EMBER_HOME=str(case / "store"))  # fmt: skip


def group_checkpoint(sweep: Sweep) -> None:
    script = sweep.work / "train.py"
    script.write_text(TRAIN)
    base = sweep.work / "ckpt-base"
    make_checkpoints(base, script)
    names = sorted(p.name for p in base.glob("ckpt-*.ckpt"))
    newest = names[-1]
    variants = ["fifo", "device", "link-out", "truncated", "hostile-pickle"]
    for victim in (newest, "last_checkpoint"):
        for variant in variants:
            if victim == "last_checkpoint" and variant == "hostile-pickle":
                continue
            case = sweep.work / f"ckpt-{len(sweep.results)}"
            folder = case / "ckpt"
            shutil.copytree(base, folder, symlinks=True)
            marker = case / "marker"
            make_hostile(folder / victim, variant, case / "outside", marker)
            # the readers first: the fit below sets the damaged file aside and saves a new one there
            for argv in (["checkpoint", "inspect", str(folder / victim)],
                         ["checkpoint", "export", str(folder / victim), str(case / "model.pt")]):  # fmt: skip
                if victim == "last_checkpoint":
                    continue

                def expect(rc: int, out: str, err: str, variant: str = variant) -> str:
                    if variant == "link-out":
                        return "clear" if rc == 0 else refusal(rc, out, err)
                    if any(a in err for a in ("weights_only=False", "set to `False`", "safe_globals", "allowlist")):
                        return "silent"  # torch's advice to load unsafely repeated
                    return refusal(rc, out, err)

                cli_case(sweep, "checkpoint", f"{victim} {variant} / ember {' '.join(argv[:2])}", argv, case, expect,
                         timeout=60, marker=marker)  # fmt: skip
            before = sorted(p.name for p in folder.iterdir())
            rc, out, err, seconds = run([PY, str(script), str(folder)], ROOT, 120, EVERY="2", KEEP="100")
            name = f"{victim} {variant} / fit(resume='auto')"
            if marker.exists():
                sweep.add("checkpoint", name, "code", "the payload ran", seconds)
            elif rc is None:
                sweep.add("checkpoint", name, "hang", "", seconds)
            elif "Traceback" in err and "EmberError" not in err and "CheckpointError" not in err:
                sweep.add("checkpoint", name, "traceback", err.strip().splitlines()[-1], seconds)
            else:
                kept = [n for n in names if n != victim]
                lost = [n for n in kept if not (folder / n).exists() and n in before]
                after = sorted(p.name for p in folder.iterdir())
                if lost and variant != "link-out":
                    # retention may prune old ones (keep_last=100 here: nothing should go)
                    sweep.add("checkpoint", name, "data loss", f"gone: {lost}", seconds)
                elif rc == 0 and variant in ("link-out",) and victim == newest:
                    sweep.add("checkpoint", name, "clear", "a link to a good checkpoint in the user's folder is read",
                              seconds)  # fmt: skip
                elif rc == 0:
                    aside = [n for n in after if n.endswith(".damaged")]
                    sweep.add("checkpoint", name, "clear", f"resumed past it; set aside: {aside}", seconds)
                else:
                    last = (err.strip() or out.strip()).splitlines()[-1] if (err.strip() or out.strip()) else ""
                    outcome = "clear" if "CheckpointError" in err or "ember" in last else "silent"
                    sweep.add("checkpoint", name, outcome, f"rc={rc} {last[-200:]}", seconds)
    # the folder itself: a link to the real one (accepted), a file, a FIFO; the lock file hostile
    for what in ("folder a link", "folder a file", "lock file a fifo", "lock file a link to /dev/zero"):
        case = sweep.work / f"ckpt-{len(sweep.results)}"
        case.mkdir()
        folder = case / "ckpt"
        if what == "folder a link":
            shutil.copytree(base, case / "real")
            os.symlink(case / "real", folder)
        elif what == "folder a file":
            folder.write_text("not a folder")
        else:
            shutil.copytree(base, folder)
            if "fifo" in what:
                os.mkfifo(folder / ".lock")
            else:
                os.symlink("/dev/zero", folder / ".lock")
        rc, out, err, seconds = run([PY, str(script), str(folder)], ROOT, 120, EVERY="2", KEEP="100")
        if rc is None:
            sweep.add("checkpoint", what, "hang", "", seconds)
        elif "Traceback" in err and "CheckpointError" not in err:
            sweep.add("checkpoint", what, "traceback", err.strip().splitlines()[-1], seconds)
        elif what == "folder a file":
            sweep.add("checkpoint", what, "clear" if rc != 0 and "CheckpointError" in err else "silent",
                      err.strip().splitlines()[-1] if err.strip() else "", seconds)  # fmt: skip
        else:
            sweep.add("checkpoint", what, "clear" if rc == 0 else "silent",
                      (err.strip().splitlines() or [""])[-1], seconds)  # fmt: skip
    # two live trainers on one folder
    case = sweep.work / "two-trainers"
    case.mkdir()
    first = subprocess.Popen([PY, str(script), str(case / "ckpt")], cwd=ROOT, env=env(PACE="0.3", EPOCHS="100"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (case / "ckpt" / ".lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    rc, out, err, seconds = run([PY, str(script), str(case / "ckpt")], ROOT, 120)
    first_alive = first.poll() is None
    first.send_signal(signal.SIGTERM)  # a preemption: it saves and exits with 75
    first.communicate(timeout=180)
    refused = rc != 0 and "is being written by another trainer" in err and f"pid {first.pid}" in err
    sweep.add("checkpoint", "a second live trainer on the folder", "clear" if refused and first_alive else "silent",
              (err.strip().splitlines() or [""])[-1], seconds)  # fmt: skip
    sweep.add("checkpoint", "the first trainer after that", "clear" if first.returncode == 75 else "data loss",
              f"rc={first.returncode}")  # fmt: skip
    # kill -9 / SIGTERM a single-process fit at several points, then resume: no loss, no crash loop
    for sig in (signal.SIGKILL, signal.SIGTERM):
        for after_s in (0.5, 1.5, 3.0):
            case = sweep.work / f"kill-{len(sweep.results)}"
            case.mkdir()
            proc = subprocess.Popen([PY, str(script), str(case / "ckpt")], cwd=ROOT, env=env(PACE="0.05", EPOCHS="20"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            deadline = time.monotonic() + 60
            while not list((case / "ckpt").glob("ckpt-*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(after_s)
            proc.send_signal(sig)
            _, err1 = proc.communicate(timeout=120)
            rc, out, err, seconds = run([PY, str(script), str(case / "ckpt")], ROOT, 180, EPOCHS="20")
            name = f"{signal.Signals(sig).name} {after_s:g} s after the first save, then resume"
            expected_first = -signal.SIGKILL if sig == signal.SIGKILL else 75
            if rc is None:
                sweep.add("checkpoint", name, "hang", "", seconds)
            elif proc.returncode != expected_first:
                sweep.add("checkpoint", name, "silent", f"the killed fit exited {proc.returncode}: {err1[-200:]}")
            elif rc != 0:
                sweep.add("checkpoint", name, "data loss", (err.strip().splitlines() or [""])[-1], seconds)
            else:
                sweep.add("checkpoint", name, "clear", "resumed and finished", seconds)


LAUNCH_WORKER = """
import os, signal, sys, time
import torch, torch.distributed as dist
mode, rank = sys.argv[1], os.environ["RANK"]
if mode in ("kill", "segv", "raise", "allreduce-hang"):
    dist.init_process_group("gloo")
    if rank == "1" and mode in ("kill", "segv"):
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSEGV)
    if rank == "0" and mode == "raise":
        time.sleep(0.5)
        raise ValueError("boom")
    dist.all_reduce(torch.ones(1))
    if mode == "allreduce-hang" and rank == "1":
        dist.all_reduce(torch.ones(1))  # rank 0 has left: an error, or a wait
    sys.exit(0)
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "hang" and rank == "0":
    sys.exit(0)
if mode == "exit3" and rank == "1":
    time.sleep(0.5)
    sys.exit(3)
with open(os.environ["READY"] + "." + rank, "w") as f:
    f.write(str(os.getpid()))
time.sleep(60)
"""


def worker_pids(ready_base: Path) -> list[int]:
    """The pids the workers of one launch wrote into their READY files."""
    pids = []
    for path in ready_base.parent.glob(ready_base.name + ".*"):
        text = path.read_text().strip()
        if text.isdigit():
            pids.append(int(text))
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def group_launch(sweep: Sweep) -> None:
    case = sweep.work / "launch"
    case.mkdir()
    worker = case / "worker.py"
    worker.write_text(LAUNCH_WORKER)
    train = case / "train.py"
    train.write_text(TRAIN)

    def ember_run(args: list[str], name: str, expect: Callable[[int, str], str], signals: list[tuple[float, int]] = (),
                  ready: int = 0, extra: dict[str, str] | None = None, timeout: float = 120) -> None:  # fmt: skip
        ready_base = case / f"ready-{len(sweep.results)}"
        started = time.monotonic()
        launch_env = env(READY=str(ready_base), **(extra or {}))
        proc = subprocess.Popen([PY, "-m", "ember", "run", *args], cwd=ROOT, env=launch_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 90
        while ready and len(list(case.glob(ready_base.name + ".*"))) < ready and time.monotonic() < deadline:
            time.sleep(0.05)
        for delay, sig in signals:
            time.sleep(delay)
            proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in worker_pids(ready_base):  # in sessions of their own: by the pids they wrote
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            sweep.add("launch", name, "hang", "", time.monotonic() - started)
            return
        seconds = time.monotonic() - started
        if "Traceback" in out and "SignalException" in out:
            sweep.add("launch", name, "traceback", "SignalException", seconds)
            return
        last = (out.strip().splitlines() or [""])[-1]
        sweep.add("launch", name, expect(proc.returncode, out), f"rc={proc.returncode} {last[-220:]}", seconds)

    two = ["--nproc", "2"]
    ember_run([*two, str(train), str(case / "ck1")], "SIGTERM to ember run during fit",
              lambda rc, out: "clear" if rc == 75 and "saved a checkpoint and exited with 75" in out else "silent",
              [(0.5, signal.SIGTERM)], ready=2, extra={"PACE": "0.05", "EPOCHS": "50", "N": "640"})  # fmt: skip
    ember_run([*two, str(train), str(case / "ck2")], "SIGINT to ember run during fit",
              lambda rc, out: "clear" if rc == 75 else "silent",
              [(0.5, signal.SIGINT)], ready=2, extra={"PACE": "0.05", "EPOCHS": "50", "N": "640"})  # fmt: skip
    ember_run([*two, str(train), str(case / "ck3")], "SIGTERM twice, 0.3 s apart",
              lambda rc, out: "clear" if rc == 75 else "silent",
              [(0.5, signal.SIGTERM), (0.3, signal.SIGTERM)], ready=2,
              extra={"PACE": "0.05", "EPOCHS": "50", "N": "640"})  # fmt: skip
    ember_run([*two, str(train), str(case / "ck4")], "SIGKILL to ember run: the workers save and stop",
              lambda rc, out: "clear" if rc == -9 else "silent",
              [(0.5, signal.SIGKILL)], ready=2, extra={"PACE": "0.05", "EPOCHS": "50", "N": "640"})  # fmt: skip
    time.sleep(8)
    orphans = [pid for pid in worker_pids(case / f"ready-{len(sweep.results) - 1}") if alive(pid)]
    saved = list((case / "ck4").glob("ckpt-*"))
    sweep.add("launch", "after SIGKILL to ember run: orphaned workers", "silent" if orphans else "clear",
              f"orphans {orphans}, checkpoints {len(saved)}")  # fmt: skip
    ember_run([*two, str(worker), "plain"], "SIGTERM to ember run, workers without a CheckpointHook",
              lambda rc, out: "clear" if rc == 143 and "ended by SIGTERM without saving" in out else "silent",
              [(0.2, signal.SIGTERM)], ready=2)  # fmt: skip
    ember_run([*two, "--shutdown-timeout", "1", str(worker), "ignore"], "SIGTERM, workers ignore it",
              lambda rc, out: "clear" if rc == 143 and "killed with SIGKILL" in out else "silent",
              [(0.2, signal.SIGTERM)], ready=2)  # fmt: skip
    ember_run([*two, str(worker), "plain"], "SIGTERM before the workers start",
              lambda rc, out: "clear" if rc == -15 or (rc == 143 and "ember run:" in out) else "silent",
              [(0.3, signal.SIGTERM)])  # fmt: skip
    ember_run(
        [*two, str(worker), "kill"],
        "rank 1 SIGKILLed while rank 0 waits in all_reduce",
        lambda rc, out: "clear" if rc == 137 and "rank 1 (local rank 1" in out.splitlines()[-1] else "silent",
    )
    ember_run(
        [*two, str(worker), "segv"],
        "rank 1 SIGSEGV while rank 0 waits in all_reduce",
        lambda rc, out: "clear" if rc == 139 and "rank 1 (local rank 1" in out else "silent",
    )
    for attempt in range(3):
        ember_run(
            [*two, str(worker), "raise"],
            f"rank 0 raises while rank 1 waits in all_reduce (#{attempt + 1})",
            lambda rc, out: "clear" if rc == 1 and "ember run: rank 0 (local rank 0" in out else "silent",
        )
    ember_run(
        [*two, str(worker), "exit3"],
        "rank 1 sys.exit(3)",
        lambda rc, out: "clear" if rc == 3 and "rank 1 (local rank 1" in out else "silent",
    )
    ember_run(
        [*two, "--finish-timeout", "1", str(worker), "hang"],
        "a rank that never ends, --finish-timeout 1",
        lambda rc, out: "clear" if rc == 124 and "rank 1" in out.splitlines()[-1] else "silent",
    )
    ember_run(
        [*two, str(worker), "allreduce-hang"],
        "rank 1 in a collective rank 0 left",
        lambda rc, out: "clear" if rc in (0, 1) else "silent",
        timeout=120,
    )
    for bad in (["--shutdown-timeout", "-1"], ["--shutdown-timeout", "x"], ["--finish-timeout", "0"],
                ["--finish-timeout", "nan"], ["--finish-timeout", "inf"], ["--finish-timeout", "-3"]):  # fmt: skip
        cli_case(sweep, "launch", f"ember run {' '.join(bad)}", ["run", *bad, str(worker), "plain"], case,
                 lambda rc, out, err: "clear" if rc == 2 and "error" in err and "Traceback" not in err else "silent",
                 timeout=30)  # fmt: skip


def group_calls(sweep: Sweep) -> None:
    case = sweep.work / "calls"
    case.mkdir()
    os.mkfifo(case / "fifo")
    (case / "dir").mkdir()
    (case / "dir" / "a.txt").write_text("a")
    os.mkfifo(case / "dir" / "pipe")
    home = str(case / "store")
    calls = {
        "log_image('/dev/zero')": "run.log_image('x', '/dev/zero', step=0)",
        "log_image(FIFO)": f"run.log_image('x', {str(case / 'fifo')!r}, step=0)",
        "log_image(missing)": "run.log_image('x', 'missing.png', step=0)",
        "log_image(folder)": f"run.log_image('x', {str(case)!r}, step=0)",
        "log_image(None)": "run.log_image('x', None, step=0)",
        "log_image(object())": "run.log_image('x', object(), step=0)",
        "log_image(str tensor-like '')": "run.log_image('x', '', step=0)",
        "log_image(complex tensor)": "run.log_image('x', torch.rand(4, 4, dtype=torch.complex64), step=0)",
        "log_image(int64 tensor)": "run.log_image('x', torch.ones(4, 4, dtype=torch.int64), step=0)",
        "log_image(meta tensor)": "run.log_image('x', torch.empty(4, 4, device='meta'), step=0)",
        "log_image(0-d tensor)": "run.log_image('x', torch.tensor(0.5), step=0)",
        "log_image(5-d tensor)": "run.log_image('x', torch.rand(1, 1, 3, 4, 4), step=0)",
        "log_image(NaN)": "run.log_image('x', torch.full((4, 4), float('nan')), step=0)",
        "log_image(step=-1)": "run.log_image('x', torch.rand(4, 4), step=-1)",
        "log_image(name='../x')": "run.log_image('../x', torch.rand(4, 4), step=0)",
        "add_dir(folder with a FIFO)": f"track.create_artifact('a', home={home!r}).add_dir({str(case / 'dir')!r})",
        "add_dir(a file)": f"track.create_artifact('a', home={home!r}).add_dir({str(case / 'dir' / 'a.txt')!r})",
        "add_file(FIFO)": f"track.create_artifact('a', home={home!r}).add_file({str(case / 'fifo')!r})",
        "add_file('/dev/zero')": f"track.create_artifact('a', home={home!r}).add_file('/dev/zero')",
        "create_run(conflict_strategy='bogus')": f"track.create_run(conflict_strategy='bogus', home={home!r})",
        "create_run(conflict_strategy=None)": f"track.create_run(conflict_strategy=None, home={home!r})",
        "create_run(auto_upload='yes')": f"track.create_run(auto_upload='yes', home={home!r})",
        "create_run(config_path=3)": f"track.create_run(config_path=3, home={home!r})",
        "create_run(config_path=folder)": f"track.create_run(config_path={str(case)!r}, home={home!r})",
        "em.create_run(conflict_strategy='bogus')": "em.create_run(conflict_strategy='bogus')",
        "checkpoint.folder.lock(a file)": f"folder.lock({str(case / 'dir' / 'a.txt')!r})",
        "checkpoint.folder.lock(missing)": f"folder.lock({str(case / 'nope')!r})",
        "CheckpointHook(dir=a file).fit": (f"Trainer(make_engine()).fit(loader(16), epochs=1, "
                                           f"hooks=[hooks.CheckpointHook({str(case / 'dir' / 'a.txt')!r})])"),
        "read_yaml(FIFO)": f"read_yaml({str(case / 'fifo')!r}, 'x')",
        "load_yaml(bomb)": f"load_yaml({YAML_BOMB!r}, 'x')",
        "checkpoint.read(FIFO)": f"checkpoint.read({str(case / 'fifo')!r})",
        "checkpoint.read('/dev/zero')": "checkpoint.read('/dev/zero')",
    }  # fmt: skip
    prelude = f"""
        import torch
        from ember import track, checkpoint
        from ember.checkpoint import folder
        from ember.compat.t9k import em
        from ember.config.sources import load_yaml, read_yaml
        from ember.trainer import Trainer, hooks
        from tests.trainer.helpers import loader, make_engine
        run = track.create_run(name="calls", home={home!r})
    """
    prelude = textwrap.dedent(prelude)
    for name, call in calls.items():
        body = prelude + f"refused(lambda: {call})\nrun.finish()\n"
        python_case(sweep, "calls", name, body, case, timeout=60)
    python_case(sweep, "calls", "log_image(bfloat16/float8 tensors)", prelude + textwrap.dedent("""
        dtypes = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float64)
        for step, dtype in enumerate(dtypes):
            run.log_image("x", torch.rand(3, 4, 4).to(dtype), step=step)
        verdict("clear" if len(run.images()) == 5 else "silent", f"{len(run.images())} stored")
        run.finish()
    """), case, timeout=60)  # fmt: skip
    limited = {
        "log_image under ulimit -f": (16384, "run.log_image('n', noise, step=0)"),
        "checkpoint.save under ulimit -f": (1024, "checkpoint.save('big.ckpt', Trainer(make_engine()))"),
        "run.log under ulimit -f (error at finish)": (16384, "log_more()"),
    }
    for limit_name, (limit, call) in limited.items():
        body = prelude + textwrap.dedent(f"""
            import resource, numpy as np
            noise = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
            for i in range(3000):
                run.log("train", {{"loss": 1.0 / (i + 1), "acc": i / 3000}}, step=i)
            run.flush()
            def log_more():
                for i in range(3000, 30000):
                    run.log("train", {{"loss": 1.0}}, step=i)
                run.finish()
            resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
            refused(lambda: {call})
        """)  # fmt: skip
        python_case(sweep, "calls", limit_name, body, case, timeout=60)
    python_case(sweep, "calls", "runs export under ulimit -f", prelude + textwrap.dedent(f"""
        import resource
        from ember.cli import main as ember_main
        for i in range(3000):
            run.log("train", {{"loss": 1.0 / (i + 1), "acc": i / 3000}}, step=i)
        run.finish()
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.RLIM_INFINITY))
        code = ember_main(["runs", "export", "--store", {home!r}, run.name, "--format", "csv", "--output", "o.csv"])
        verdict("clear" if code == 2 else "silent", f"exit {{code}}")
    """), case, timeout=60)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="groups: launch checkpoint store yaml calls")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ember-sweep-"))
    sweep = Sweep(work, set(args.only))
    groups = {"yaml": group_yaml, "calls": group_calls, "store": group_store, "checkpoint": group_checkpoint,
              "launch": group_launch}  # fmt: skip
    try:
        for name, group in groups.items():
            if not sweep.only or name in sweep.only:
                group(sweep)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    counts = Counter(r.outcome for r in sweep.results)
    per_group: dict[str, Counter[str]] = {}
    for r in sweep.results:
        per_group.setdefault(r.group, Counter())[r.outcome] += 1
    print(f"\ntried {len(sweep.results)}: " + ", ".join(f"{o} {counts.get(o, 0)}" for o in OUTCOMES))
    for group, c in per_group.items():
        print(f"  {group:<10} {sum(c.values()):>4}: " + ", ".join(f"{o} {c.get(o, 0)}" for o in OUTCOMES))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in sweep.results], indent=1))
    return 0 if counts.get("clear", 0) == len(sweep.results) else 1


if __name__ == "__main__":
    sys.exit(main())
