"""pytorch-accelerated's ``Trainer`` on ember's Trainer.

``Trainer(model, loss_func, optimizer, callbacks, run_history)`` builds an ember Engine over the
model (DDP when the script runs under ``torchrun``/``ember run``: the process group is joined
here when no launch call did it) and is an :class:`ember.trainer.Trainer`: ``train`` runs
ember's loop, with pytorch-accelerated's overridable methods called where pytorch-accelerated
calls them, and callbacks driven by ember's hook events (``_adapter.py``). What differs from
pytorch-accelerated is listed in ``docs/migrating.md``.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import ember
from ember import distributed
from ember.context import get_context, is_launched
from ember.data import make_resumable, to_device
from ember.errors import TrainerError, describe
from ember.trainer import DefaultSchedule, Placeholders, Steps, hooks
from ember.trainer import Trainer as EmberTrainer
from ember.trainer.placeholders import resolve_partial

from ._adapter import CallbackDriver, LiveEvalLoader
from ._checkpoints import CheckpointMethods
from ._prepared import PreparedModel, PreparedOptimizer
from .callbacks import (
    CallbackHandler,
    LimitBatchesCallback,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
)
from .run_config import TrainerRunConfig
from .tracking import InMemoryRunHistory, RunHistory
from .utils import LIMIT_BATCHES_ENV_VAR, DataLoaderSlice, worker_init_fn

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


def _length(loader: Any) -> int | None:
    try:
        return len(loader) if loader is not None else None
    except TypeError:  # a loader without a length
        return None


def replace_trainer_placeholder_values(trainer: Any, instance: Any) -> Any:
    """``instance`` (a ``functools.partial``) with its placeholders replaced by the numbers of
    ``trainer``'s run: ``run_config.num_epochs``, ``run_config.num_update_steps_per_epoch``
    (all processes together, as pytorch-accelerated 0.1.61 counts them), the lengths of
    ``trainer._train_dataloader`` and ``trainer._eval_dataloader``.

    Example:
        >>> replace_trainer_placeholder_values(trainer, partial(StepLR, step_size=TrainerPlaceholderValues.NUM_EPOCHS))
    """
    config = trainer.run_config
    values: dict[Placeholders, int] = {}
    if config is not None:
        values[Placeholders.NUM_EPOCHS] = config.num_epochs
        values[Placeholders.NUM_UPDATE_STEPS_PER_EPOCH] = config.num_update_steps_per_epoch
        local = getattr(config, "num_local_update_steps_per_epoch", config.num_update_steps_per_epoch)
        values[Placeholders.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH] = local
        values[Placeholders.TOTAL_UPDATE_STEPS] = config.num_epochs * config.num_update_steps_per_epoch
    loaders = {Placeholders.TRAIN_DATALOADER_LEN: getattr(trainer, "_train_dataloader", None),
               Placeholders.EVAL_DATALOADER_LEN: getattr(trainer, "_eval_dataloader", None)}  # fmt: skip
    for placeholder, loader in loaders.items():
        length = _length(loader)
        if length is not None:
            values[placeholder] = length
    return resolve_partial(instance, values)


def _check_count(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        more = " or None" if allow_none else ""
        raise TrainerError(f"{name} must be an int >= 1{more}, got {describe(value)}")


_DL_ARGS = frozenset(inspect.signature(DataLoader).parameters) - {"self"}


def _check_dl_kwargs(name: str, kwargs: Any) -> dict[str, Any]:
    """``kwargs`` for a DataLoader, refusing names DataLoader does not take (with a did-you-mean)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TrainerError(f"{name} must be a dict of DataLoader arguments, got {describe(kwargs)}")
    unknown = sorted(str(k) for k in kwargs if k not in _DL_ARGS)
    if unknown:
        import difflib

        hints = [f"{k!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(k, _DL_ARGS, 1)) else repr(k)
                 for k in unknown]  # fmt: skip
        raise TrainerError(
            f"{name} has {', '.join(hints)}, which torch's DataLoader does not take; its arguments are "
            f"{', '.join(sorted(_DL_ARGS))}"
        )
    return dict(kwargs)


class _Schedule(DefaultSchedule):
    """One training batch: ``calculate_train_batch_loss`` (via ``train_step``), then the owner's
    ``backward_step`` (an overridable step of pytorch-accelerated's Trainer)."""

    def __init__(self, owner: Trainer) -> None:
        self._owner = weakref.proxy(owner)

    def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
        if boundary:
            steps.engine.expect_boundary()
        owner = self._owner
        owner._closes_cycle = boundary
        result = steps.train_step(batch)
        owner.backward_step(result["loss"])
        return result


