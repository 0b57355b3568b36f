"""pytorch-accelerated's ``Trainer`` on ember's Trainer.

``Trainer(model, loss_func, optimizer, callbacks, run_history)`` builds an ember Engine over the
model (DDP when the script runs under ``torchrun``/``ember run``: the process group is joined
here when no launch call did it) and is an :class:`ember.trainer.Trainer`: ``train`` runs
ember's loop, with pytorch-accelerated's overridable methods called where pytorch-accelerated
calls them, and callbacks driven by ember's hook events (``_adapter.py``). What differs from
pytorch-accelerated is listed in ``docs/migrating.md``.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import ember
from ember import checkpoint, distributed
from ember.context import get_context, is_launched
from ember.data import make_resumable, to_device
from ember.errors import TrainerError
from ember.trainer import DefaultSchedule, Placeholders, hooks
from ember.trainer import Trainer as EmberTrainer
from ember.trainer.placeholders import resolve_partial

from ._adapter import CallbackDriver
from .callbacks import (
    CallbackHandler,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
)
from .run_config import TrainerRunConfig
from .tracking import InMemoryRunHistory, RunHistory

__all__ = [
    "DEFAULT_CALLBACKS",
    "Trainer",
    "TrainerPlaceholderValues",
    "TrainerWithTimmScheduler",
    "replace_trainer_placeholder_values",
]

DEFAULT_CALLBACKS = (
    MoveModulesToDeviceCallback,
    TerminateOnNaNCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    LogMetricsCallback,
)
"""The callbacks a Trainer gets when none are given."""

TrainerPlaceholderValues = Placeholders
"""ember's :class:`~ember.trainer.Placeholders`: ``NUM_EPOCHS``, ``NUM_UPDATE_STEPS_PER_EPOCH``,
``TRAIN_DATALOADER_LEN``, ``EVAL_DATALOADER_LEN`` (and ``TOTAL_UPDATE_STEPS``), combined with
``*``, ``+``, ``-`` and ``//``."""


def replace_trainer_placeholder_values(trainer: Trainer, instance: Any) -> Any:
    """``instance`` (a ``functools.partial``) with its placeholders replaced by ``trainer``'s numbers."""
    return resolve_partial(instance, trainer.placeholder_numbers())


class _PreparedModel:
    """What ``trainer.model`` is: the user's model, whose calls run through the Engine (autocast,
    DDP, the device) and whose other attributes are the model's own."""

    def __init__(self, engine: ember.Engine) -> None:
        self._engine = engine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine(*args, **kwargs)

    def train(self, mode: bool = True) -> _PreparedModel:
        self._engine.train(mode)
        return self

    def eval(self) -> _PreparedModel:
        return self.train(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine.model, name)

    def __repr__(self) -> str:
        return f"prepared {self._engine.model!r}"


