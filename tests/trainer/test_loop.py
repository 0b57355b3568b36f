"""The Trainer's loop: bit-identity with hand loops, limits, counters, repeated fits, resume."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

import ember
from ember.errors import TrainerError
from ember.trainer import DefaultSchedule, Steps, Trainer, hooks
from ember.trainer.hooks import metrics as metrics_module
from tests.models import tiny_dataset, tiny_mlp
from tests.trainer.helpers import RecordingLogger, all_equal, loader, make_engine, params


def _hand_loop(epochs: int, accumulation: int, batch_size: int = 8, n: int = 72) -> list[torch.Tensor]:
    """Plain PyTorch, the same data order as ember's resumable sampler."""
    model = tiny_mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dl = loader(n, batch_size, shuffle=True)
    for epoch in range(epochs):
        dl.sampler.set_epoch(epoch)
        batches = list(dl)
        for i, (x, y) in enumerate(batches):
            if i % accumulation == 0:
                opt.zero_grad()
            (nn.functional.cross_entropy(model(x), y) / accumulation).backward()
            if (i + 1) % accumulation == 0 or i == len(batches) - 1:
                opt.step()
    return params(model)


def _engine_loop(epochs: int) -> list[torch.Tensor]:
    engine = make_engine()
    dl = loader(72, 8, shuffle=True)
    for epoch in range(epochs):
        dl.sampler.set_epoch(epoch)
        for x, y in dl:
            engine.zero_grad()
            engine.backward(engine.criterion(engine(x), y))
            engine.step()
    return params(engine.model)


def test_fit_without_hooks_is_bit_identical_to_the_engine_loop_and_a_hand_loop() -> None:
    engine = make_engine()
    Trainer(engine).fit(loader(72, 8, shuffle=True), epochs=3)
    trained = params(engine.model)
    assert all_equal(trained, _engine_loop(3))
    assert all_equal(trained, _hand_loop(3, accumulation=1))


def test_fit_with_accumulation_closes_the_cycle_at_each_epoch_end_like_a_hand_loop() -> None:
    engine = make_engine(accumulation=4)  # 9 batches per epoch: cycles of 4, 4, 1
    trainer = Trainer(engine)
    trainer.fit(loader(72, 8, shuffle=True), epochs=2)
    assert all_equal(params(engine.model), _hand_loop(2, accumulation=4))
    assert trainer.cur_step == 2 * math.ceil(9 / 4)
    assert trainer.micro_step == 18


def test_an_update_override_wraps_every_step_and_changes_nothing_else() -> None:
    seen: list[tuple[int, bool]] = []

    class Wrapping(Trainer):
        def update(self) -> bool:
            applied = super().update()
            seen.append((self.engine.micro_step, applied))
            return applied

    engine = make_engine(accumulation=4)  # 9 batches per epoch: cycles of 4, 4, 1
    trainer = Wrapping(engine)
    trainer.fit(loader(72, 8, shuffle=True), epochs=2)
    assert all_equal(params(engine.model), _hand_loop(2, accumulation=4))
    assert len(seen) == 18 and sum(applied for _, applied in seen) == trainer.cur_step == 6
    assert [applied for _, applied in seen[:9]] == [False, False, False, True] * 2 + [True]


def test_counters_count_updates_batches_and_samples() -> None:
    trainer = Trainer(make_engine(accumulation=2))
    trainer.fit(loader(60, 8), epochs=2)  # 8 batches (last has 4 samples), 4 updates per epoch
    assert (trainer.cur_epoch, trainer.cur_step, trainer.micro_step, trainer.samples_seen) == (2, 8, 16, 120)
    assert trainer.epoch_iter == 0


def test_max_steps_stops_mid_epoch_after_exactly_that_many_updates() -> None:
    trainer = Trainer(make_engine(accumulation=2))
    seen: list[int] = []

    class Count(hooks.BaseHook):
        def after_test_epoch(self) -> None:
            seen.append(self.trainer.cur_step)

    trainer.fit(loader(64, 4), max_steps=5, test_dataloader=loader(16, 4), hooks=[Count()])
    assert trainer.cur_step == 5 and trainer.micro_step == 10
    assert trainer.cur_epoch == 1  # the cut epoch is closed
    assert seen == [5]  # the run's end gets a test pass


