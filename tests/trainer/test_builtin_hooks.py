"""The built-in hooks, each checked for the property it exists for."""

from __future__ import annotations

import functools
import re
import sys
import types
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR, ReduceLROnPlateau, StepLR
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import MeanSquaredError

from ember.data import ResumableSampler
from ember.errors import HookError
from ember.trainer import Placeholders, Trainer, hooks
from ember.trainer.hooks import metrics as metrics_module
from tests.models import tiny_dataset, tiny_mlp
from tests.trainer.helpers import RecordingLogger, all_equal, loader, make_engine, params

# -- LR scheduler --------------------------------------------------------------------------------


def test_step_scheduler_steps_once_per_update_with_accumulation_4_over_100_micro_steps() -> None:
    engine = make_engine(accumulation=4)
    hook = hooks.LRSchedulerHook(StepLR(engine.optimizer, step_size=1000), by_epoch=False)
    trainer = Trainer(engine)
    trainer.fit(loader(200, 2), epochs=1, hooks=[hook])
    assert trainer.micro_step == 100
    assert hook.lr_scheduler.last_epoch == 25 == trainer.cur_step


def test_epoch_scheduler_steps_once_per_epoch() -> None:
    engine = make_engine(accumulation=2)
    hook = hooks.LRSchedulerHook(StepLR(engine.optimizer, step_size=1, gamma=0.5), by_epoch=True)
    Trainer(engine).fit(loader(32, 4), epochs=3, hooks=[hook])
    assert hook.lr_scheduler.last_epoch == 3
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_scheduler_does_not_step_on_skipped_updates() -> None:
    engine = make_engine()
    real_step, calls = engine.step, [0]

    def sometimes_skipped() -> bool:  # as an fp16 overflow would: every third update is skipped
        calls[0] += 1
        return bool(real_step()) and calls[0] % 3 != 0

    engine.step = sometimes_skipped  # type: ignore[method-assign]
    hook = hooks.LRSchedulerHook(StepLR(engine.optimizer, step_size=1000), by_epoch=False)
    trainer = Trainer(engine)
    trainer.fit(loader(72, 8), epochs=1, hooks=[hook])
    assert calls[0] == 9 and trainer.cur_step == 6 and hook.lr_scheduler.last_epoch == 6


def test_placeholder_factory_builds_the_scheduler_with_the_run_numbers() -> None:
    engine = make_engine(accumulation=3)  # 10 batches per epoch -> 4 updates per epoch
    one_cycle = hooks.LRSchedulerHook(
        functools.partial(OneCycleLR, max_lr=0.5, total_steps=Placeholders.TOTAL_UPDATE_STEPS), by_epoch=False
    )
    trainer = Trainer(engine)
    trainer.fit(loader(80, 8), epochs=3, hooks=[one_cycle], test_dataloader=loader(24, 8))  # OneCycleLR raises if
    assert trainer.placeholder_values == {  # stepped past total_steps
        Placeholders.NUM_EPOCHS: 3, Placeholders.NUM_UPDATE_STEPS_PER_EPOCH: 4, Placeholders.TOTAL_UPDATE_STEPS: 12,
        Placeholders.TRAIN_DATALOADER_LEN: 10, Placeholders.EVAL_DATALOADER_LEN: 3,
    }  # fmt: skip
    assert one_cycle.lr_scheduler.total_steps == 12 and one_cycle.lr_scheduler.last_epoch == 12
    step = hooks.LRSchedulerHook(
        functools.partial(StepLR, step_size=Placeholders.NUM_UPDATE_STEPS_PER_EPOCH * 2 + 1), by_epoch=False
    )
    trainer.fit(loader(80, 8), epochs=1, hooks=[step])
    assert step.lr_scheduler.step_size == 9


def test_plateau_scheduler_needs_a_monitor_and_reduces_on_a_stalled_metric() -> None:
    engine = make_engine()
    with pytest.raises(HookError, match="monitor"):
        hooks.LRSchedulerHook(ReduceLROnPlateau(engine.optimizer), by_epoch=True)
    stalled = hooks.MetricHook(lambda out, y: torch.tensor(1.0), "const", mode="min")
    plateau = hooks.LRSchedulerHook(ReduceLROnPlateau(engine.optimizer, patience=0, factor=0.5), True, "test/const")
    Trainer(engine).fit(loader(16, 8), epochs=3, test_dataloader=loader(8, 8), hooks=[stalled, plateau])
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def test_a_scheduler_over_another_optimizer_is_rejected() -> None:
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(HookError, match="different optimizer"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[hooks.LRSchedulerHook(StepLR(other, 1), False)])


