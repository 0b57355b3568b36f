"""Hook registration, order, names, stopping, and state round-trips."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import pytest
import torch
from torchmetrics.classification import MulticlassAccuracy

from ember.errors import HookError, TrainerError
from ember.trainer import StopTraining, Trainer, hooks
from ember.trainer.hooks import Priority
from tests.trainer.helpers import loader, make_engine


class Recorder(hooks.BaseHook):
    """Appends ``(name, event)`` to a shared list."""

    def __init__(self, log: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = log

    def before_train(self) -> None:
        self.log.append((self.name, "before_train"))

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.log.append((self.name, "after_train_iter"))


def test_hooks_run_by_priority_then_registration_order() -> None:
    log: list[tuple[str, str]] = []
    registered = [
        Recorder(log, name="late", priority=Priority.LOW),
        Recorder(log, name="first-normal"),
        Recorder(log, name="early", priority="HIGH"),
        Recorder(log, name="second-normal", priority=50),
        Recorder(log, name="highest", priority=0),
    ]
    trainer = Trainer(make_engine())
    trainer.fit(loader(8, 8), epochs=1, hooks=registered)
    order = ["highest", "early", "first-normal", "second-normal", "late"]
    assert [n for n, e in log if e == "before_train"] == order
    assert [n for n, e in log if e == "after_train_iter"] == order
    assert [h.name for h in trainer.hooks] == order


def test_a_class_level_priority_is_kept_when_init_gives_none() -> None:
    class Late(hooks.BaseHook):
        priority = Priority.LOWEST

    class NoSuperInit(hooks.BaseHook):
        def __init__(self) -> None:
            self.x = 1

    assert Late().priority == 100
    trainer = Trainer(make_engine())
    trainer.fit(loader(8, 8), epochs=1, hooks=[Late(), NoSuperInit()])
    assert [h.name for h in trainer.hooks] == ["NoSuperInit", "Late"]


@pytest.mark.parametrize(
    ("method", "suggestion"),
    [
        ("after_train_itr", "after_train_iter"),
        ("befor_train_epoch", "before_train_epoch"),
        ("on_train_epoch_end", "after_train_epoch"),
        ("after_val_epoch", "after_test_epoch"),
        ("before_step", "before_train_iter"),
    ],
)
def test_a_misspelt_lifecycle_method_is_rejected_at_registration_with_did_you_mean(
    method: str, suggestion: str
) -> None:
    cls = type("Typo", (hooks.BaseHook,), {method: lambda self, *a: None})
    with pytest.raises(HookError, match=f"Typo.{method} is not a lifecycle method.*did you mean '{suggestion}'"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[cls()])


def test_public_helpers_and_private_methods_are_allowed_in_hooks() -> None:
    class Helper(hooks.BaseHook):
        def compute(self) -> int:
            return 1

        def _after_something(self) -> None:
            pass

    Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[Helper()])


def test_a_lifecycle_method_with_the_wrong_signature_is_rejected() -> None:
    class NoArgs(hooks.BaseHook):
        def after_train_iter(self) -> None:  # type: ignore[override]
            pass

    with pytest.raises(HookError, match=r"NoArgs.after_train_iter must accept \(output, label, loss\)"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[NoArgs()])


def test_lifecycle_methods_may_take_the_trainer_first_and_mix_with_the_native_form() -> None:
    calls: list[tuple[str, Any]] = []

    class ColossalStyle(hooks.BaseHook):  # Colossal-AI / mmengine: the trainer is the first argument
        def after_hook_is_attached(self, trainer: Any) -> None:
            calls.append(("attached", trainer.cur_step))

        def before_train(self, trainer: Any) -> None:
            calls.append(("before_train", trainer is not None and trainer.fitting))

        def after_train_iter(self, trainer: Any, output: Any, label: Any, loss: Any) -> None:
            calls.append(("after_train_iter", (trainer.cur_step, tuple(output.shape), tuple(label.shape))))

        def after_train_epoch(self, runner: Any) -> None:  # any name: the arguments decide
            calls.append(("after_train_epoch", runner.cur_epoch))

    class Native(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            calls.append(("native", self.trainer.cur_step))

    trainer = Trainer(make_engine())
    trainer.fit(loader(8, 4), epochs=1, hooks=[ColossalStyle(), Native()])
    assert calls == [
        ("attached", 0),
        ("before_train", True),
        ("after_train_iter", (1, (4, 4), (4,))),
        ("native", 1),
        ("after_train_iter", (2, (4, 4), (4,))),
        ("native", 2),
        ("after_train_epoch", 0),
    ]


def test_a_method_taking_neither_form_names_both_in_its_error() -> None:
    class Wrong(hooks.BaseHook):
        def after_train_iter(self, trainer: Any, output: Any) -> None:  # type: ignore[override]
            pass

    wanted = r"must accept \(output, label, loss\), or the trainer first: \(trainer, output"
    with pytest.raises(HookError, match=wanted):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[Wrong()])


@pytest.mark.parametrize(
    ("hook_list", "fragment"),
    [
        (lambda: [object()], "BaseHook subclasses"),
        (lambda: (lambda h: [h, h])(hooks.LossHook()), "passed twice"),
        (lambda: [hooks.LossHook(name="a"), hooks.AccuracyHook(name="a")], "two hooks are named 'a'"),
        (lambda: hooks.LossHook(), "list of hooks"),
    ],
)
def test_bad_hook_lists_are_rejected_with_a_clear_error(hook_list: Any, fragment: str) -> None:
    with pytest.raises(HookError, match=fragment):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=hook_list())


@pytest.mark.parametrize(
    ("first", "second", "metric"),
    [
        (lambda: hooks.LossHook(), lambda: hooks.LossHook(on="test"), "test/loss"),
        (lambda: hooks.AccuracyHook(), lambda: hooks.MetricHook(lambda o, y: 1.0, "accuracy"), "test/accuracy"),
        (lambda: hooks.LossHook(), lambda: hooks.MetricHook(lambda o, y: 0.0, "loss", on="train"), "train/loss"),
    ],
)
def test_two_hooks_recording_one_metric_are_rejected_at_registration(first: Any, second: Any, metric: str) -> None:
    trainer = Trainer(make_engine())
    with pytest.raises(HookError, match=f"both record '{metric}'"):
        trainer.fit(loader(8, 8), epochs=1, hooks=[first(), second()])
    assert trainer.cur_step == 0  # refused before anything ran


def test_hooks_recording_different_phases_of_one_metric_are_fine() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(8, 8), epochs=1, test_dataloader=loader(8, 8),
                hooks=[hooks.LossHook(on="train"), hooks.LossHook(on="test")])  # fmt: skip
    assert {"train/loss", "test/loss"} <= set(trainer.history.names)


@pytest.mark.parametrize("priority", [-1, 101, 1.5, "URGENT", True])
def test_bad_priorities_are_rejected(priority: Any) -> None:
    with pytest.raises(HookError, match="priority"):
        hooks.BaseHook(priority=priority)


def test_default_names_get_numbered_suffixes_and_explicit_names_stay() -> None:
    class Plain(hooks.BaseHook):
        pass

    trainer = Trainer(make_engine())
    hs = [
        Plain(),
        hooks.LossHook(on="train"),
        Plain(),
        hooks.AccuracyHook(name="acc"),
        hooks.LossHook(on="test"),
        Plain(),
    ]
    trainer.fit(loader(8, 8), epochs=1, hooks=hs)
    assert [h.name for h in hs] == ["Plain", "LossHook", "Plain#2", "acc", "LossHook#2", "Plain#3"]
    assert trainer.get_hook("LossHook#2") is hs[4]
    with pytest.raises(TrainerError, match="no hook named"):
        trainer.get_hook("nope")


def test_hooks_hold_the_trainer_weakly_and_complain_when_unattached() -> None:
    hook = hooks.LossHook()
    with pytest.raises(HookError, match="not registered"):
        _ = hook.trainer
    trainer = Trainer(make_engine())
    trainer.fit(loader(8, 8), epochs=1, hooks=[hook])
    assert isinstance(hook.trainer, weakref.ProxyType)
    ref = weakref.ref(trainer)
    del trainer
    assert ref() is None


def test_after_hook_is_attached_runs_at_registration() -> None:
    calls: list[int] = []

    class Attach(hooks.BaseHook):
        def after_hook_is_attached(self) -> None:
            calls.append(self.trainer.cur_epoch)

    Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[Attach()])
    assert calls == [0]


def test_per_batch_calls_a_hooks_settings_make_no_ops_are_skipped() -> None:
    engine = make_engine()
    sched = torch.optim.lr_scheduler.StepLR(engine.optimizer, step_size=1)
    by_epoch, by_step = hooks.LRSchedulerHook(sched, by_epoch=True), hooks.LRSchedulerHook(sched, by_epoch=False)
    per_batch = {"after_train_iter", "after_update"}
    assert not per_batch & set(by_epoch.events()) and "after_train_epoch" in by_epoch.events()
    assert "after_update" in by_step.events()
    test_only = hooks.AccuracyHook()  # measures "test" by default
    assert not {"after_train_iter", "before_train_epoch", "after_train_epoch"} & set(test_only.events())
    assert {"after_test_iter", "after_test_epoch"} <= set(test_only.events())
    assert "after_train_iter" in hooks.AccuracyHook(on=("train", "test")).events()
    # the loss still goes to the step storage every batch when only the test loss is averaged
    loss_hook = hooks.LossHook(on="test")
    assert "after_train_iter" in loss_hook.events() and "after_train_epoch" not in loss_hook.events()
    trainer = Trainer(engine)
    trainer.fit(loader(8, 8), epochs=2, test_dataloader=loader(8, 8), hooks=[by_epoch, test_only, loss_hook])
    assert [h.name for h, _ in trainer._bus._calls["after_train_iter"]] == [loss_hook.name]
    assert sched.last_epoch == 2  # stepped at each epoch's end, not per batch
    assert len(trainer.history.values("test/accuracy")) == 2 and "train/loss" not in trainer.history
    assert trainer.storage.latest_step("train/loss") == trainer.cur_step


def test_stop_training_exception_ends_fit_cleanly_after_the_current_update() -> None:
    events: list[str] = []

    class Stopper(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.micro_step == 5:
                raise StopTraining("enough")

        def after_train_epoch(self) -> None:
            events.append("after_train_epoch")

        def after_train(self) -> None:
            events.append("after_train")

    trainer = Trainer(make_engine(accumulation=4))
    trainer.fit(loader(128, 8), epochs=3, hooks=[Stopper(), hooks.LossHook()])
    assert trainer.micro_step == 8  # the accumulation cycle the stop came in was finished
    assert trainer.cur_step == 2 and trainer.cur_epoch == 1
    assert events == ["after_train_epoch", "after_train"]
    assert trainer.stop_reason == "enough"
    assert trainer.history.epochs("train/loss") == [0]


def test_trainer_stop_from_a_hook_skips_the_pending_test_pass() -> None:
    tested: list[int] = []

    class StopNow(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            self.trainer.stop("by request")

        def before_test(self) -> None:
            tested.append(1)

    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=2, test_dataloader=loader(8, 8), hooks=[StopNow()])
    assert trainer.cur_step == 1 and tested == []
    assert trainer.stop_reason == "by request"
    trainer.fit(loader(32, 8), epochs=1, hooks=[])  # a new fit starts without the old stop request
    assert trainer.cur_step == 5 and trainer.stop_reason is None


def test_an_after_train_error_after_a_clean_run_is_raised() -> None:
    class BadClose(hooks.BaseHook):
        def after_train(self) -> None:
            raise OSError("disk full")

    closed: list[bool] = []

    class Close(hooks.BaseHook):
        priority = Priority.LOWEST

        def after_train(self) -> None:
            closed.append(True)

    with pytest.raises(OSError, match="disk full"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[BadClose(), Close()])
    assert closed == [True]  # every after_train runs even when one raises


def _hooks_with_state() -> tuple[list[hooks.BaseHook], list[dict[str, Any]], Trainer]:
    """Built-in hooks part-way through an epoch, and their states taken right there."""
    trainer = Trainer(make_engine(accumulation=2))
    sched = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2)
    hs: list[hooks.BaseHook] = [
        hooks.LossHook(),
        hooks.AccuracyHook(on=("train", "test")),
        hooks.MetricHook(lambda o, y: (o.argmax(1) == y).float().mean(), "acc2", on=("train", "test")),
        hooks.MetricHook(MulticlassAccuracy(num_classes=4), "acc3", on=("train", "test")),
        hooks.LRSchedulerHook(sched, by_epoch=False),
        hooks.EarlyStoppingHook("test/loss", patience=5),
        hooks.EMAHook(0.9),
        hooks.TerminateOnNaNHook(),
        hooks.LogMetricByEpochHook(),
    ]
    states: list[dict[str, Any]] = []

    class Snapshot(hooks.BaseHook):
        priority = 100

        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            if self.trainer.micro_step == 11:  # epoch 2, running sums are non-empty
                states.extend(h.state_dict() for h in hs)
                raise StopTraining

    trainer.fit(loader(32, 4), epochs=3, test_dataloader=loader(8, 4), hooks=[*hs, Snapshot()])
    return hs, states, trainer


def test_every_builtin_hooks_state_dict_round_trips_into_a_fresh_hook() -> None:
    _, states, _ = _hooks_with_state()
    fresh, _, _keep = _hooks_with_state()
    for hook, state in zip(fresh, states, strict=True):
        hook.load_state_dict(state)
        assert _plain(hook.state_dict()) == _plain(state), type(hook).__name__
    stateful = {type(h).__name__ for h, s in zip(fresh, states, strict=True) if s}
    assert stateful == {"LossHook", "AccuracyHook", "MetricHook", "LRSchedulerHook", "EarlyStoppingHook", "EMAHook"}
    loss_state = states[0]["acc"]["train"]
    assert loss_state is not None and loss_state[1] > 0  # a mid-epoch running sum was captured
    assert states[5]["best"] is not None and states[6]["num_updates"] > 0
    assert states[3]["metric"]["train"]["updates"] == 3  # batches 9-11 of epoch 2, in torchmetrics' own state


def test_a_stateless_hook_refuses_foreign_state() -> None:
    with pytest.raises(HookError, match="keeps no state"):
        hooks.LogMetricByEpochHook().load_state_dict({"x": 1})


def test_trainer_state_round_trips_and_load_hook_states_checks_names() -> None:
    trainer = Trainer(make_engine())
    trainer.fit(loader(16, 8), epochs=2, hooks=[hooks.LossHook()])
    state = trainer.state_dict()
    other = Trainer(make_engine())
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert state["fit"]["active"] is False and state["cur_epoch"] == 2
    with pytest.raises(TrainerError, match="not registered"):
        trainer.load_hook_states({"Ghost": {"a": 1}})
    pending = Trainer(make_engine())
    pending.load_hook_states({"Ghost": {"a": 1}})  # before fit: waits for the hooks
    with pytest.raises(TrainerError, match="not registered"):
        pending.fit(loader(8, 8), epochs=1, hooks=[hooks.LossHook()])
    with pytest.raises(TrainerError, match="missing"):
        other.load_state_dict({"cur_epoch": 1})


def _plain(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# -- the per-update event ------------------------------------------------------------------------


class UpdateRecorder(hooks.BaseHook):
    """Logs each batch and each update with the counters the hook sees then."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, int]] = []

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.log.append(("iter", self.trainer.micro_step, self.trainer.cur_step))

    def after_update(self) -> None:
        self.log.append(("update", self.trainer.micro_step, self.trainer.cur_step))