class _PreparedOptimizer(torch.optim.Optimizer):
    """What ``trainer.optimizer`` is: the Engine's optimizer, whose ``step`` is the Engine's
    (unscaling, clipping and the fp16 scaler included) and whose ``zero_grad`` clears at the
    start of an accumulation cycle. Schedulers built over it drive the Engine's optimizer."""

    def __init__(self, engine: ember.Engine) -> None:  # no super().__init__: the state is the Engine's
        self._engine = engine
        self.applied = False
        """Whether the last ``step`` updated the parameters (False: a micro-step or an fp16 skip)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._engine.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._engine.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self._engine.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._engine.optimizer.defaults = value

    @property
    def state(self) -> Any:
        return self._engine.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self._engine.optimizer.state = value

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise TrainerError("the prepared optimizer's step() takes no closure: compute the loss before it")
        self.applied = self._engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._engine.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        return self._engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._engine.optimizer.load_state_dict(dict(state_dict))

    def __repr__(self) -> str:
        return f"prepared {self._engine.optimizer!r}"


class _Schedule(DefaultSchedule):
    """One training batch: ``calculate_train_batch_loss`` (via ``train_step``), then ``backward_step``."""

    def forward_backward(self, trainer: Any, batch: Any, boundary: bool) -> dict[str, Any]:
        if boundary:
            trainer.engine.expect_boundary()
        trainer._closes_cycle = boundary
        result = trainer.train_step(batch)
        trainer.backward_step(result["loss"])
        return result


def _launch_from_environment() -> None:
    """Join the process group ``torchrun``/``ember run`` describe, as accelerate would, once."""
    if not is_launched() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        ember.launch_from_torch(seed=42, verbose=False)


class Trainer(EmberTrainer):
    """pytorch-accelerated's Trainer: ``train``, ``evaluate``, overridable steps, callbacks.

    Args:
        model: the ``nn.Module`` to train.
        loss_func: the loss, called as ``loss_func(model_outputs, labels)``.
        optimizer: an optimizer over the model's parameters.
        callbacks: callback instances or classes, and ember hooks (default
            :data:`DEFAULT_CALLBACKS`).
        run_history: a :class:`~.tracking.RunHistory` (default an in-memory one).

    Example:
        >>> trainer = Trainer(model, loss_func=nn.CrossEntropyLoss(), optimizer=optimizer)
        >>> trainer.train(train_dataset=train_ds, eval_dataset=val_ds, num_epochs=3, per_device_batch_size=32)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_func: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        callbacks: Iterable[Any] = DEFAULT_CALLBACKS,
        run_history: RunHistory | None = None,
    ) -> None:
        _launch_from_environment()
        engine, *_ = ember.initialize(model, optimizer, loss_func)
        super().__init__(engine=engine, schedule=_Schedule())
        self.loss_func = loss_func
        self.callback_handler = CallbackHandler(callbacks)
        if run_history is not None and not isinstance(run_history, RunHistory):
            raise TrainerError(f"run_history must be a RunHistory, got {type(run_history).__name__}")
        self.run_history: RunHistory = run_history if run_history is not None else InMemoryRunHistory()
        self._model, self._optimizer = _PreparedModel(engine), _PreparedOptimizer(engine)
        self._driver = CallbackDriver()
        self.create_scheduler_fn: Callable[..., Any] | None = None
        self.scheduler: Any = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self._train_dataloader: DataLoader[Any] | None = None
        self._eval_dataloader: DataLoader[Any] | None = None
        self._train_dl_kwargs: dict[str, Any] | None = None
        self._eval_dl_kwargs: dict[str, Any] | None = None
        self._closes_cycle = False
        self.run_config: TrainerRunConfig | None = None
        self.callback_handler.call_event("on_init_end", self)

    # -- what pytorch-accelerated's trainer exposes -------------------------------------------------
    @property
    def model(self) -> Any:
        """The model; calling it runs the Engine's forward pass (autocast, DDP, the device)."""
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer; its ``step`` is the Engine's update (see the module docstring)."""
        return self._optimizer

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""
        return self.engine.device

    def gather(self, tensor: Any) -> Any:
        """Every process's ``tensor`` (or nested lists/tuples/dicts of them) concatenated along
        the first dimension; a collective (call it on every process)."""
        if isinstance(tensor, torch.Tensor):
            return distributed.all_gather(tensor)
        if isinstance(tensor, Mapping):
            return {k: self.gather(v) for k, v in tensor.items()}
        if isinstance(tensor, (list, tuple)):
            return type(tensor)(self.gather(v) for v in tensor)
        raise TrainerError(f"gather takes tensors (or lists, tuples and dicts of them), got {type(tensor).__name__}")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the first process of each machine only."""
        if get_context(default=True).local_rank == 0:
            print(*args, **kwargs)

    # -- dataloaders and scheduler ----------------------------------------------------------------
    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """The training dataloader's default arguments: shuffled, pinned on CUDA, a worker per CPU."""
        return {"shuffle": True, "pin_memory": torch.cuda.is_available(), "batch_size": batch_size,
                "num_workers": _default_workers()}  # fmt: skip

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """The evaluation dataloader's default arguments: as for training, not shuffled."""
        return {**self.get_default_train_dl_kwargs(batch_size), "shuffle": False}

    def create_train_dataloader(self, batch_size: int, train_dl_kwargs: dict[str, Any] | None = None) -> Any:
        """A DataLoader over ``train_dataset``: the defaults updated with ``train_dl_kwargs``."""
        self._train_dl_kwargs = {**self.get_default_train_dl_kwargs(batch_size), **(train_dl_kwargs or {})}
        return DataLoader(self.train_dataset, collate_fn=self.collate_fn, **self._train_dl_kwargs)

    def create_eval_dataloader(self, batch_size: int, eval_dl_kwargs: dict[str, Any] | None = None) -> Any:
        """A DataLoader over ``eval_dataset``: the defaults updated with ``eval_dl_kwargs``."""
        self._eval_dl_kwargs = {**self.get_default_eval_dl_kwargs(batch_size), **(eval_dl_kwargs or {})}
        return DataLoader(self.eval_dataset, collate_fn=self.collate_fn, **self._eval_dl_kwargs)

    def placeholder_numbers(self) -> dict[Placeholders, int]:
        """The numbers the scheduler placeholders stand for in this run."""
        numbers = dict(self.placeholder_values)
        if self._eval_dataloader is not None:
            numbers[Placeholders.EVAL_DATALOADER_LEN] = len(self._eval_dataloader)
        return numbers

    def create_scheduler(self) -> Any:
        """``create_scheduler_fn(optimizer)`` with its placeholders replaced (when training starts)."""
        assert self.create_scheduler_fn is not None
        return replace_trainer_placeholder_values(self, self.create_scheduler_fn)(self.optimizer)

    # -- the overridable steps, in the order they run --------------------------------------------------
    def training_run_start(self) -> None:
        """At the start of ``train``, before the callbacks' ``on_training_run_start``."""

    def train_epoch_start(self) -> None:
        """At the start of each training epoch: the model goes into training mode."""
        self.model.train()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Forward a training batch and compute its loss (ember's default step: ``(inputs, label)``).

        Returns:
            A dict with ``loss``, ``model_outputs`` and ``batch_size`` (other keys reach the
            callbacks' ``on_train_step_end``).
        """
        result = EmberTrainer.train_step(self, batch)
        return {"loss": result["loss"], "model_outputs": result["output"], "batch_size": result["batch_size"]}

    def backward_step(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` through the Engine (which divides it by the accumulation steps)."""
        self.engine.backward(loss, boundary=True if self._closes_cycle else None)

    def optimizer_step(self) -> None:
        """Update the parameters (at the end of an accumulation cycle)."""
        self.optimizer.step()

    def scheduler_step(self) -> None:
        """Step the scheduler, after each update that was applied."""
        if self.scheduler is not None:
            self.scheduler.step()

    def optimizer_zero_grad(self) -> None:
        """Clear the gradients after an update."""
        self.optimizer.zero_grad()

    def train_epoch_end(self) -> None:
        """After an epoch's training batches."""

    def eval_epoch_start(self) -> None:
        """At the start of an evaluation epoch: the model goes into evaluation mode."""
        self.model.eval()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Forward an evaluation batch (without gradients) and compute its loss; keys as in training."""
        with torch.no_grad():
            result = EmberTrainer.eval_step(self, batch)
        return {"loss": result["loss"], "model_outputs": result["output"], "batch_size": result["batch_size"]}

    def eval_epoch_end(self) -> None:
        """After an evaluation epoch."""

    def training_run_epoch_end(self) -> None:
        """After an epoch's training and evaluation."""

    def training_run_end(self) -> None:
        """At the end of ``train``."""

    def evaluation_run_start(self) -> None:
        """At the start of a standalone ``evaluate``."""

    def evaluation_run_end(self) -> None:
        """At the end of a standalone ``evaluate``."""

    # -- ember's side: how the loop runs these ----------------------------------------------------
    def train_step(self, batch: Any) -> dict[str, Any]:
        """ember's step: ``calculate_train_batch_loss`` on the batch, on the Engine's device."""
        batch = self._on_device(batch)
        return self._step_result(self.calculate_train_batch_loss(batch), batch, "calculate_train_batch_loss")

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """ember's evaluation step: ``calculate_eval_batch_loss``."""
        batch = self._on_device(batch)
        return self._step_result(self.calculate_eval_batch_loss(batch), batch, "calculate_eval_batch_loss")

    def update(self) -> bool:
        """ember's update: at the end of an accumulation cycle ``optimizer_step``, then
        ``scheduler_step`` if the update was applied, then ``optimizer_zero_grad``."""
        if not self.engine.sync_gradients:
            return False
        self._optimizer.applied = False
        self.optimizer_step()
        applied = self._optimizer.applied
        if applied and self.scheduler is not None:
            self.scheduler_step()
        self.optimizer_zero_grad()
        return applied

    def _on_device(self, batch: Any) -> Any:
        return batch if self.engine.device.type == "cpu" else to_device(batch, self.engine.device)

    @staticmethod
    def _step_result(output: Any, batch: Any, where: str) -> dict[str, Any]:
        if not isinstance(output, Mapping):
            raise TrainerError(f"{where} must return a dict with loss, model_outputs and batch_size, got {output!r}")
        missing = [k for k in ("loss", "model_outputs", "batch_size") if k not in output]
        if missing:
            raise TrainerError(f"{where} returned a dict without {missing}: it needs loss, model_outputs, batch_size")
        label = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
        return {"loss": output["loss"], "output": output["model_outputs"], "label": label,
                "batch_size": int(output["batch_size"]), "batch_output": output, "batch": batch}  # fmt: skip

    def _prepare(self, loader: Any) -> Any:
        """Shard ``loader`` across the data-parallel processes (ember's resumable sampler)."""
        sampler = getattr(loader, "sampler", None)
        plain = isinstance(sampler, (RandomSampler, SequentialSampler))
        if self.engine.data_parallel_size > 1 or plain:
            loader = make_resumable(loader, num_replicas=self.engine.data_parallel_size,
                                    rank=self.engine.data_parallel_rank)  # fmt: skip
        loader.device = self.engine.device  # where its batches go (accelerate's loaders have it)
        return loader

    def _hooks(self) -> list[hooks.BaseHook]:
        """The ember hooks of a run: the loss (unless a callback records it), the callback driver,
        and the callbacks that are ember hooks."""
        native = self.callback_handler.ember_hooks
        recorded = {name for hook in native for name in hook.records()}
        phases = [p for p in ("train", "test") if f"{p}/loss" not in recorded]
        loss = [hooks.LossHook(on=phases, name="pytorch_accelerated.loss")] if phases else []
        return [*loss, self._driver, *native]

    # -- runs ---------------------------------------------------------------------------------------
    def train(
        self,
        train_dataset: Any,
        num_epochs: int,
        eval_dataset: Any = None,
        per_device_batch_size: int = 8,
        max_num_train_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        gradient_clip_value: float | None = None,
        create_scheduler_fn: Callable[..., Any] | None = None,
        train_dataloader_kwargs: dict[str, Any] | None = None,
        eval_dataloader_kwargs: dict[str, Any] | None = None,
        reset_run_history: bool = True,
        collate_fn: Callable[..., Any] | None = None,
    ) -> None:
        """Train on ``train_dataset`` for ``num_epochs`` (or ``max_num_train_steps`` updates).

        Args:
            train_dataset: the training dataset.
            num_epochs: epochs to train.
            eval_dataset: evaluated after every epoch (``eval_loss_epoch`` in the run history).
            per_device_batch_size: batch size per process.
            max_num_train_steps: stop after this many optimizer updates (epochs then follow from it).
            gradient_accumulation_steps: micro-batches per update.
            gradient_clip_value: clamp gradient elements to this value at each update.
            create_scheduler_fn: called with the optimizer when training starts, e.g. a
                ``functools.partial`` holding :data:`TrainerPlaceholderValues`.
            train_dataloader_kwargs: overrides of the training DataLoader's arguments.
            eval_dataloader_kwargs: overrides of the evaluation DataLoader's arguments.
            reset_run_history: start a new run history (and ember's counters) first.
            collate_fn: the DataLoaders' collate function.
        """
        accumulation, clip = gradient_accumulation_steps, gradient_clip_value
        if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
            raise TrainerError(f"gradient_accumulation_steps must be a positive int, got {accumulation!r}")
        if clip is not None and not (isinstance(clip, numbers.Real) and not isinstance(clip, bool) and clip > 0):
            raise TrainerError(f"gradient_clip_value must be a number > 0 or None, got {clip!r}")
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.create_scheduler_fn, self.collate_fn = create_scheduler_fn, collate_fn
        if reset_run_history:
            self.run_history.reset()
        batch_size = per_device_batch_size
        self._train_dataloader = self._prepare(self.create_train_dataloader(batch_size, train_dataloader_kwargs))
        self._eval_dataloader = None
        if eval_dataset is not None:
            self._eval_dataloader = self._prepare(self.create_eval_dataloader(batch_size, eval_dataloader_kwargs))
        self.engine.gradient_accumulation = accumulation
        self.engine.clip_grad_value = None if clip is None else float(clip)
        self.run_config = self._create_run_config(batch_size, num_epochs, accumulation, max_num_train_steps, clip)
        self.fit(self._train_dataloader, epochs=self.run_config.num_epochs, max_steps=max_num_train_steps,
                 hooks=self._hooks(), reset_run_history=reset_run_history)  # fmt: skip
        for callback in self.callback_handler:
            if isinstance(callback, TerminateOnNaNCallback) and callback.triggered:
                sys.exit(f"exiting: {callback.reason}")

    def evaluate(  # type: ignore[override]
        self,
        dataset: Any = None,
        per_device_batch_size: int = 8,
        dataloader_kwargs: dict[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
    ) -> None:
        """Evaluate on ``dataset`` (its loss goes into a fresh run history as ``evaluation_loss``).

        Args:
            dataset: the evaluation dataset.
            per_device_batch_size: batch size per process.
            dataloader_kwargs: overrides of the DataLoader's arguments.
            collate_fn: the DataLoader's collate function.
        """
        self.eval_dataset, self.collate_fn = dataset, collate_fn
        self.run_history.reset()
        self._train_dataloader = None
        self._eval_dataloader = self._prepare(self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs))
        if self.run_config is None:
            self.run_config = self._create_run_config(per_device_batch_size, 1, 1, None, None)
        EmberTrainer.evaluate(self, self._eval_dataloader, hooks=self._hooks())

    def _create_run_config(
        self, per_device_batch_size: int, num_epochs: int, gradient_accumulation_steps: int,
        max_num_train_steps: int | None, gradient_clip_value: float | None,
    ) -> TrainerRunConfig:  # fmt: skip
        world = distributed.world_size()
        train_bs = (self._train_dl_kwargs or {}).get("batch_size", per_device_batch_size)
        eval_bs = (self._eval_dl_kwargs or {}).get("batch_size", train_bs)
        per_epoch = 0
        if self._train_dataloader is not None:
            per_epoch = math.ceil(len(self._train_dataloader) / gradient_accumulation_steps)
        if max_num_train_steps is None:
            max_num_train_steps = num_epochs * per_epoch
        elif per_epoch > 0:
            num_epochs = math.ceil(max_num_train_steps / per_epoch)
        ctx = get_context(default=True)
        return TrainerRunConfig(
            num_epochs=num_epochs,
            train_per_device_batch_size=train_bs,
            train_dl_kwargs=self._train_dl_kwargs,
            eval_per_device_batch_size=eval_bs,
            eval_dl_kwargs=self._eval_dl_kwargs,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_clip_value=gradient_clip_value,
            train_total_batch_size=train_bs * world * gradient_accumulation_steps,
            eval_total_batch_size=eval_bs * world,
            num_update_steps_per_epoch=per_epoch,
            max_num_train_steps=max_num_train_steps,
            is_local_process_zero=ctx.local_rank == 0,
            is_world_process_zero=distributed.rank() == 0,
            is_distributed=world > 1,
            mixed_precision=self.engine.precision.name or "no",
        )

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(
        self, save_path: str | os.PathLike[str], checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True, save_per_node: bool = True,
    ) -> None:  # fmt: skip
        """Save the whole training state as an ember checkpoint (a collective: call it on every process).

        Args:
            save_path: the file to write (its parent is created).
            checkpoint_kwargs: your own entries, returned by :meth:`load_checkpoint` (numbers,
                strings, tensors and containers of them).
            save_optimizer: kept for the signature: ember's checkpoints always hold the optimizer.
            save_per_node: kept for the signature: the first process writes, once.
        """
        extra = {
            k: float(v) if isinstance(v, numbers.Real) and not isinstance(v, (bool, int)) else v
            for k, v in (checkpoint_kwargs or {}).items()
        }  # fmt: skip  (NumPy scalars become floats)
        checkpoint.save(save_path, self, extra=extra)

    def load_checkpoint(self, checkpoint_path: str | os.PathLike[str], load_optimizer: bool = True) -> dict[str, Any]:
        """Load the model's weights (and the optimizer's state) from a checkpoint; a collective.

        Returns:
            The ``checkpoint_kwargs`` it was saved with.
        """
        saved = checkpoint.read(checkpoint_path)
        state = self.engine.state_dict()  # the counters and scaler stay as they are now
        state["model"] = checkpoint.model_state(checkpoint_path)
        if load_optimizer:
            state["optimizer"] = saved["engine"]["optimizer"]
        self.engine.load_state_dict(state)
        return dict(saved["meta"].get("extra", {}))


def _default_workers() -> int:
    cpus = os.cpu_count() or 1
    return max(cpus // torch.cuda.device_count() if torch.cuda.is_available() else cpus, 1)


class TrainerWithTimmScheduler(Trainer):
    """A Trainer for timm's schedulers: ``step_update(num_updates)`` after each update and
    ``step(epoch)`` after each evaluation epoch, instead of ``step()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_updates: int | None = None

    def train_epoch_start(self) -> None:
        """Count the updates made before this epoch."""
        super().train_epoch_start()
        assert self._train_dataloader is not None
        self.num_updates = self.run_history.current_epoch * len(self._train_dataloader)

    def eval_epoch_end(self) -> None:
        """Step the scheduler by epoch."""
        if self.scheduler is not None:
            self.scheduler.step(self.run_history.current_epoch + 1)

    def scheduler_step(self) -> None:
        """Step the scheduler by update."""
        self.num_updates = (self.num_updates or 0) + 1
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=self.num_updates)