# -- stopping -------------------------------------------------------------------------------------


def test_early_stopping_stops_after_patience_epochs_without_improvement() -> None:
    flat = hooks.MetricHook(lambda out, y: torch.tensor(0.5), "score")
    stopper = hooks.EarlyStoppingHook("test/score", patience=2, mode="max")
    trainer = Trainer(make_engine())
    trainer.fit(loader(16, 8), epochs=10, test_dataloader=loader(8, 8), hooks=[flat, stopper])
    assert trainer.cur_epoch == 3  # best at epoch 1, then 2 epochs without improvement
    assert "did not improve for 2 epoch(s)" in (trainer.stop_reason or "")
    assert stopper.best == 0.5 and stopper.best_epoch == 0


def test_early_stopping_keeps_training_while_the_metric_improves() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(64, 8), epochs=4, test_dataloader=loader(64, 8),
                hooks=[hooks.LossHook(), hooks.EarlyStoppingHook("test/loss", patience=1)])  # fmt: skip
    assert trainer.cur_epoch == 4 and trainer.stop_reason is None


def _flat_fit(trainer: Trainer, stopper: hooks.EarlyStoppingHook, epochs: int, **kwargs: Any) -> None:
    """Fit on a test metric that never improves after its first value."""
    flat = hooks.MetricHook(lambda out, y: torch.tensor(0.5), "score")
    trainer.fit(loader(16, 8), epochs=epochs, test_dataloader=loader(8, 8), hooks=[flat, stopper], **kwargs)


@pytest.mark.parametrize(
    ("reset_on_fit", "reset_run_history", "stops_in_second_fit"),
    [
        (None, True, False),  # the run starts afresh: so does the patience count
        (None, False, True),  # the run (history, counters) continues: so does the patience count
        (True, False, False),  # explicit: every fit starts afresh
        (False, True, True),  # explicit: never reset
    ],
)
def test_early_stopping_state_follows_reset_run_history_or_reset_on_fit(
    reset_on_fit: bool | None, reset_run_history: bool, stops_in_second_fit: bool
) -> None:
    stopper = hooks.EarlyStoppingHook("test/score", patience=2, mode="max", reset_on_fit=reset_on_fit)
    trainer = Trainer(make_engine())
    _flat_fit(trainer, stopper, epochs=2)
    assert (stopper.wait, trainer.stop_reason) == (1, None)
    _flat_fit(trainer, stopper, epochs=1, reset_run_history=reset_run_history)
    assert (trainer.stop_reason is not None) == stops_in_second_fit
    assert stopper.wait == (2 if stops_in_second_fit else 0)


def test_early_stopping_keeps_a_loaded_state_even_when_it_resets_on_every_fit() -> None:
    stopper = hooks.EarlyStoppingHook("test/score", patience=2, mode="max", reset_on_fit=True)
    trainer = Trainer(make_engine())
    trainer.load_hook_states({"EarlyStoppingHook": {"best": 0.9, "best_epoch": 0, "wait": 1}})
    _flat_fit(trainer, stopper, epochs=3)
    assert "did not improve for 2 epoch(s) (best 0.9 at epoch 1)" in (trainer.stop_reason or "")
    assert trainer.cur_epoch == 1


def test_early_stopping_names_a_monitor_that_no_hook_records() -> None:
    with pytest.raises(HookError, match="did you mean 'test/loss'"):
        Trainer(make_engine()).fit(loader(16, 8), epochs=2, test_dataloader=loader(8, 8),
                                   hooks=[hooks.LossHook(), hooks.EarlyStoppingHook("test/los")])  # fmt: skip


class _NaNAfter(nn.Module):
    """Cross-entropy that turns NaN from the ``n``-th call on."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.cross_entropy(out, y)
        return loss * float("nan") if self.calls >= self.n else loss


def test_terminate_on_nan_stops_at_the_update_with_the_bad_loss() -> None:
    # the Engine's own check would raise first: the hook is for a clean stop, with nonfinite_loss='warn'
    trainer = Trainer(make_engine(accumulation=2, criterion=_NaNAfter(5), nonfinite_loss="warn"))
    trainer.fit(loader(64, 4), epochs=5, hooks=[hooks.TerminateOnNaNHook()])
    assert trainer.micro_step == 6 and trainer.cur_step == 3
    assert "non-finite loss (nan) at step 3" in (trainer.stop_reason or "")
    unguarded = Trainer(make_engine(criterion=_NaNAfter(5), nonfinite_loss="ignore"))
    unguarded.fit(loader(64, 4), epochs=2)
    assert unguarded.cur_epoch == 2 and unguarded.stop_reason is None


def _nan_in_tests(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy that is NaN in test passes (run under no_grad) only."""
    loss = nn.functional.cross_entropy(out, y)
    return loss if torch.is_grad_enabled() else loss * float("nan")


