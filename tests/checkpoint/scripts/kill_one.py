"""Kill-and-resume scenarios in one process: SIGKILL (and a second SIGTERM) at chosen points.

Usage: ``python kill_one.py OUT [SCENARIO...]``. Torch is imported once; each training run is a
forked child, so a SIGKILL ends only that run. For each scenario, the first run is killed, the
second resumes from the same directory with ``resume="auto"`` and writes its parameters and
losses to ``OUT/<scenario>``; ``OUT/summary.json`` says how each first run ended and what its
directory held afterwards. ``OUT/ref`` is the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

from tests.checkpoint import common  # noqa: E402

from ember.trainer import _preempt  # noqa: E402


def in_child(fn: Callable[[], Any]) -> dict[str, int]:
    """Run ``fn`` in a forked process; how it ended: ``{"signal": n}`` or ``{"exit": code}``."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported through the exit code
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.WEXITSTATUS(status)}


def die_before_pointer(step: int) -> None:
    """SIGKILL this process after step ``step``'s checkpoint is in place, before the pointer names it."""
    from ember.checkpoint import checkpointer as module

    real = module.write_pointer

    def write_pointer(directory: Any, name: str, *args: Any) -> None:
        if name.endswith(f"-s{step:09d}.ckpt"):
            os.kill(os.getpid(), signal.SIGKILL)
        real(directory, name, *args)

    module.write_pointer = write_pointer  # type: ignore[assignment]


def second_sigterm() -> None:
    """SIGTERM at batch 12, again at batch 13 (before the update's safe point): exit at once."""
    _preempt.REPEAT_WINDOW_S = 0.0
    trainer, train, test = common.build(deterministic=True)
    ckpt = common.hooks.CheckpointHook(OUT / "second-signal" / "ckpt", every_n_steps=2)
    extra = [common.Killer(12, signal.SIGTERM), common.Killer(13, signal.SIGTERM)]
    extra[1]._explicit_name = "Killer2"
    trainer.fit(train, epochs=3, test_dataloader=test, hooks=common.hook_list(trainer, ckpt, extra))


SCENARIOS: dict[str, dict[str, Any]] = {
    "mid-epoch-mid-cycle": {"kill_at": 12},  # epoch 1, the first batch of an accumulation cycle
    "after-an-update-before-its-save": {"kill_at": 15},  # update 8 done, every_n_steps=2 not saved yet
    "before-any-checkpoint": {"kill_at": 3},
    "writing-a-checkpoint": {"rename_step": 10},  # the end-of-epoch-1 checkpoint, before its rename
    "before-the-pointer-update": {"pointer_step": 12},
    "async-save-mid-cycle": {"kill_at": 21, "async_save": True},
}


def scenario(name: str, kill_at: int | None = None, rename_step: int | None = None,
             pointer_step: int | None = None, async_save: bool = False) -> dict[str, Any]:  # fmt: skip
    ckpt = OUT / name / "ckpt"

    def first() -> None:
        if rename_step is not None:
            common.die_renaming(rename_step)
        if pointer_step is not None:
            die_before_pointer(pointer_step)
        common.run(ckpt, kill_at=kill_at, async_save=async_save, deterministic=True)

    ended = in_child(first)
    listing = sorted(os.listdir(ckpt)) if ckpt.is_dir() else []
    pointer = (ckpt / "last_checkpoint").read_text().strip() if (ckpt / "last_checkpoint").is_file() else None
    resumed = in_child(lambda: common.run(ckpt, OUT / name, async_save=async_save, deterministic=True))
    return {"first": ended, "listing": listing, "pointer": pointer, "second": resumed}


if __name__ == "__main__":
    OUT = Path(sys.argv[1])
    common.build()  # import what is imported lazily (torch._dynamo, ~5 s) once, before forking
    chosen = sys.argv[2:] or [*SCENARIOS, "second-signal"]
    summary: dict[str, Any] = {
        "ref": in_child(lambda: common.run(OUT / "ref" / "ckpt", OUT / "ref", deterministic=True))
    }
    for name in chosen:
        if name == "second-signal":
            ended = in_child(second_sigterm)
            summary[name] = {"first": ended, "listing": sorted(os.listdir(OUT / name / "ckpt"))}
        else:
            summary[name] = scenario(name, **SCENARIOS[name])
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
