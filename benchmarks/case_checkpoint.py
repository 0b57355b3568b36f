"""Case 3, checkpoints: a ~100 MB training state (model + Adam) saved and loaded.

The model is a wide MLP (784 → 1850 → 1850 → 1850 → 10, 8.3M parameters) after one Adam step,
so the state is parameters plus two Adam moments: ~100 MB. Throughput is that state's tensor
bytes over the wall time of the call.

* save: five saves per run, each to a new file and flushed to disk outside the timer before
  the next (so none pays for another's write-back); ``torch.save({"model", "optimizer"})``
  (page cache only, as torch does by default),
  the same followed by ``fsync`` (the durability ember's atomic writer buys), and
  ``ember.checkpoint.save(path, trainer)`` (temp file, fsync, rename; plus counters, history,
  RNG states), by default (zip records with CRC-32s: the file passes ``unzip -t``) and with
  ``skip_zip_crc=True`` (no CRC-32s: faster; ``torch.load`` never checks them).
* load: ``torch.load`` + ``load_state_dict`` on model and optimizer, vs
  ``ember.checkpoint.load(path, trainer)``. The file was just written, so it is read from the
  page cache (dropping caches would disturb the other users of this machine).
* stall: the same model trained 33 steps with a ``CheckpointHook`` saving every 10 steps
  (about 1 s apart, longer than a write takes; the last save is followed by three steps),
  synchronously, with ``async_save=True``, and with ``background_copy=True`` too, vs no
  checkpoints. The stall per save is the time the training thread waited for the hook
  (``CheckpointHook.stall_s``: the write itself when synchronous; with ``async_save`` the
  copies made at once plus any wait, before the next optimizer step or hook, for the part
  copied in the background), per save; the wait for the last background write at the end of
  ``fit`` is reported apart as the drain. The fit's own time shows what the background work
  costs the loop besides (on 2 cores it competes with training).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.harness import Contender, Group, Outcome, Skipped, Timer
from benchmarks.workloads import make_batches, wide_mlp

M = "benchmarks.case_checkpoint"
MB = 1e6


class _Setup:
    """The model, Adam, a Trainer and the batches, after ``warm`` optimizer steps."""

    def __init__(self, params: Mapping[str, Any], warm: int = 1) -> None:
        import ember
        from ember.trainer import Trainer

        torch.manual_seed(int(params.get("seed", 0)))
        self.model = wide_mlp(int(params["hidden"]))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.batches = make_batches((1, 28, 28), int(params.get("batches", 4)), 64, 10, 0)
        engine, _, _, _ = ember.initialize(self.model, self.optimizer, nn.CrossEntropyLoss())
        self.trainer = Trainer(engine=engine, logger=ember.get_dist_logger())
        if warm:
            self.trainer.fit(self.batches[:warm], epochs=1, hooks=[])

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def state_bytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        for s in self.optimizer.state.values():
            n += sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))
        return n

    @torch.no_grad()
    def fingerprint(self) -> float:
        """A number that changes with every parameter and Adam moment (proves what was loaded)."""
        total = sum(float(p.double().sum()) for p in self.model.parameters())
        for s in self.optimizer.state.values():
            total += float(s["exp_avg_sq"].double().sum()) * 1e3
        return total


def _checkpoint_module() -> Any:
    try:
        from ember import checkpoint
    except ImportError as exc:
        raise Skipped(f"ember.checkpoint is not available yet ({exc})") from exc
    if not hasattr(checkpoint, "save"):
        raise Skipped("ember.checkpoint has no save() yet")
    return checkpoint


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``params["how"]``: torch, torch+fsync, ember or ember-nocrc; ``params["saves"]`` saves, each timed.

    Each save writes a new file. After each one, outside the timer, the file is flushed to
    disk and deleted: a save that leaves dirty pages in the page cache (plain ``torch.save``)
    would otherwise have the kernel write them back during the next contender's timed save.
    """
    how = str(params["how"])
    ckpt = _checkpoint_module() if how.startswith("ember") else None
    s = _Setup(params)
    saves, file_mb = int(params.get("saves", 1)), 0.0
    for i in range(saves):
        path = Path.cwd() / f"state-{i}.ckpt"
        with timer:
            if ckpt is not None:
                ckpt.save(path, s.trainer, skip_zip_crc=how == "ember-nocrc")
            else:
                torch.save(s.state(), path)
                if how == "torch+fsync":
                    _fsync(path)
        file_mb = path.stat().st_size / MB
        _fsync(path)
        path.unlink()
    mb = s.state_bytes() / MB
    return Outcome(work=round(mb, 1), extra={"MB_per_s": mb * saves / timer.wall_s, "file_MB": file_mb})