@pytest.mark.parametrize(("on", "epochs_run"), [(("train", "test"), 1), ("train", 3)])
def test_terminate_on_nan_watches_test_losses_when_asked(on: Any, epochs_run: int) -> None:
    stopper = hooks.TerminateOnNaNHook(on=on)
    trainer = Trainer(make_engine(criterion=_nan_in_tests))
    trainer.fit(loader(16, 8), epochs=3, test_dataloader=loader(8, 4), hooks=[stopper])
    assert trainer.cur_epoch == epochs_run
    if epochs_run == 1:
        assert stopper.reason == trainer.stop_reason == "non-finite test loss (nan) at step 2, epoch 1"
    else:
        assert stopper.reason is None and trainer.stop_reason is None


# -- EMA ------------------------------------------------------------------------------------------


def test_ema_with_decay_0_tracks_the_weights_exactly() -> None:
    engine = make_engine()
    ema = hooks.EMAHook(decay=0.0)
    Trainer(engine).fit(loader(32, 8), epochs=2, hooks=[ema])
    assert all(torch.equal(ema.shadow[n], p) for n, p in engine.model.named_parameters())
    assert ema.num_updates == 8


def test_ema_evaluation_uses_the_averaged_weights_and_restores_the_training_ones() -> None:
    engine = make_engine()
    initial = {k: v.clone() for k, v in engine.model.state_dict().items()}
    frozen = hooks.EMAHook(decay=1.0, eval_with_ema=True)  # the average never leaves the initial weights
    trainer = Trainer(engine)
    trainer.fit(loader(64, 8), epochs=2, test_dataloader=loader(32, 8), hooks=[frozen, hooks.LossHook()])
    trained = params(engine.model)
    reference = make_engine()
    reference.model.load_state_dict(initial)
    initial_loss = Trainer(reference).evaluate(loader(32, 8), hooks=[hooks.LossHook()])["test/loss"]
    assert trainer.history.values("test/loss") == [initial_loss, initial_loss]
    assert all_equal(params(engine.model), trained)  # the training weights came back
    trained_loss = trainer.evaluate(loader(32, 8), hooks=[hooks.LossHook()])["test/loss"]
    assert trained_loss != initial_loss
    out = make_engine().model
    frozen.copy_to(out)
    assert all(torch.equal(out.state_dict()[k], v) for k, v in initial.items())


def test_ema_warmup_starts_close_to_the_weights() -> None:
    engine = make_engine()
    ema = hooks.EMAHook(decay=0.999, warmup=True)
    Trainer(engine).fit(loader(8, 8), epochs=1, hooks=[ema])  # one update: decay 1/10
    name, p = next(iter(engine.model.named_parameters()))
    assert not torch.equal(ema.shadow[name], p)
    assert (ema.shadow[name] - p).abs().max() < 0.1 * 0.2


# -- metrics --------------------------------------------------------------------------------------


def test_loss_hook_averages_over_samples_even_with_an_uneven_last_batch() -> None:
    trainer = Trainer(make_engine())
    metrics = trainer.evaluate(loader(20, 8), hooks=[hooks.LossHook()])
    x, y = tiny_dataset(20).tensors
    with torch.no_grad():
        full = nn.functional.cross_entropy(trainer.engine.model(x), y).item()
    assert metrics["test/loss"] == pytest.approx(full, rel=1e-6)


def test_loss_hook_puts_per_step_losses_in_storage_as_floats_on_the_cpu() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=1, hooks=[hooks.LossHook()])
    kept = trainer.storage._buffers["train/loss"]
    assert len(kept) == 4 and all(type(v) is float for _, v in kept)  # read at once: see storage.held
    assert [s for s, _ in kept] == [1, 2, 3, 4]