def test_epochs_and_max_steps_stop_at_whichever_comes_first() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=2, max_steps=100)
    assert trainer.cur_epoch == 2 and trainer.cur_step == 8
    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=10, max_steps=6)
    assert trainer.cur_step == 6 and trainer.cur_epoch == 2


def test_test_interval_tests_every_nth_epoch_and_after_the_last() -> None:
    tested: list[int] = []

    class Spy(hooks.BaseHook):
        def before_test(self) -> None:
            tested.append(self.trainer.cur_epoch)

    Trainer(make_engine()).fit(loader(16, 8), epochs=5, test_dataloader=loader(8, 8), test_interval=2, hooks=[Spy()])
    assert tested == [1, 3, 4]


def test_fit_called_twice_continues_history_and_counters_unless_reset() -> None:
    trainer = Trainer(make_engine())
    loss = hooks.LossHook()
    trainer.fit(loader(32, 8), epochs=2, hooks=[loss])
    trainer.fit(loader(32, 16), epochs=3)  # new loader (e.g. bigger images), same hooks
    assert trainer.cur_epoch == 5 and trainer.cur_step == 2 * 4 + 3 * 2
    assert trainer.history.epochs("train/loss") == [0, 1, 2, 3, 4]
    trainer.fit(loader(32, 8), epochs=1, reset_run_history=True)
    assert trainer.cur_epoch == 1 and trainer.cur_step == 4
    assert trainer.history.epochs("train/loss") == [0]


def test_fit_builds_distributed_loaders_from_datasets() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(train_dataset=tiny_dataset(40), test_dataset=tiny_dataset(12, 3), batch_size=8, epochs=1,
                hooks=[hooks.LossHook()])  # fmt: skip
    assert trainer.cur_step == 5
    assert type(trainer.train_dataloader.sampler).__name__ == "ResumableSampler"
    assert trainer.train_dataloader.sampler.shuffle and not trainer.test_dataloader.sampler.shuffle
    assert "test/loss" in trainer.history


