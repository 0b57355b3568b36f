"""pytorch-accelerated programs on ember.compat.pytorch_accelerated: the Trainer's overridable
methods and events, its callbacks, its checkpoints. pytorch-accelerated's own example programs,
and their Trainers' state on one and two processes, are tests/seeds/test_peer_programs.py's."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import TensorDataset

from ember.compat.pytorch_accelerated import Trainer, TrainerPlaceholderValues
from ember.compat.pytorch_accelerated.callbacks import (
    EarlyStoppingCallback,
    LimitBatchesCallback,
    PrintProgressCallback,
    StopTrainingError,
    TerminateOnNaNCallback,
    TrainerCallback,
)
from ember.compat.pytorch_accelerated.trainer import TrainerWithTimmScheduler
from ember.compat.pytorch_accelerated.utils import LimitBatches
from ember.errors import CheckpointError, HookError, TrainerError
from ember.trainer import hooks

QUIET = {"num_workers": 0}  # the examples keep pytorch-accelerated's worker per CPU; unit tests need none


def _data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _trainer(callbacks: Any = (), seed: int = 0, cls: type[Trainer] = Trainer) -> Trainer:
    model = _model(seed)
    return cls(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), callbacks)


def _train(trainer: Trainer, **kwargs: Any) -> None:
    args: dict[str, Any] = {"train_dataset": _data(40, 1), "eval_dataset": _data(16, 2), "num_epochs": 2,
                            "per_device_batch_size": 8, "train_dataloader_kwargs": QUIET,
                            "eval_dataloader_kwargs": QUIET}  # fmt: skip
    trainer.train(**{**args, **kwargs})


# -- the Trainer's methods and events ------------------------------------------------------------------


def test_methods_and_callback_events_run_in_pytorch_accelerateds_order() -> None:
    log: list[str] = []
    methods = ("training_run_start", "train_epoch_start", "calculate_train_batch_loss", "backward_step",
               "optimizer_step", "scheduler_step", "optimizer_zero_grad", "train_epoch_end", "eval_epoch_start",
               "calculate_eval_batch_loss", "eval_epoch_end", "training_run_epoch_end", "training_run_end")  # fmt: skip

    def traced(name: str) -> Any:
        def method(self: Trainer, *args: Any) -> Any:
            log.append(name)
            return getattr(Trainer, name)(self, *args)

        return method

    def event(name: str) -> Any:
        return lambda self, trainer, **kwargs: log.append(name)

    Tracing = type("Tracing", (Trainer,), {m: traced(m) for m in methods})
    Events = type("Events", (TrainerCallback,), {e: event(e) for e in (
        "on_init_end", "on_training_run_start", "on_train_epoch_start", "on_train_step_start", "on_train_step_end",
        "on_train_epoch_end", "on_eval_epoch_start", "on_eval_step_start", "on_eval_step_end", "on_eval_epoch_end",
        "on_training_run_epoch_end", "on_training_run_end")})  # fmt: skip
    trainer = _trainer([Events], cls=Tracing)
    constant = functools.partial(LambdaLR, lr_lambda=lambda step: 1.0)
    _train(trainer, train_dataset=_data(24, 1), eval_dataset=_data(8, 2), num_epochs=1,
           gradient_accumulation_steps=2, create_scheduler_fn=constant)  # fmt: skip
    step = ["on_train_step_start", "calculate_train_batch_loss", "backward_step"]
    update = ["optimizer_step", "scheduler_step", "optimizer_zero_grad"]
    assert log == [
        "on_init_end", "training_run_start", "on_training_run_start", "train_epoch_start", "on_train_epoch_start",
        *step, "on_train_step_end",  # batch 1 of 3 opens an accumulation cycle of 2
        *step, *update, "on_train_step_end",
        *step, *update, "on_train_step_end",  # the epoch's last batch closes a short cycle
        "train_epoch_end", "on_train_epoch_end",
        "eval_epoch_start", "on_eval_epoch_start",
        "on_eval_step_start", "calculate_eval_batch_loss", "on_eval_step_end",
        "eval_epoch_end", "on_eval_epoch_end", "training_run_epoch_end", "on_training_run_epoch_end",
        "training_run_end", "on_training_run_end",
    ]  # fmt: skip
    assert trainer.scheduler.last_epoch == 2 and trainer.cur_step == 2


def test_accumulation_and_gradient_clip_value_are_a_hand_loop_bit_for_bit() -> None:
    trainer = _trainer()
    _train(trainer, eval_dataset=None, gradient_accumulation_steps=2, gradient_clip_value=0.05,
           train_dataloader_kwargs={"shuffle": False, "num_workers": 0})  # fmt: skip
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = _data(40, 1).tensors
    for _ in range(2):
        for i in range(5):  # batches of 8: cycles of 2, 2 and 1
            (nn.functional.cross_entropy(model(x[i * 8 : i * 8 + 8]), y[i * 8 : i * 8 + 8]) / 2).backward()
            if i % 2 == 1 or i == 4:
                torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
                optimizer.step()
                optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trainer.model.parameters(), strict=True))
    assert trainer.run_config.num_update_steps_per_epoch == 3 and trainer.cur_step == 6


def test_all_four_placeholders_are_the_runs_numbers() -> None:
    seen: dict[str, int] = {}

    def factory(optimizer: torch.optim.Optimizer, **numbers: int) -> LambdaLR:
        seen.update(numbers)
        return LambdaLR(optimizer, lambda step: 1.0)

    P = TrainerPlaceholderValues
    create = functools.partial(factory, epochs=P.NUM_EPOCHS, updates=P.NUM_UPDATE_STEPS_PER_EPOCH,
                               train=P.TRAIN_DATALOADER_LEN, eval=P.EVAL_DATALOADER_LEN,
                               combined=P.NUM_UPDATE_STEPS_PER_EPOCH * 2 + P.EVAL_DATALOADER_LEN)  # fmt: skip
    _train(_trainer(), num_epochs=3, gradient_accumulation_steps=2, create_scheduler_fn=create)
    assert seen == {"epochs": 3, "updates": 3, "train": 5, "eval": 2, "combined": 8}


def test_a_stop_training_error_ends_the_run_after_telling_every_callback() -> None:
    log: list[str] = []

    class StopAfterFirstEpoch(TrainerCallback):
        def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
            raise StopTrainingError("enough")

        def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
            log.append("on_stop_training_error")

        def on_eval_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
            log.append("eval")

        def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
            log.append("on_training_run_end")

    trainer = _trainer([StopAfterFirstEpoch])
    _train(trainer, num_epochs=5)
    assert log == ["on_stop_training_error", "on_training_run_end"]  # no evaluation after the stop
    assert trainer.cur_epoch == 1 and trainer.stop_reason == "enough"
    assert trainer.run_history.current_epoch == 1 and trainer.run_history.get_metric_names() == {"train_loss_epoch"}


def test_a_nan_evaluation_loss_stops_the_run_and_exits_with_the_reason() -> None:
    def nan_when_evaluating(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(out, y)
        return loss if torch.is_grad_enabled() else loss * float("nan")

    model = _model()
    trainer = Trainer(model, nan_when_evaluating, torch.optim.SGD(model.parameters(), lr=0.1), [TerminateOnNaNCallback])
    with pytest.raises(SystemExit, match="non-finite test loss"):
        _train(trainer, num_epochs=5)
    assert trainer.cur_epoch == 1


def test_a_misspelt_callback_event_is_an_error_and_a_custom_event_can_be_called() -> None:
    class Typo(TrainerCallback):
        def on_train_epoch_ends(self, trainer: Any, **kwargs: Any) -> None:
            pass

    with pytest.raises(HookError, match="did you mean 'on_train_epoch_end'"):
        _trainer([Typo])
    calls: list[int] = []

    class Custom(TrainerCallback):
        def on_my_own_event(self, trainer: Any, value: int, **kwargs: Any) -> None:
            calls.append(value)

    trainer = _trainer([Custom])
    trainer.callback_handler.call_event("on_my_own_event", trainer, value=3)
    assert calls == [3]
    with pytest.raises(HookError, match="given twice"):
        _trainer([Custom, Custom()])


def test_ember_hooks_mix_with_callbacks_and_a_users_loss_hook_replaces_the_trainers() -> None:
    trainer = _trainer([hooks.AccuracyHook(), hooks.LossHook(), EarlyStoppingCallback(early_stopping_patience=5)])
    _train(trainer)
    assert len(trainer.history.values("test/accuracy")) == 2 and len(trainer.history.values("test/loss")) == 2
    assert trainer.run_history.get_metric_values("eval_loss_epoch") == trainer.history.values("test/loss")
    assert trainer.run_history.get_metric_values("train_loss_epoch") == trainer.history.values("train/loss")


def test_save_and_load_checkpoint_restore_weights_and_optimizer_and_return_the_kwargs(tmp_path: Path) -> None:
    trainer = _trainer()
    _train(trainer, num_epochs=1)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in trainer.optimizer.state.values()]
    trainer.save_checkpoint(tmp_path / "ckpt.pt", checkpoint_kwargs={"eval_loss_epoch": 0.25})
    _train(trainer, num_epochs=1)
    assert not torch.equal(trainer.model.state_dict()["0.weight"], weights["0.weight"])
    # what a pytorch-accelerated user reads with a plain torch.load (seed 003)
    plain = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert plain["eval_loss_epoch"] == 0.25 and set(plain["model_state_dict"]) == set(weights)
    assert all(torch.equal(v, plain["model_state_dict"][k]) for k, v in weights.items())
    assert plain["optimizer_state_dict"]["state"].keys() == trainer.optimizer.state_dict()["state"].keys()
    loaded = trainer.load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded["eval_loss_epoch"] == 0.25 and "model_state_dict" in loaded
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in weights.items())
    restored = [s["momentum_buffer"] for s in trainer.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, restored, strict=True))


def test_early_stopping_callback_counts_improvements_above_the_threshold_and_resets_per_run() -> None:
    never = EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=100.0)
    trainer = _trainer([never])
    _train(trainer, num_epochs=5)
    assert trainer.cur_epoch == 2  # the first epoch sets the best, the second does not beat it by 100
    never.reset_on_train = False
    _train(trainer, num_epochs=5, reset_run_history=False)
    assert trainer.cur_epoch == 3  # the count went on: one more epoch without improvement stops it


def test_the_timm_scheduler_trainer_steps_by_update_and_by_epoch() -> None:
    calls: list[tuple[str, int]] = []

    class TimmLike:
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self.optimizer = optimizer

        def step_update(self, num_updates: int) -> None:
            calls.append(("update", num_updates))

        def step(self, epoch: int) -> None:
            calls.append(("epoch", epoch))

    _train(_trainer(cls=TrainerWithTimmScheduler), num_epochs=2, create_scheduler_fn=TimmLike)
    # 5 updates per epoch; pytorch-accelerated counts from current_epoch * batches (1-based epochs).
    assert calls == [*(("update", n) for n in range(6, 11)), ("epoch", 2), *(("update", n) for n in range(11, 16)),
                     ("epoch", 3)]  # fmt: skip


def test_bad_train_arguments_and_step_results_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="gradient_accumulation_steps must be an int >= 1"):
        _train(_trainer(), gradient_accumulation_steps=0)
    # issue 31 item 10: each one an ember error naming the argument, before anything runs
    trainer = _trainer()
    for kwargs, message in [
        ({"per_device_batch_size": 0}, "per_device_batch_size must be an int >= 1, got 0"),
        ({"per_device_batch_size": -4}, "per_device_batch_size must be an int >= 1, got -4"),
        ({"train_dataset": None}, r"train\(train_dataset=None\)"),
        ({"create_scheduler_fn": 5}, "create_scheduler_fn must be a function of the optimizer"),
        ({"train_dataloader_kwargs": {"batchsize": 2}}, r"'batchsize' \(did you mean 'batch_size'\?\)"),
        ({"eval_dataloader_kwargs": {"shufle": True}}, r"'shufle' \(did you mean 'shuffle'\?\)"),
        ({"num_epochs": 0}, "num_epochs must be an int >= 1"),
    ]:
        with pytest.raises(TrainerError, match=message):
            _train(trainer, **kwargs)
    assert trainer.cur_step == 0  # nothing ran
    with pytest.raises(TrainerError, match="checkpoint_kwargs uses \\['model_state_dict'\\]"):
        trainer.save_checkpoint(tmp_path / "x.pt", checkpoint_kwargs={"model_state_dict": {}})
    sharded = tmp_path / "ckpt-e0001-s000000004.ckpt"  # a sharded checkpoint is a directory of that name
    sharded.mkdir()
    with pytest.raises(CheckpointError, match=r"sharded checkpoint directory.*resume_from=path"):
        trainer.load_checkpoint(sharded)
    with pytest.raises(TrainerError, match="gradient_clip_value must be a number > 0"):
        _train(_trainer(), gradient_clip_value=-1.0)

    class NoBatchSize(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            out = self.model(x)
            return {"loss": self.loss_func(out, y), "model_outputs": out}

    with pytest.raises(TrainerError, match=r"calculate_train_batch_loss returned a dict without \['batch_size'\]"):
        _train(_trainer(cls=NoBatchSize))


def test_assigning_another_loss_func_is_an_error_not_ignored() -> None:
    trainer = _trainer()
    trainer.loss_func = trainer.loss_func  # the same one (timm examples' TimmTrainer re-assigns it): fine
    with pytest.raises(TrainerError, match=r"trainer.loss_func = .*override calculate_eval_batch_loss"):
        trainer.loss_func = nn.MSELoss()  # the Engine's criterion would stay the first one


def test_the_defaults_are_pytorch_accelerateds() -> None:
    trainer = _trainer(callbacks=Trainer.__init__.__defaults__[0])  # type: ignore[index]
    assert trainer.callback_handler.callback_list == [
        "MoveModulesToDeviceCallback", "TerminateOnNaNCallback", "PrintProgressCallback", "ProgressBarCallback",
        "LogMetricsCallback",
    ]  # fmt: skip
    kwargs = trainer.get_default_train_dl_kwargs(16)
    assert kwargs["shuffle"] is True and kwargs["batch_size"] == 16 and kwargs["num_workers"] >= 1
    assert trainer.get_default_eval_dl_kwargs(16)["shuffle"] is False
    assert isinstance(trainer.optimizer, torch.optim.Optimizer) and math.isclose(trainer.optimizer.defaults["lr"], 0.1)


# -- what pytorch-accelerated's own tests check through private methods or mocks (tests/peers) --------


@pytest.mark.parametrize(("batches", "accumulation", "epochs", "max_steps", "updates"),
                         [(40, 2, 10, 15, 15), (10, 1, 2, 7, 7), (6, 1, 2, None, 12)])  # fmt: skip
def test_max_num_train_steps_stops_at_that_many_updates(
    batches: int, accumulation: int, epochs: int, max_steps: int | None, updates: int
) -> None:
    trainer = _trainer()
    _train(trainer, train_dataset=_data(batches, 3), per_device_batch_size=1, num_epochs=epochs,
           max_num_train_steps=max_steps, gradient_accumulation_steps=accumulation, eval_dataset=None)  # fmt: skip
    assert trainer.cur_step == updates


def test_limit_batches_adds_its_callback_first_only_inside_the_context() -> None:
    with LimitBatches(2):
        limited = _trainer(callbacks=(PrintProgressCallback,))
    plain = _trainer()
    callback = limited.callback_handler.callbacks[0]
    assert isinstance(callback, LimitBatchesCallback) and callback.num_batches == 2
    assert not any(isinstance(c, LimitBatchesCallback) for c in plain.callback_handler)
    _train(limited, num_epochs=2)
    assert limited.cur_step == 4 and limited.run_config.num_update_steps_per_epoch == 2
