"""One training job for the checkpoint tests, the same in pytest, in forked children and under torchrun.

72 samples, batch 8 on one rank (4 on each of two), 9 batches per rank per epoch, accumulation 2
(updates after batches 2, 4, 6, 8 and 9 of each epoch: 5 per epoch), dropout, a shuffled
sampler, a step LR schedule, momentum, loss and accuracy metrics, and a test pass every epoch.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ember
from ember import distributed
from ember.data import ResumableSampler
from ember.trainer import Trainer, hooks
from tests.models import tiny_dataset, tiny_mlp

N, EPOCHS, ACCUMULATION = 72, 3, 2


class Recorder(hooks.BaseHook):
    """Keeps every batch's loss by the trainer's batch counter (``micro_step``)."""

    def __init__(self) -> None:
        super().__init__(name="Recorder")
        self.losses: dict[int, float] = {}
        self.resumed_at: int | None = None

    def before_train(self) -> None:
        self.resumed_at = self.trainer.micro_step

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.losses[self.trainer.micro_step] = float(loss.detach())


class Killer(hooks.BaseHook):
    """Sends ``sig`` to this process at batch ``at`` (before the checkpoint hook runs for it)."""

    priority = hooks.Priority.HIGHEST

    def __init__(self, at: int, sig: int) -> None:
        super().__init__(name="Killer")
        self.at, self.sig = at, sig

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        if self.trainer.micro_step == self.at:
            os.kill(os.getpid(), self.sig)


class Crash(hooks.BaseHook):
    """Raises at batch ``at``: a process dying there (its checkpoints stay as they were)."""

    priority = hooks.Priority.HIGHEST

    def __init__(self, at: int) -> None:
        super().__init__(name="Crash")
        self.at = at

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        if self.trainer.micro_step == self.at:
            raise RuntimeError("crashed")


def die_renaming(step: int) -> None:
    """SIGKILL this process between writing step ``step``'s checkpoint and renaming it into place."""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(f"-s{step:09d}.ckpt"):
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    os.replace = replace  # type: ignore[assignment]


def batch_size() -> int:
    return 8 // distributed.world_size()


def build(
    deterministic: bool = False,
    seed: int = 123,
    bs: int | None = None,
    logger: Any = None,
    config: dict[str, Any] | None = None,
    datasets: tuple[Any, Any] | None = None,
) -> tuple[Trainer, Any, Any]:
    """The trainer and its train/test loaders (same initial weights on every rank).

    ``config`` adds to (or overrides) the Engine config; ``datasets`` replaces the train and
    test datasets (same sizes: ``N`` and 20).
    """
    torch.manual_seed(seed)
    model = tiny_mlp(0, dropout=0.3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    bs = bs or batch_size()
    train_set, test_set = datasets or (tiny_dataset(N, 1), tiny_dataset(20, 5))
    train = ember.get_dataloader(train_set, shuffle=True, batch_size=bs, seed=0)
    test = ember.get_dataloader(test_set, batch_size=bs)
    config = {"gradient_accumulation": ACCUMULATION, "deterministic": deterministic, **(config or {})}
    engine, train, test, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), train, test, config=config)
    # Stop agreement after every update, so a SIGTERM lands on a known update (the default
    # spaces the agreements by time, which would make the preemption checkpoint's step vary).
    return Trainer(engine, logger=logger, stop_check_every_s=0), train, test


def hook_list(trainer: Trainer, ckpt: hooks.BaseHook | None, extra: Sequence[hooks.BaseHook] = ()) -> list[Any]:
    """Loss and accuracy, a step LR schedule, the Recorder, ``extra``, and ``ckpt`` last."""
    sched = torch.optim.lr_scheduler.StepLR(trainer.engine.optimizer, step_size=3, gamma=0.7)
    return [hooks.LossHook(), hooks.AccuracyHook(), hooks.LRSchedulerHook(sched, by_epoch=False), Recorder(),
            *extra, *([ckpt] if ckpt is not None else [])]  # fmt: skip


def run(
    ckpt_dir: str | Path | None,
    out: str | Path | None = None,
    *,
    kill_at: int | None = None,
    sig: int = signal.SIGKILL,
    extra: Sequence[hooks.BaseHook] = (),
    logger: Any = None,
    deterministic: bool = False,
    epochs: int = EPOCHS,
    max_steps: int | None = None,
    resume: Any = "default",
    bs: int | None = None,
    config: dict[str, Any] | None = None,
    **ckpt_kwargs: Any,
) -> Trainer:
    """Train (resuming from ``ckpt_dir`` when it has a checkpoint); write params and losses to ``out``.

    ``ckpt_kwargs`` go to the CheckpointHook (default: every 2 updates, keep all); no
    ``ckpt_dir``: no CheckpointHook. ``resume`` defaults to ``"auto"`` with a directory, else None.
    ``config`` adds to the Engine config (see :func:`build`).
    """
    if resume == "default":
        resume = "auto" if ckpt_dir is not None else None
    trainer, train, test = build(deterministic, bs=bs, logger=logger, config=config)
    ckpt = None
    if ckpt_dir is not None:
        ckpt = hooks.CheckpointHook(ckpt_dir, **{"every_n_steps": 2, "keep_last": None, **ckpt_kwargs})
    extra = [*extra, Killer(kill_at, sig)] if kill_at is not None else list(extra)
    trainer.fit(train, epochs=epochs, max_steps=max_steps, test_dataloader=test, hooks=hook_list(trainer, ckpt, extra),
                resume=resume)  # fmt: skip
    if out is not None:
        write_result(trainer, out)
    return trainer


def epoch_order(epoch: int) -> list[int]:
    """The dataset indices of epoch ``epoch`` of the shuffled train loader, in order (one process)."""
    sampler = ResumableSampler(tiny_dataset(N, 1), num_replicas=1, rank=0, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return sampler.indices()


def params(trainer: Trainer) -> list[torch.Tensor]:
    """Detached copies of the model's parameters."""
    return [p.detach().clone() for p in trainer.engine.model.parameters()]


def write_result(trainer: Trainer, out: str | Path) -> None:
    """This rank's final parameters (``params-rank<r>.pt``) and losses and history (``result-rank<r>.json``)."""
    out, rank = Path(out), distributed.rank()
    out.mkdir(parents=True, exist_ok=True)
    torch.save([p.detach().clone() for p in trainer.engine.model.parameters()], out / f"params-rank{rank}.pt")
    recorder = trainer.get_hook("Recorder")
    result = {
        "losses": recorder.losses,  # type: ignore[attr-defined]
        "resumed_at": recorder.resumed_at,  # type: ignore[attr-defined]
        "history": {n: trainer.history.values(n) for n in trainer.history.names},
        "counters": [trainer.cur_epoch, trainer.cur_step, trainer.micro_step, trainer.samples_seen],
    }
    (out / f"result-rank{rank}.json").write_text(json.dumps(result))


def read_result(out: str | Path, rank: int = 0) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """What :func:`write_result` wrote (loss keys back to ints)."""
    out = Path(out)
    result = json.loads((out / f"result-rank{rank}.json").read_text())
    result["losses"] = {int(k): v for k, v in result["losses"].items()}
    return torch.load(out / f"params-rank{rank}.pt"), result