def load(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """``params["how"]``: torch or ember; the file is written (untimed) by the same library."""
    how = str(params["how"])
    ckpt = _checkpoint_module() if how == "ember" else None
    writer = _Setup(params)
    path = Path.cwd() / "state.ckpt"
    if ckpt is not None:
        ckpt.save(path, writer.trainer)
    else:
        torch.save(writer.state(), path)
    expected = writer.fingerprint()
    reader = _Setup({**params, "seed": 1}, warm=1)  # other weights, Adam state of the same shape
    with timer:
        if ckpt is not None:
            ckpt.load(path, reader.trainer)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            reader.model.load_state_dict(state["model"])
            reader.optimizer.load_state_dict(state["optimizer"])
    mb = writer.state_bytes() / MB
    return Outcome(work=reader.fingerprint() / expected, extra={"MB_per_s": mb / timer.wall_s})


def stall(params: Mapping[str, Any], timer: Timer) -> Outcome:
    """Train ``steps`` steps; ``params["how"]``: none, sync, async or async+background checkpoints
    every ``every`` steps.

    Besides the fit's time: the stall per save, the time the training thread waited for the
    hook's saves (``CheckpointHook.stall_s``: the synchronous writes; with ``async_save`` the
    copies to CPU memory made at once, and the waits before the next optimizer step or hook
    event for the copies made in the background), and the wait for the last background write
    at the end of ``fit`` (the drain, timed around the hook's ``after_train``).
    """
    from ember.trainer import hooks

    how = str(params["how"])
    if how != "none":
        _checkpoint_module()
    s = _Setup(params, warm=0)
    directory = Path.cwd() / "ckpt"
    chosen = []
    drain = {"after_train": 0.0}
    hook = None
    if how != "none":
        hook = hooks.CheckpointHook(directory, every_n_steps=int(params["every"]), every_n_epochs=None,
                                    keep_last=None, save_last=False, async_save=how.startswith("async"),
                                    background_copy=how == "async+background")  # fmt: skip
        _time_method(hook, "after_train", drain)
        chosen.append(hook)
    steps = int(params["steps"])
    data = [s.batches[i % len(s.batches)] for i in range(steps)]
    with timer:
        s.trainer.fit(data, epochs=1, hooks=chosen)
    saves = len(list(directory.glob("*.ckpt"))) if directory.exists() else 0
    probe = s.batches[0]
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(s.model(probe[0]), probe[1]))
    extra = {"saves": saves, "ms_per_step": timer.wall_s / steps * 1e3}
    if saves and hook is not None:
        extra["stall_ms_per_save"] = hook.stall_s / saves * 1e3
        extra["drain_ms"] = drain["after_train"] * 1e3
    return Outcome(work=loss, extra=extra)


def _time_method(obj: Any, name: str, spent: dict[str, float]) -> None:
    """Wrap ``obj.name`` so that the wall time spent in it adds up in ``spent[name]``."""
    method = getattr(obj, name)

    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return method(*args)
        finally:
            spent[name] += time.perf_counter() - t0

    setattr(obj, name, timed)


def groups(quick: bool = False, with_peers: bool = True) -> list[Group]:
    """Save, load and the save stall of a ~100 MB state (a tiny one with ``quick``)."""
    base: dict[str, Any] = {"hidden": 64 if quick else 1850, "seed": 0}
    save_params = {**base, "saves": 1 if quick else 5}  # disk timings vary: five saves per run
    # 33 steps: the last save (step 30) is followed by training, as saves are; one on the very last
    # step could only wait for its copy at once, which is part of the end-of-fit drain.
    stall_params = {**base, "steps": 5 if quick else 33, "every": 2 if quick else 10}
    return [
        Group("save ~100 MB (model + Adam)", (
            Contender("torch.save", f"{M}:save", params={"how": "torch"}),
            Contender("torch.save + fsync", f"{M}:save", params={"how": "torch+fsync"}),
            Contender("ember checkpoint.save", f"{M}:save", params={"how": "ember"}),
            Contender("ember checkpoint.save (skip_zip_crc)", f"{M}:save", params={"how": "ember-nocrc"}),
        ), "torch.save", save_params, rel_tol=0.0, unit="state MB"),
        Group("load ~100 MB (model + Adam)", (
            Contender("torch.load + load_state_dict", f"{M}:load", params={"how": "torch"}),
            Contender("ember checkpoint.load", f"{M}:load", params={"how": "ember"}),
        ), "torch.load + load_state_dict", base, rel_tol=1e-9, unit="restored/expected"),
        Group("training stall per save", (
            Contender("no checkpoints", f"{M}:stall", params={"how": "none"}),
            Contender("CheckpointHook (sync)", f"{M}:stall", params={"how": "sync"}),
            Contender("CheckpointHook (async_save)", f"{M}:stall", params={"how": "async"}),
            Contender("CheckpointHook (async_save, background_copy)", f"{M}:stall", params={"how": "async+background"}),
        ), "no checkpoints", stall_params, rel_tol=1e-6),
    ]  # fmt: skip
