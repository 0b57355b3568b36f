"""Run under torchrun with 2 gloo processes: the Trainer's multi-rank guarantees, one scenario each."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
from typing import Any

import torch
from tests.dist import report
from tests.models import tiny_dataset, tiny_mlp
from tests.trainer.helpers import RecordingLogger
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

import ember
from ember import distributed
from ember.trainer import Placeholders, Trainer, hooks

torch.set_num_threads(1)


def engine(accumulation: int = 1, criterion: Any = None) -> Any:
    model = tiny_mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # A NaN loss stops cleanly through TerminateOnNaNHook here, not with the Engine's error.
    config = {"gradient_accumulation": accumulation, "nonfinite_loss": "warn"}
    return ember.initialize(model, opt, criterion or nn.CrossEntropyLoss(), config=config)[0]


def placeholders() -> dict[str, Any]:
    """100 samples, 5 per batch, 2 ranks: 10 batches per rank; accumulation 4 -> 3 updates per epoch."""
    hook = hooks.LRSchedulerHook(
        functools.partial(OneCycleLR, max_lr=0.1, total_steps=Placeholders.TOTAL_UPDATE_STEPS), by_epoch=False
    )
    trainer = Trainer(engine(accumulation=4), logger=RecordingLogger())
    trainer.fit(ember.get_dataloader(tiny_dataset(100), batch_size=5, shuffle=True), epochs=2, hooks=[hook])
    values = {p.name: v for p, v in trainer.placeholder_values.items()}
    return {"values": values, "scheduler_steps": hook.lr_scheduler.last_epoch, "cur_step": trainer.cur_step}


class CountSamples(hooks.BaseHook):
    def before_test_epoch(self) -> None:
        self.n = torch.zeros(1)

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.n += len(label)

    def after_test_epoch(self) -> None:
        self.total = int(distributed.all_reduce(self.n.clone()).item())


def evaluation(n: int) -> dict[str, Any]:
    """Each of the ``n`` samples counts once; loss and accuracy equal one process's on all data."""
    trainer = Trainer(engine(), logger=RecordingLogger())
    count = CountSamples()
    dl = ember.get_dataloader(tiny_dataset(n, seed=7), batch_size=2)
    metrics = trainer.evaluate(dl, hooks=[count, hooks.LossHook(), hooks.AccuracyHook()])
    x, y = tiny_dataset(n, seed=7).tensors
    with torch.no_grad():
        logits = trainer.engine.model(x)
    return {
        "counted": count.total,
        "acc_diff": abs(metrics["test/accuracy"] - (logits.argmax(1) == y).float().mean().item()),
        "loss_diff": abs(metrics["test/loss"] - nn.functional.cross_entropy(logits, y).item()),
    }


def one_process_training(n: int, accumulation: int) -> dict[str, float]:
    """Train loss and accuracy of one process over the samples the two ranks see together.

    Unshuffled, rank r reads samples r, r + 2, ...: each pair of per-rank batches of 4 is one
    sequential batch of 8 here, and DDP's averaged gradient is this batch's mean gradient.
    """
    model = tiny_mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_sum, correct = 0.0, 0
    batches = list(DataLoader(tiny_dataset(n, seed=3), batch_size=8))
    for i, (x, y) in enumerate(batches):
        if i % accumulation == 0:
            opt.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        (loss / accumulation).backward()
        loss_sum += loss.item() * len(y)
        correct += int((out.argmax(1) == y).sum())
        if (i + 1) % accumulation == 0 or i == len(batches) - 1:
            opt.step()
    return {"train/loss": loss_sum / n, "train/acc": correct / n}