def _launch_from_environment() -> None:
    """Join the process group ``torchrun``/``ember run`` describe, as accelerate would, once."""
    if not is_launched() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        ember.launch_from_torch(seed=42, verbose=False)


class Trainer(CheckpointMethods, EmberTrainer):
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
        if not isinstance(model, torch.nn.Module):
            raise TrainerError(f"Trainer(model=...) needs a torch.nn.Module, got {describe(model)}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TrainerError(f"Trainer(optimizer=...) needs a torch.optim.Optimizer, got {describe(optimizer)}")
        engine, *_ = ember.initialize(model, optimizer, loss_func)
        super().__init__(engine=engine, schedule=_Schedule(self))
        self.loss_func = loss_func
        limit = os.environ.get(LIMIT_BATCHES_ENV_VAR)
        first = [LimitBatchesCallback(_limit_from_env(limit))] if limit and limit.lower() != "none" else []
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
            raise TrainerError(f"callbacks must be a list or tuple of callbacks, got {describe(callbacks)}")
        self.callback_handler = CallbackHandler([*first, *callbacks])
        if run_history is not None and not isinstance(run_history, RunHistory):
            raise TrainerError(f"run_history must be a RunHistory, got {type(run_history).__name__}")
        self.run_history: RunHistory = run_history if run_history is not None else InMemoryRunHistory()
        self._model, self._optimizer = PreparedModel(engine), PreparedOptimizer(engine)
        self._driver = CallbackDriver()
        self.create_scheduler_fn: Callable[..., Any] | None = None
        self.scheduler: Any = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self._train_dataloader: Any = None
        self._eval_dataloader: Any = None
        self._train_dl_kwargs: dict[str, Any] | None = None
        self._eval_dl_kwargs: dict[str, Any] | None = None
        self._closes_cycle = False
        self.run_config: TrainerRunConfig | None = None
        self.callback_handler.call_event("on_init_end", self)

    # -- what pytorch-accelerated's trainer exposes -------------------------------------------------
    @property
    def loss_func(self) -> Callable[..., torch.Tensor]:
        """The loss function the Engine computes the loss with (``Trainer(loss_func=...)``)."""
        return self._loss_func

    @loss_func.setter
    def loss_func(self, value: Callable[..., torch.Tensor]) -> None:
        if getattr(self, "_loss_func", value) is not value:
            raise TrainerError(
                "trainer.loss_func = ...: ember's Engine computes the loss with the loss_func the Trainer was built "
                "with, so another one would be ignored; to use another loss (e.g. one for evaluation), override "
                "calculate_eval_batch_loss (or calculate_train_batch_loss) and compute it there"
            )
        self._loss_func = value

    @property
    def model(self) -> Any:
        """The model; calling it runs the Engine's forward pass (autocast, DDP, the device)."""
        return self._model

    @model.setter
    def model(self, value: Any) -> None:
        if value is self._model or value is self.engine.model:
            return
        raise TrainerError(
            "trainer.model = ...: ember's Trainer trains the model it was built with (the Engine holds it, "
            "wrapped for data parallelism); build a new Trainer for another model, or change the model in place"
        )

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer; its ``step`` is the Engine's update (see the module docstring).

        Assigning an optimizer of the same class over the same parameters (a fresh one, to reset
        its state) gives the Engine's optimizer that one's hyper-parameters and state.
        """
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        if value is self._optimizer:
            return
        current = self.engine.optimizer
        if not isinstance(value, torch.optim.Optimizer) or type(value) is not type(current):
            raise TrainerError(
                f"trainer.optimizer = {describe(value)}: the Engine keeps its {type(current).__name__}; assign one "
                "of that class over the model's parameters (to reset it), or build a new Trainer for another class"
            )
        ours = [p for g in current.param_groups for p in g["params"]]
        theirs = [p for g in value.param_groups for p in g["params"]]
        if len(ours) != len(theirs) or any(a is not b for a, b in zip(ours, theirs, strict=True)):
            raise TrainerError(
                "trainer.optimizer = ...: the new optimizer must hold the model's parameters in the same order "
                "(build it from trainer.model.parameters())"
            )
        current.load_state_dict(value.state_dict())

    def get_model(self, keep_torch_compile: bool = True) -> torch.nn.Module:
        """The model itself, without data-parallel or compile wrappers (ember keeps them apart).

        Args:
            keep_torch_compile: accepted for pytorch-accelerated's signature: the model returned
                is the one given to the Trainer, whose ``state_dict`` keys have no ``_orig_mod.``.
        """
        return self.engine.model

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
        """The training dataloader's default arguments: shuffled, pinned on CUDA, a worker per CPU,
        :func:`~.utils.worker_init_fn`."""
        return {"shuffle": True, "pin_memory": torch.cuda.is_available(), "batch_size": batch_size,
                "num_workers": _default_workers(), "worker_init_fn": worker_init_fn}  # fmt: skip

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """The evaluation dataloader's default arguments: as for training, not shuffled."""
        return {**self.get_default_train_dl_kwargs(batch_size), "shuffle": False}

    def create_train_dataloader(self, batch_size: int, train_dl_kwargs: dict[str, Any] | None = None) -> Any:
        """A DataLoader over ``train_dataset``: the defaults updated with ``train_dl_kwargs``."""
        given = _check_dl_kwargs("train_dataloader_kwargs", train_dl_kwargs)
        self._train_dl_kwargs = {**self.get_default_train_dl_kwargs(batch_size), **given}
        return DataLoader(dataset=self.train_dataset, collate_fn=self.collate_fn, **self._train_dl_kwargs)

    def create_eval_dataloader(self, batch_size: int, eval_dl_kwargs: dict[str, Any] | None = None) -> Any:
        """A DataLoader over ``eval_dataset``: the defaults updated with ``eval_dl_kwargs``."""
        given = _check_dl_kwargs("eval_dataloader_kwargs", eval_dl_kwargs)
        self._eval_dl_kwargs = {**self.get_default_eval_dl_kwargs(batch_size), **given}
        return DataLoader(dataset=self.eval_dataset, collate_fn=self.collate_fn, **self._eval_dl_kwargs)

    def create_scheduler(self) -> Any:
        """``create_scheduler_fn(optimizer)`` with its placeholders replaced (when training starts)."""
        if not callable(self.create_scheduler_fn):
            raise TrainerError(
                f"create_scheduler_fn must be a function of the optimizer that returns a scheduler (e.g. "
                f"functools.partial(StepLR, step_size=...)), got {describe(self.create_scheduler_fn)}"
            )
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

    def run_intermediate_evaluation(self) -> None:
        """An evaluation epoch in the middle of a training epoch (``StepBasedEvaluationCallback``):
        its loss goes to the run history as ``intermediate_eval_loss``; the callbacks see
        ``is_intermediate=True``."""
        if self._eval_dataloader is None:
            raise TrainerError("an intermediate evaluation needs train(eval_dataset=...)")
        with self._driver.intermediate():
            EmberTrainer.evaluate(self, LiveEvalLoader(self))

    def prepared_eval_dataloader(self) -> Any:
        """The evaluation loader in use (pytorch-accelerated's ``_eval_dataloader``: prepared by
        ``train``/``evaluate``, cut by :meth:`limit_eval_batches`), or None."""
        return self._eval_dataloader

    def limit_eval_batches(self, num_batches: int | None, restore: Any = None) -> Any:
        """Cut the evaluation loader to ``num_batches`` batches (``LimitEvalStepsCallback``), or
        put ``restore`` back; returns the loader that was in use."""
        previous = self._eval_dataloader
        self._eval_dataloader = restore if num_batches is None else DataLoaderSlice(previous, num_batches)
        return previous

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
        resume_from: str | os.PathLike[str] | None = None,
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
            resume_from: a folder written by :meth:`save_training_state` (or any ember
                checkpoint): the run continues from it exactly (ember's ``fit(resume=...)``).

        Raises:
            TrainerError: an argument of the wrong kind (named, with what is allowed), before
                anything is built.
        """
        accumulation, clip = gradient_accumulation_steps, gradient_clip_value
        if train_dataset is None:
            raise TrainerError("train(train_dataset=None): give the dataset to train on")
        _check_count("num_epochs", num_epochs)
        _check_count("per_device_batch_size", per_device_batch_size)
        _check_count("max_num_train_steps", max_num_train_steps, allow_none=True)
        _check_count("gradient_accumulation_steps", accumulation)
        if clip is not None and not (isinstance(clip, numbers.Real) and not isinstance(clip, bool) and clip > 0):
            raise TrainerError(f"gradient_clip_value must be a number > 0 or None, got {describe(clip)}")
        if create_scheduler_fn is not None and not callable(create_scheduler_fn):
            raise TrainerError(
                "create_scheduler_fn must be a function of the optimizer that returns a scheduler (e.g. "
                f"functools.partial(StepLR, step_size=7) or CosineLrScheduler.create_scheduler_fn()), got "
                f"{describe(create_scheduler_fn)}"
            )
        if collate_fn is not None and not callable(collate_fn):
            raise TrainerError(f"collate_fn must be a function, got {describe(collate_fn)}")
        _check_dl_kwargs("train_dataloader_kwargs", train_dataloader_kwargs)
        _check_dl_kwargs("eval_dataloader_kwargs", eval_dataloader_kwargs)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.create_scheduler_fn, self.collate_fn = create_scheduler_fn, collate_fn
        if resume_from is not None:
            reset_run_history = False
        if reset_run_history:
            self.run_history.reset()
        batch_size = per_device_batch_size
        self._train_dataloader = self._limited(
            self._prepare(self.create_train_dataloader(batch_size, train_dataloader_kwargs))
        )
        self._eval_dataloader = None
        if eval_dataset is not None:
            self._eval_dataloader = self._limited(
                self._prepare(self.create_eval_dataloader(batch_size, eval_dataloader_kwargs))
            )
        self.engine.gradient_accumulation = accumulation
        self.engine.clip_grad_value = None if clip is None else float(clip)
        self.run_config = self._create_run_config(batch_size, num_epochs, accumulation, max_num_train_steps, clip)
        epochs = self.run_config.num_epochs
        if max_num_train_steps is not None and self.run_config.num_local_update_steps_per_epoch > 0:
            epochs = math.ceil(max_num_train_steps / self.run_config.num_local_update_steps_per_epoch)
        self.fit(self._train_dataloader, epochs=epochs, max_steps=max_num_train_steps, hooks=self._hooks(),
                 reset_run_history=reset_run_history, resume=resume_from)  # fmt: skip
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
        if dataset is None:
            raise TrainerError("evaluate(dataset=None): give the dataset to evaluate on")
        _check_count("per_device_batch_size", per_device_batch_size)
        if collate_fn is not None and not callable(collate_fn):
            raise TrainerError(f"collate_fn must be a function, got {describe(collate_fn)}")
        self.eval_dataset, self.collate_fn = dataset, collate_fn
        self.run_history.reset()
        self._train_dataloader = None
        self._eval_dataloader = self._limited(
            self._prepare(self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs))
        )
        if self.run_config is None:
            self.run_config = self._create_run_config(per_device_batch_size, 1, 1, None, None)
        EmberTrainer.evaluate(self, LiveEvalLoader(self), hooks=self._hooks())

    def _limited(self, loader: Any) -> Any:
        """``loader`` cut by a ``LimitBatchesCallback``, if the Trainer has one."""
        for callback in self.callback_handler:
            if isinstance(callback, LimitBatchesCallback):
                return callback.limit(loader)
        return loader

    def _create_run_config(
        self, per_device_batch_size: int, num_epochs: int, gradient_accumulation_steps: int,
        max_num_train_steps: int | None, gradient_clip_value: float | None,
    ) -> TrainerRunConfig:  # fmt: skip
        world = distributed.world_size()
        train_bs = (self._train_dl_kwargs or {}).get("batch_size", per_device_batch_size)
        eval_bs = (self._eval_dl_kwargs or {}).get("batch_size", train_bs)
        local = _length(self._train_dataloader) or 0
        per_epoch = math.ceil(local * world / gradient_accumulation_steps)  # all processes: pta 0.1.61
        local_per_epoch = math.ceil(local / gradient_accumulation_steps)
        if max_num_train_steps is None:
            max_num_train_steps = num_epochs * per_epoch + 1  # as pytorch-accelerated reports it
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
            num_local_update_steps_per_epoch=local_per_epoch,
            max_num_train_steps=max_num_train_steps,
            is_local_process_zero=ctx.local_rank == 0,
            is_world_process_zero=distributed.rank() == 0,
            is_distributed=world > 1,
            mixed_precision=self.engine.precision.name or "no",
            num_processes=world,
        )


def _limit_from_env(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TrainerError(f"${LIMIT_BATCHES_ENV_VAR} must be a number of batches or 'none', got {value!r}") from None


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