def test_pending_values_stack_as_read_restored_or_mixed() -> None:
    """What a metric hook's fold stacks: floats read on the CPU (float64); values restored from a
    checkpoint (CPU tensors) before a device's new ones (moved there, in their dtype); a mix."""
    stacked = metrics_module._stacked
    assert stacked([0.5, 2, 0.25]).tolist() == [0.5, 2.0, 0.25] and stacked([0.5]).dtype == torch.float64
    restored = list(torch.tensor([0.5, 1.5], dtype=torch.float64).unbind())
    mixed = stacked([*restored, 0.25])  # a CPU run resumed mid-epoch
    assert mixed.dtype == torch.float64 and mixed.tolist() == [0.5, 1.5, 0.25]
    on_device = stacked([*restored, torch.empty((), device="meta")])  # "meta" stands in for an accelerator
    assert on_device.is_meta and on_device.dtype == torch.float32 and on_device.shape == (3,)


@pytest.mark.parametrize("fold_every", [3, 128])
def test_loss_hook_folds_its_pending_losses_into_the_exact_weighted_mean(
    fold_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Losses are summed in groups (fold_every 3: several folds, the uneven last batch in a run of
    its own scale); the epoch's value is the float64 sample-weighted mean of the batch losses."""
    monkeypatch.setattr(metrics_module, "_FOLD_EVERY", fold_every)
    seen: list[tuple[float, int]] = []

    class Record(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            seen.append((loss.item(), len(label)))

    trainer = Trainer(make_engine())
    trainer.fit(loader(37, 4), epochs=1, hooks=[hooks.LossHook(on="train"), Record()])
    assert [n for _, n in seen] == [4] * 9 + [1]
    expected = sum(loss * n for loss, n in seen) / 37
    assert trainer.history.values("train/loss") == [pytest.approx(expected, rel=1e-12)]


def test_accuracy_topk_and_custom_function() -> None:
    trainer = Trainer(make_engine())
    dl = loader(40, 8)
    x, y = tiny_dataset(40).tensors
    with torch.no_grad():
        logits = trainer.engine.model(x)
    top2 = (logits.topk(2, 1).indices == y[:, None]).any(1).float().mean().item()
    got = trainer.evaluate(dl, hooks=[hooks.AccuracyHook(topk=2), hooks.AccuracyHook(lambda o, t: (t == 0).sum())])
    assert got["test/top2_accuracy"] == pytest.approx(top2)
    assert got["test/accuracy"] == pytest.approx((y == 0).float().mean().item())


def test_metric_hook_takes_a_callable_or_a_torchmetrics_like_object() -> None:
    class CountingMetric:
        def __init__(self) -> None:
            self.n = 0

        def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
            self.n += len(y)

        def compute(self) -> torch.Tensor:
            return torch.tensor(float(self.n))

        def reset(self) -> None:
            self.n = 0

    got = Trainer(make_engine()).evaluate(loader(20, 8), hooks=[
        hooks.MetricHook(CountingMetric(), "count"),
        hooks.MetricHook(lambda o, y: (y.float() * 0 + 2.0).mean(), "two", mode="min"),
    ])  # fmt: skip
    assert got == {"test/count": 20.0, "test/two": 2.0}
    with pytest.raises(HookError, match="callable"):
        hooks.MetricHook(3, "x")


def test_metric_hook_state_carries_a_torchmetrics_metrics_progress_through_a_mid_epoch_resume() -> None:
    x, y = tiny_dataset(40).tensors
    with torch.no_grad():
        logits = tiny_mlp()(x)
    whole = MulticlassAccuracy(num_classes=4)
    for i in range(0, 40, 8):
        whole.update(logits[i : i + 8], y[i : i + 8])
    before = hooks.MetricHook(MulticlassAccuracy(num_classes=4), "acc", on="train")
    for i in range(0, 24, 8):  # three batches in, the epoch is interrupted
        before.after_train_iter(logits[i : i + 8], y[i : i + 8], None)
    state = before.state_dict()
    assert state["metric"]["train"]["updates"] == 3
    resumed = hooks.MetricHook(MulticlassAccuracy(num_classes=4), "acc", on="train")
    resumed.load_state_dict(state)
    for i in range(24, 40, 8):
        resumed.after_train_iter(logits[i : i + 8], y[i : i + 8], None)
    assert resumed.metric.update_count == 5
    assert resumed.metric.compute().item() == whole.compute().item()  # the same counts: exactly equal

    with pytest.raises(HookError, match="does not fit MeanSquaredError"):
        hooks.MetricHook(MeanSquaredError(), "mse", on="train").load_state_dict(state)
    with pytest.raises(HookError, match="phase 'train'"):
        hooks.MetricHook(MulticlassAccuracy(num_classes=4), "acc").load_state_dict(state)  # measures "test" only


def test_evaluation_drops_the_distributed_samplers_padding_repeats() -> None:
    ds = tiny_dataset(11)
    rank1 = ResumableSampler(ds, num_replicas=2, rank=1, shuffle=False)  # 6 samples, the last a repeat
    seen: list[int] = []

    class Count(hooks.BaseHook):
        def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
            seen.append(len(label))

    for batch_size in (4, 1):
        seen.clear()
        Trainer(make_engine()).evaluate(DataLoader(ds, batch_size=batch_size, sampler=rank1), hooks=[Count()])
        assert sum(seen) == 5 == rank1.real_num_samples


# -- logging, timing, memory, progress, tensorboard -----------------------------------------------


def test_log_metric_by_epoch_writes_one_line_per_epoch_with_train_test_and_lr() -> None:
    log = RecordingLogger()
    Trainer(make_engine()).fit(loader(16, 8), epochs=2, test_dataloader=loader(8, 8),
                               hooks=[hooks.LossHook(), hooks.LogMetricByEpochHook(log)])  # fmt: skip
    lines = log.lines("epoch ")
    assert len(lines) == 2 and lines[1].startswith("epoch 2/2 | train/loss ")
    assert "| test/loss " in lines[1] and "| lr 0.1" in lines[1]


def test_log_metric_by_step_logs_every_n_updates() -> None:
    log = RecordingLogger()
    Trainer(make_engine(accumulation=2)).fit(loader(64, 4), epochs=1,
                                             hooks=[hooks.LossHook(), hooks.LogMetricByStepHook(3, log)])  # fmt: skip
    lines = log.lines("step ")
    assert [line.split(" |")[0] for line in lines] == ["step 3", "step 6"]
    assert "train/loss" in lines[0] and "lr" in lines[0]


def test_timing_memory_and_throughput_hooks_report() -> None:
    log = RecordingLogger()
    timing, memory = hooks.LogTimingByEpochHook(log), hooks.LogMemoryByEpochHook(log)
    speed = hooks.ThroughputHook(every_n=2, logger=log)
    trainer = Trainer(make_engine())
    trainer.fit(loader(64, 8), epochs=2, test_dataloader=loader(8, 8), hooks=[timing, memory, speed])
    assert len(log.lines("timing | train ")) == 2 and "test_s" in timing.last
    assert memory.last["rss_peak"] > 0 and len(log.lines("memory | rss")) == 2
    assert speed.samples_per_s is not None and speed.samples_per_s > 0
    assert {"throughput/samples_per_s", "time/step_s", "time/eta_s"} <= set(trainer.storage.names())
    assert speed.eta_s == 0.0 and len(log.lines("samples/s")) == 2


def test_progress_bars_go_to_stderr_on_rank_0_and_redraw_rarely(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(256, 2), epochs=2, test_dataloader=loader(16, 2), display_progress=True)
    err = capsys.readouterr().err
    assert "epoch 1/2" in err and "128/128" in err and "test" in err
    train_lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("epoch 2/2")]
    postfix = train_lines[-1]  # the epoch's last redraw: loss, learning rate and throughput
    assert re.search(r"loss=[0-9.e+-]+, lr=0\.1, samples/s=[0-9.e+]+\]\s*$", postfix), postfix
    bar = next(h for h in trainer.hooks if isinstance(h, hooks.ProgressBarHook))
    assert bar.refreshes <= 2 * 3  # 256 batches: redraws only every 0.5 s and at each epoch's end


def test_a_bar_redrawn_on_every_batch_still_ends_with_its_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    bar = hooks.ProgressBarHook(refresh_s=0)
    Trainer(make_engine()).fit(loader(16, 2), epochs=1, hooks=[bar])
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "8/8" in line]
    assert bar.refreshes == 8 and lines and all(re.search(r"samples/s=[0-9.e+]+\]\s*$", line) for line in lines), lines


def test_tensorboard_hook_explains_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(HookError, match="pip install tensorboard"):
        hooks.TensorboardHook("runs/x")


def test_tensorboard_hook_writes_step_and_epoch_scalars(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, float, int]] = []

    class FakeWriter:
        def __init__(self, log_dir: str) -> None:
            self.log_dir = log_dir

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            written.append((tag, value, step))

        def flush(self) -> None:
            pass

        def close(self) -> None:
            written.append(("closed", 0.0, 0))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    tb = hooks.TensorboardHook("runs/x", every_n=2)
    Trainer(make_engine()).fit(loader(32, 8), epochs=1, hooks=[hooks.LossHook(), tb])
    tags = [(t, s) for t, _, s in written]
    assert ("train/loss", 2) in tags and ("lr", 4) in tags and ("epoch/train/loss", 1) in tags
    assert written[-1][0] == "closed"