def test_after_update_runs_once_per_update_with_accumulation_after_the_batchs_after_train_iter() -> None:
    recorder = UpdateRecorder()
    trainer = Trainer(make_engine(accumulation=3))
    trainer.fit(loader(48, 8), epochs=1, hooks=[recorder])  # 6 batches: updates after batches 3 and 6
    updates = [entry for entry in recorder.log if entry[0] == "update"]
    assert updates == [("update", 3, 1), ("update", 6, 2)] and trainer.cur_step == 2
    assert recorder.log.index(("update", 3, 1)) == recorder.log.index(("iter", 3, 1)) + 1


def test_after_update_is_not_called_for_a_skipped_update() -> None:
    engine = make_engine()
    real_step, calls = engine.step, [0]

    def every_other_skipped() -> bool:  # as an fp16 overflow would
        calls[0] += 1
        return bool(real_step()) and calls[0] % 2 == 0

    engine.step = every_other_skipped  # type: ignore[method-assign]
    recorder = UpdateRecorder()
    trainer = Trainer(engine)
    trainer.fit(loader(48, 8), epochs=1, hooks=[recorder])
    assert [e for e in recorder.log if e[0] == "update"] == [("update", 2, 1), ("update", 4, 2), ("update", 6, 3)]


@pytest.mark.parametrize(
    ("method", "suggestion"),
    [("after_updte", "after_update"), ("after_step", "after_update"), ("on_step_end", "after_update")],
)
def test_a_misspelt_or_foreign_per_update_method_suggests_after_update(method: str, suggestion: str) -> None:
    cls = type("Typo", (hooks.BaseHook,), {method: lambda self, *a: None})
    with pytest.raises(HookError, match=f"Typo.{method} is not a lifecycle method.*did you mean '{suggestion}'"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[cls()])


def test_on_an_update_batch_after_train_iter_and_after_update_run_in_one_priority_order() -> None:
    log: list[str] = []

    class PerUpdate(hooks.BaseHook):
        priority = Priority.LOW

        def after_update(self) -> None:
            log.append("LOW after_update")

    class PerBatch(hooks.BaseHook):
        def __init__(self, priority: Priority) -> None:
            super().__init__(priority=priority)

        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            log.append(f"{Priority(self.priority).name} after_train_iter")

    registered = [PerBatch(Priority.LOWEST), PerUpdate(), PerBatch(Priority.HIGH)]
    Trainer(make_engine(accumulation=2)).fit(loader(16, 8), epochs=1, hooks=registered)  # 2 batches, 1 update
    assert log == ["HIGH after_train_iter", "LOWEST after_train_iter",
                   "HIGH after_train_iter", "LOW after_update", "LOWEST after_train_iter"]  # fmt: skip