def test_trainer_builds_its_engine_from_model_optimizer_and_criterion() -> None:
    model = tiny_mlp(0)
    trainer = Trainer(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      criterion=nn.CrossEntropyLoss(), config={"gradient_accumulation": 2})  # fmt: skip
    assert trainer.engine.model is model and trainer.engine.gradient_accumulation == 2
    trainer.fit(loader(32, 8), epochs=1)
    assert trainer.cur_step == 2


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "epochs=N, max_steps=N"),
        ({"epochs": 0}, "epochs"),
        ({"epochs": 1, "max_steps": -1}, "max_steps"),
        ({"epochs": 1, "test_interval": 0}, "test_interval"),
        ({"epochs": 1, "train_dataset": tiny_dataset(8)}, "not both"),
    ],
)
def test_bad_fit_arguments_raise_a_trainer_error_naming_them(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(TrainerError, match=fragment):
        Trainer(make_engine()).fit(loader(8, 8), **kwargs)


def test_fit_without_training_data_or_with_an_empty_loader_is_a_clear_error() -> None:
    trainer = Trainer(make_engine())
    with pytest.raises(TrainerError, match="train_dataloader"):
        trainer.fit(epochs=1)
    with pytest.raises(TrainerError, match="batch_size"):
        trainer.fit(train_dataset=tiny_dataset(8), epochs=1)
    with pytest.raises(TrainerError, match="no batches"):
        trainer.fit(ember.get_dataloader(tiny_dataset(4), batch_size=8, drop_last=True), epochs=1)


def test_trainer_rejects_both_an_engine_and_a_model_and_a_non_engine() -> None:
    model = tiny_mlp()
    with pytest.raises(TrainerError, match="not both"):
        Trainer(make_engine(), model=model)
    with pytest.raises(TrainerError, match="engine"):
        Trainer()
    with pytest.raises(TrainerError, match="without"):
        Trainer(object())  # type: ignore[arg-type]


def test_fit_from_inside_fit_is_refused() -> None:
    class Nested(hooks.BaseHook):
        def before_train(self) -> None:
            self.trainer.fit(loader(8, 8), epochs=1)

    with pytest.raises(TrainerError, match="while fit is running"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[Nested()])


def test_after_train_runs_when_training_raises() -> None:
    events: list[str] = []

    class Boom(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.cur_step == 3:
                raise ValueError("boom")

        def after_train(self) -> None:
            events.append("after_train")

    with pytest.raises(ValueError, match="boom") as info:
        Trainer(make_engine()).fit(loader(64, 8), epochs=2, hooks=[Boom()])
    assert events == ["after_train"]
    assert any("Boom.after_train_iter" in note for note in getattr(info.value, "__notes__", []))


def test_an_error_in_the_step_itself_still_runs_after_train() -> None:
    ran: list[bool] = []

    class Closer(hooks.BaseHook):
        def after_train(self) -> None:
            ran.append(True)

    class Broken(Trainer):
        def train_step(self, batch: Any) -> dict[str, Any]:
            raise KeyError("bad batch")

    with pytest.raises(KeyError):
        Broken(make_engine()).fit(loader(16, 8), epochs=1, hooks=[Closer()])
    assert ran == [True]


def test_train_step_override_gives_a_custom_loss_and_dict_batches_work() -> None:
    class Regularised(Trainer):
        def train_step(self, batch: Any) -> dict[str, Any]:
            out = self.engine(batch["x"])
            loss = self.engine.criterion(out, batch["y"]) + 0.0 * out.pow(2).mean()
            return {"loss": loss, "output": out, "label": batch["y"], "batch_size": len(batch["x"]), "extra": 1}

    ds = tiny_dataset(32)
    dicts = [{"x": ds.tensors[0][i : i + 8], "y": ds.tensors[1][i : i + 8]} for i in range(0, 32, 8)]
    trainer = Regularised(make_engine())
    trainer.fit(dicts, epochs=1, hooks=[hooks.LossHook()])
    assert trainer.cur_step == 4 and trainer.step_result["extra"] == 1
    # the default step splits dict batches on their label key
    plain = Trainer(make_engine())

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_mlp(0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = Model()
    plain = Trainer(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), criterion=nn.CrossEntropyLoss())
    plain.fit([{"x": d["x"], "label": d["y"]} for d in dicts], epochs=1)
    assert plain.cur_step == 4


def test_compute_loss_and_train_step_replaced_on_a_subclass_or_the_instance_are_called() -> None:
    """The default step calls the criterion directly only while compute_loss/train_step are Trainer's own."""
    calls: list[str] = []

    class Scaled(Trainer):
        def compute_loss(self, output: Any, label: Any) -> torch.Tensor:
            calls.append("subclass")
            return 2 * super().compute_loss(output, label)

    Scaled(make_engine()).fit(loader(16, 8), epochs=1)
    trainer = Trainer(make_engine())
    plain_loss = trainer.compute_loss
    trainer.compute_loss = lambda output, label: calls.append("instance") or plain_loss(output, label)  # type: ignore[method-assign]
    trainer.fit(loader(16, 8), epochs=1)
    plain_step = trainer.train_step
    trainer.train_step = lambda batch: calls.append("step") or plain_step(batch)  # type: ignore[method-assign]
    trainer.fit(loader(16, 8), epochs=1)
    assert calls == ["subclass"] * 2 + ["instance"] * 2 + ["step", "instance"] * 2


def test_a_schedule_gets_the_engine_and_the_step_functions_not_the_trainer() -> None:
    """One batch walks loop -> schedule -> the step function it was given: no way back up to the Trainer."""
    given: list[Any] = []

    class Watching(DefaultSchedule):
        def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
            given.append(steps)
            result = super().forward_backward(steps, batch, boundary)
            assert result["custom"]  # the override ran
            return result

        def forward(self, steps: Steps, batch: Any) -> dict[str, Any]:
            given.append(steps)
            return super().forward(steps, batch)

    class Custom(Trainer):
        def train_step(self, batch: Any) -> dict[str, Any]:
            return {**super().train_step(batch), "custom": True}

    engine = make_engine()
    trainer = Custom(engine, schedule=Watching())
    trainer.fit(loader(16, 8), epochs=2, test_dataloader=loader(8, 8))
    assert len(given) == 2 * (2 + 1) and trainer.cur_step == 4
    assert all(type(s) is Steps and s.engine is engine and s.owner == "Custom" for s in given)
    # the override is handed over; eval_step is Trainer's own, whose forward-and-loss the Steps hold
    assert all(s.train_step == trainer.train_step and s.eval_step.__self__ is trainer for s in given)
    # the same seam runs a batch by hand, as the loop does
    x, y = next(iter(loader(8, 8)))
    result = trainer.schedule.forward_backward(trainer.schedule_steps(), (x, y), boundary=True)
    assert result["custom"] and engine.step()
    with pytest.raises(TrainerError, match=r"^my loop\.train_step returned a dict without"):
        no_label = Steps(engine, lambda b: {"loss": 0}, trainer.eval_step, "my loop")
        DefaultSchedule().forward_backward(no_label, (x, y), True)


def test_a_train_step_that_returns_no_loss_is_a_clear_error() -> None:
    class Bad(Trainer):
        def train_step(self, batch: Any) -> dict[str, Any]:
            return {"output": None}

    with pytest.raises(TrainerError, match=r"train_step returned a dict without \['loss', 'label', 'batch_size'\]"):
        Bad(make_engine()).fit(loader(8, 8), epochs=1)


def test_a_model_that_returns_its_loss_needs_no_criterion() -> None:
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_mlp(0)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.net(x)
            return {"logits": logits, "loss": nn.functional.cross_entropy(logits, y)}

    class PassLabel(Trainer):
        def train_step(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            out = self.engine(x, y)
            return {"loss": self.compute_loss(out, None), "output": out, "label": y, "batch_size": len(x)}

    model = WithLoss()
    trainer = PassLabel(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.fit(loader(16, 8), epochs=1)
    assert trainer.cur_step == 2


def test_predict_runs_in_eval_mode_on_a_batch_or_a_loader_and_restores_the_mode() -> None:
    engine = make_engine(seed=0)
    trainer = Trainer(engine)
    x = torch.randn(5, 8)
    with torch.no_grad():
        expected = engine.model(x)
    assert torch.equal(trainer.predict(x), expected)
    assert torch.equal(trainer.predict((x,)), expected)
    out = trainer.predict(loader(20, 8))
    assert out.shape == (20, 4)
    assert engine.model.training


def test_evaluate_returns_the_metrics_without_touching_the_history() -> None:
    trainer = Trainer(make_engine())
    metrics = trainer.evaluate(loader(20, 8), hooks=[hooks.LossHook(), hooks.AccuracyHook()])
    assert set(metrics) == {"test/loss", "test/accuracy"}
    assert trainer.history.names == [] and trainer.hooks == ()
    x, y = tiny_dataset(20).tensors
    with torch.no_grad():
        logits = trainer.engine.model(x)
    assert metrics["test/loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-6)
    assert metrics["test/accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())


def test_the_hook_order_is_logged_at_fit_start() -> None:
    logger = RecordingLogger()
    Trainer(make_engine(), logger=logger).fit(loader(8, 8), epochs=1,
                                              hooks=[hooks.LogMetricByEpochHook(), hooks.LossHook()])  # fmt: skip
    table = logger.lines("in the order they run")[0].splitlines()
    assert "LossHook" in table[1] and "LogMetricByEpochHook" in table[2]


def _resumable_run(
    stop_at: int | None, saved: dict[str, Any], state: dict[str, Any] | None = None, restore_in_hook: bool = True
) -> Trainer:
    """2 epochs of 9 batches, accumulation 2, dropout; at ``stop_at`` micro-steps save the state and die."""
    torch.manual_seed(123)
    engine = make_engine(accumulation=2, dropout=0.3)
    trainer = Trainer(engine)
    sched = hooks.LRSchedulerHook(torch.optim.lr_scheduler.StepLR(engine.optimizer, step_size=3), by_epoch=False)

    class SaveThenDie(hooks.BaseHook):
        priority = 100

        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.micro_step == stop_at:
                saved.update(engine=engine.state_dict(), trainer=trainer.state_dict(), hooks=trainer.hook_states(),
                             rng=torch.get_rng_state())  # fmt: skip
                raise RuntimeError("killed")

    class Restore(hooks.BaseHook):
        """What a checkpoint hook does on resume: load everything once every hook is set up."""

        priority = hooks.Priority.LOWEST

        def before_train(self) -> None:
            if state is not None:
                engine.load_state_dict(state["engine"])
                self.trainer.load_state_dict(state["trainer"])
                self.trainer.load_hook_states(state["hooks"])
                torch.set_rng_state(state["rng"])

    # A stateful torchmetrics metric: its accumulated state must cross the resume like LossHook's sums.
    accuracy = hooks.MetricHook(MulticlassAccuracy(num_classes=4), "acc", on="train")
    hook_list = [hooks.LossHook(), accuracy, sched, SaveThenDie(), Restore()]
    if state is not None and not restore_in_hook:  # the functional way: load, then fit
        engine.load_state_dict(state["engine"])
        trainer.load_state_dict(state["trainer"])
        trainer.load_hook_states(state["hooks"])
        torch.set_rng_state(state["rng"])
        state = None
    trainer.fit(loader(72, 8, shuffle=True), epochs=2, hooks=hook_list)
    return trainer


@pytest.mark.parametrize("fold_every", [4, 128], ids=["folds-4", "folds-128"])  # metric hooks' pending values
@pytest.mark.parametrize("restore_in_hook", [True, False], ids=["from-before_train", "before-fit"])
@pytest.mark.parametrize("stop_at", [5, 9, 12])  # mid-cycle in epoch 1, epoch 1's last batch, mid epoch 2
def test_resuming_from_saved_trainer_engine_and_hook_state_ends_bit_identical(
    stop_at: int, restore_in_hook: bool, fold_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_module, "_FOLD_EVERY", fold_every)
    reference = _resumable_run(None, {})
    saved: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="killed"):
        _resumable_run(stop_at, saved)
    assert saved["trainer"]["fit"]["active"]
    resumed = _resumable_run(None, {}, state=saved, restore_in_hook=restore_in_hook)
    assert all_equal(params(resumed.engine.model), params(reference.engine.model))
    assert resumed.history.values("train/loss") == reference.history.values("train/loss")
    assert resumed.history.values("train/acc") == reference.history.values("train/acc")  # exact: same counts
    assert (resumed.cur_epoch, resumed.cur_step, resumed.micro_step) == (2, 10, 18)


def test_continue_at_makes_the_next_fit_end_at_the_runs_own_step_count() -> None:
    """detectron2's train(start_iter, max_iter) numbers updates from 0 across calls: continue_at(step)."""
    trainer = Trainer(make_engine())
    trainer.fit(loader(), max_steps=2)
    trainer.continue_at(5)
    assert (trainer.cur_step, trainer.batches_seen, trainer.storage.step) == (5, 5, 5)
    trainer.fit(loader(), max_steps=7)  # the run that started at 0 ends at update 7: 2 more
    assert (trainer.cur_step, trainer.batches_seen, trainer.max_steps) == (7, 7, 7)
    for bad in (-1, 2.0, True):
        with pytest.raises(TrainerError, match="continue_at"):
            trainer.continue_at(bad)  # type: ignore[arg-type]