def train_averages() -> dict[str, Any]:
    """Train-phase loss and a torchmetrics accuracy over 2 ranks, uninterrupted (with progress bars:
    what each rank wrote to stderr is kept) and resumed from per-rank states taken mid-epoch."""
    n, accumulation = 48, 2
    loader = ember.get_dataloader(tiny_dataset(n, seed=3), batch_size=4)  # 6 batches per rank

    def metric_hooks() -> list[hooks.BaseHook]:
        accuracy = MulticlassAccuracy(num_classes=4, average="micro")  # synced by torchmetrics at compute()
        return [hooks.LossHook(on="train"), hooks.MetricHook(accuracy, "acc", on="train")]

    trainer = Trainer(engine(accumulation), logger=RecordingLogger())
    with contextlib.redirect_stderr(io.StringIO()) as err:
        trainer.fit(loader, epochs=1, hooks=metric_hooks(), display_progress=True)
    whole = {k: trainer.history.latest(k) for k in ("train/loss", "train/acc")}

    saved: dict[str, Any] = {}

    class SaveAndStop(hooks.BaseHook):
        priority = 100  # after the metric hooks counted the batch

        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.micro_step == 4:  # update 2 of 3: a boundary, mid-epoch
                t = self.trainer
                state = {"engine": t.engine.state_dict(), "trainer": t.state_dict(), "hooks": t.hook_states()}
                saved.update(copy.deepcopy(state))  # a checkpoint's copy: training goes on to the end of the cycle
                raise hooks.StopTraining

    interrupted = Trainer(engine(accumulation), logger=RecordingLogger())
    interrupted.fit(loader, epochs=1, hooks=[*metric_hooks(), SaveAndStop()])
    resumed = Trainer(engine(accumulation), logger=RecordingLogger())
    resumed.engine.load_state_dict(saved["engine"])
    resumed.load_state_dict(saved["trainer"])
    resumed.load_hook_states(saved["hooks"])
    resumed.fit(loader, epochs=1, hooks=metric_hooks())
    return {
        "two_ranks": whole,
        "one_process": one_process_training(n, accumulation),
        "resumed": {k: resumed.history.latest(k) for k in whole},
        "resumed_micro_step": resumed.micro_step,
        "saved_metric_updates": saved["hooks"]["acc"].get("metric", {}).get("train", {}).get("updates"),
        "stderr": err.getvalue(),
    }


def one_rank_raises(event: str, raising_rank: int) -> dict[str, Any]:
    """A hook raises on one rank only; both ranks must raise and run after_train, without hanging."""
    ran: list[str] = []

    class Fails(hooks.BaseHook):
        priority = 0  # before LossHook, whose after_train_epoch all-reduces

        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if event == "iter" and distributed.rank() == raising_rank and self.trainer.micro_step == 3:
                raise ValueError("broken on one rank")

        def after_train_epoch(self) -> None:
            if event == "epoch" and distributed.rank() == raising_rank:
                raise ValueError("broken on one rank")

        def after_train(self) -> None:
            ran.append("after_train")

    trainer = Trainer(engine(accumulation=2), logger=RecordingLogger())
    out: dict[str, Any] = {}
    try:
        trainer.fit(ember.get_dataloader(tiny_dataset(64), batch_size=4), epochs=2, hooks=[Fails(), hooks.LossHook()])
    except Exception as exc:  # noqa: BLE001 - the scenario reports what was raised
        out["raised"] = type(exc).__name__
        out["message"] = str(exc)
    out.update(after_train=ran, cur_step=trainer.cur_step, micro_step=trainer.micro_step)
    return out


class NaNOnRank0(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.cross_entropy(out, y)
        return loss * float("nan") if distributed.rank() == 0 and self.calls == 3 else loss


def one_rank_stops(how: str, check_every_s: float = 0) -> dict[str, Any]:
    """Rank 0 alone asks to stop in update 2 (``how``: "hook" or a NaN loss): every rank stops alike.

    ``check_every_s`` is the Trainer's ``stop_check_every_s`` (0: agree after every update)."""

    class StopOnRank0(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if distributed.rank() == 0 and self.trainer.step_applied and self.trainer.cur_step == 2:
                self.trainer.stop("asked on rank 0 in update 2")

    criterion = NaNOnRank0() if how == "nan" else None
    chosen = [hooks.TerminateOnNaNHook()] if how == "nan" else [StopOnRank0()]
    trainer = Trainer(engine(accumulation=2, criterion=criterion), logger=RecordingLogger(),
                      stop_check_every_s=check_every_s)  # fmt: skip
    n = 64 if check_every_s == 0 else 512  # spaced: 32 updates an epoch, room for the stop to land
    exchanges = []
    real = distributed.max_async

    def counted(values: Any) -> Any:
        exchanges.append(values)
        return real(values)

    distributed.max_async = counted  # type: ignore[assignment]
    try:
        trainer.fit(ember.get_dataloader(tiny_dataset(n), batch_size=4), epochs=3, hooks=chosen)
    finally:
        distributed.max_async = real  # type: ignore[assignment]
    return {"cur_step": trainer.cur_step, "cur_epoch": trainer.cur_epoch, "reason": trainer.stop_reason,
            "exchanges": len(exchanges)}  # fmt: skip


def unsharded_test_loaders() -> dict[str, Any]:
    """A test loader whole on every rank: ``get_dataloader(add_sampler=False)`` is kept whole by
    initialize and evaluated in full on each rank, silently; a plain DataLoader is evaluated the
    same way with one warning; a sampler split over 4 ranks (of 2) is an error."""
    from torch.utils.data import DistributedSampler

    n = 11
    ds = tiny_dataset(n, seed=7)
    model = tiny_mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    chosen = ember.get_dataloader(ds, batch_size=3, add_sampler=False)
    eng, _, test_dl, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), test_dataloader=chosen)
    x, y = ds.tensors
    with torch.no_grad():
        logits = eng.model(x)
    expected = {"test/accuracy": (logits.argmax(1) == y).float().mean().item(),
                "test/loss": nn.functional.cross_entropy(logits, y).item()}  # fmt: skip

    def diffs(metrics: dict[str, float]) -> float:
        return max(abs(metrics[k] - v) for k, v in expected.items())

    logger = RecordingLogger()
    trainer = Trainer(eng, logger=logger)
    count = CountSamples()
    out: dict[str, Any] = {"kept_by_initialize": test_dl is chosen}
    with contextlib.redirect_stderr(io.StringIO()) as err:
        chosen_metrics = trainer.evaluate(test_dl, hooks=[count, hooks.LossHook(), hooks.AccuracyHook()])
        out["chosen"] = {"counted_here": int(count.n.item()), "counted": count.total, "diff": diffs(chosen_metrics)}
        plain = DataLoader(ds, batch_size=3)
        for _ in range(2):  # warned once per loader
            plain_metrics = trainer.evaluate(plain, hooks=[hooks.LossHook(), hooks.AccuracyHook()])
        out["plain"] = {"diff": diffs(plain_metrics)}
    warnings = [m for level, m in logger.records if level == "warning"] + [
        line for line in err.getvalue().splitlines() if "WARNING" in line
    ]
    out["warnings"] = warnings
    split = DataLoader(ds, batch_size=3, sampler=DistributedSampler(ds, num_replicas=4, rank=ember.context.rank))
    try:
        trainer.evaluate(split)
        out["split_error"] = ""
    except ember.errors.TrainerError as exc:
        out["split_error"] = str(exc)
    return out


def main() -> None:
    ember.launch_from_torch(config={"seed": 0}, verbose=False)
    report({
        "placeholders": placeholders(),
        "eval10": evaluation(10),
        "eval11": evaluation(11),
        "iter_error": one_rank_raises("iter", raising_rank=1),
        "epoch_error": one_rank_raises("epoch", raising_rank=0),
        "hook_stop": one_rank_stops("hook"),
        "nan_stop": one_rank_stops("nan"),
        "hook_stop_spaced": one_rank_stops("hook", check_every_s=1.0),
        "unsharded": unsharded_test_loaders(),
        "train_averages": train_averages(),
    })  # fmt: skip


if __name__ == "__main__":
    main()
