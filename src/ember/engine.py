"""The Engine: the user's model, optimizer and loss, with precision, accumulation and clipping.

A training loop keeps PyTorch's shape::

    for x, y in train_dl:
        engine.zero_grad()              # clears gradients at the start of an accumulation cycle
        out = engine(x)                 # forward under autocast, through DDP when distributed
        loss = engine.criterion(out, y)
        engine.backward(loss)           # loss / N; no gradient all-reduce on non-boundary steps
        engine.step()                   # on the boundary: unscale, handlers, clip, update

One ``step`` serves every configuration: what differs between fp32, bf16 and fp16-with-scaler
is a :class:`~ember.amp.Precision` policy; what differs between one process, DDP, ZeRO-1,
FSDP2 and tensor parallelism (gradient sync, clipping over shards, gathering state) is a
:class:`~ember.parallel.policy.ParallelPolicy`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ember.amp import Precision
from ember.data import data_parallel_rank_and_size, to_device
from ember.errors import EngineError
from ember.logging import get_dist_logger
from ember.loss_check import LossCheck
from ember.parallel.moe import MoEStats
from ember.parallel.policy import DataParallelPolicy, ParallelPolicy, require_boundary

Criterion = Callable[..., torch.Tensor]
T = TypeVar("T")


class Engine:
    """Runs forward, backward and optimizer steps for one model.

    Build it with :func:`ember.initialize`, which validates the pieces, moves the model to the
    device and makes it parallel as the config says (DDP, ZeRO, FSDP2, tensor parallel).

    Args:
        model: the user's module (its ``state_dict`` keys are the ones checkpoints use).
        optimizer: the optimizer that steps (under ZeRO/FSDP2/TP the one ``initialize`` built
            from the user's: see :attr:`optimizer`).
        criterion: the loss function, called as ``criterion(output, label)``.
        device: the device the model lives on.
        gradient_accumulation: micro-batches per optimizer update (config
            ``gradient_accumulation``).
        clip_grad_norm: clip the gradients to this global norm before each update, or None.
        clip_grad_value: clamp each gradient element to ``±value`` before each update, or None.
        gradient_handlers: called as ``handler(parameters_with_grads)`` before clipping.
        nonfinite_loss: ``"error"``, ``"warn"`` or ``"ignore"`` a NaN/inf loss (see
            :mod:`ember.loss_check`).
        train_module: what the forward pass runs through while gradients are on (the DDP
            wrapper, a compiled module); defaults to ``model``.
        eval_module: what it runs through under ``torch.no_grad()``; defaults to ``model``.
        precision: the AMP policy (:func:`ember.amp.make_precision`); default fp32.
        parallel: the parallel policy; by default DDP's when ``train_module`` is a DDP
            wrapper, else the single-process one.
        data_parallel: ``(rank, size)`` among the data-parallel replicas; default: the
            launched layout's.
        config: the config it was built from, kept as :attr:`config` for records (the
            tracking hook logs it); the Engine reads no setting from it.

    Example:
        >>> engine, train_dl, _, _ = ember.initialize(model, optimizer, nn.CrossEntropyLoss(), train_dl)
        >>> for x, y in train_dl:
        ...     engine.zero_grad(); loss = engine.criterion(engine(x), y)
        ...     engine.backward(loss); engine.step()
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Criterion | None,
        device: torch.device,
        *,
        gradient_accumulation: int = 1,
        clip_grad_norm: float | None = None,
        clip_grad_value: float | None = None,
        gradient_handlers: Sequence[Callable[[list[nn.Parameter]], None]] = (),
        nonfinite_loss: Literal["error", "warn", "ignore"] = "error",
        train_module: nn.Module | None = None,
        eval_module: nn.Module | None = None,
        precision: Precision | None = None,
        parallel: ParallelPolicy | None = None,
        data_parallel: tuple[int, int] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._model = model
        self._train_module = train_module if train_module is not None else model
        self._eval_module = eval_module if eval_module is not None else model
        self._optimizer = optimizer
        self._criterion = criterion
        self.config: Mapping[str, Any] = config if config is not None else {}
        """The config this Engine was built from, a record (its settings are the arguments above); ``{}`` when none."""
        self.device = device
        # Inputs left on the CPU are moved to an accelerator for the user (accelerate's prepared
        # dataloaders do this, so `for x, y in loader: engine(x)` runs unchanged on a GPU). On the
        # CPU there is nothing to move and no per-call check.
        self._move_inputs = device.type != "cpu"
        self.gradient_accumulation: int = gradient_accumulation
        self.clip_grad_norm: float | None = clip_grad_norm
        self.clip_grad_value: float | None = clip_grad_value
        self.gradient_handlers: list[Callable[[list[nn.Parameter]], None]] = list(gradient_handlers)
        self.precision = precision or Precision(device)
        self._params: list[nn.Parameter] = [p for g in optimizer.param_groups for p in g["params"]]
        # Where backward leaves the gradients: the model's fp16/bf16 parameters under master weights.
        self._grad_params = self.precision.gradient_params(self._params)
        self._moe = MoEStats.of(model)
        self.step_scalars: dict[str, torch.Tensor] = {}
        """What the last backward measured besides the loss, for the Trainer's step storage
        (``moe/aux_loss``, ``moe/dropped_fraction`` of a model with :class:`~ember.parallel.moe.MoE` layers)."""
        if parallel is None:
            ddp = self._train_module if isinstance(self._train_module, DistributedDataParallel) else None
            parallel = DataParallelPolicy(ddp) if ddp is not None else ParallelPolicy()
        self.parallel = parallel
        self._syncs_in_backward = type(parallel).gradient_sync is not ParallelPolicy.gradient_sync
        """How gradients synchronise, clipping reduces and state is gathered (DDP, ZeRO, FSDP2, TP)."""
        rank, size = data_parallel if data_parallel is not None else data_parallel_rank_and_size()
        self.data_parallel_rank: int = rank
        """This process's index among the Engine's data-parallel replicas (what its data is sharded by)."""
        self.data_parallel_size: int = size
        """The Engine's data-parallel replicas: the launched layout's, or its own config's ``parallel``."""
        self.micro_step = 0
        """Backward calls made in the open accumulation cycle."""
        self.sync_gradients = False
        """Whether the last backward closed an accumulation cycle (gradients are complete)."""
        self._boundary_expected = False  # expect_boundary(): the next backward closes the cycle
        self._forward_unsynced = False  # the last training forward ran under DDP's no_sync
        self.last_step_skipped = False
        """Whether the last boundary step was skipped (fp16 overflow)."""
        self.last_grad_norm: torch.Tensor | None = None
        """Total gradient norm before clipping at the last update (when clipping is on)."""
        self.num_updates = 0
        """Boundary steps taken (applied or skipped) since the Engine was built or loaded."""
        self.skipped_updates = 0
        """Boundary steps skipped for an fp16 overflow since the Engine was built or loaded."""
        self.loss_check: LossCheck | None = None if nonfinite_loss == "ignore" else LossCheck(nonfinite_loss, device)
        """The check of each loss for NaN/inf (config ``nonfinite_loss``; None when ``"ignore"``)."""

    # -- the user's objects --------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The user's own module, without DDP or compile wrappers (clean ``state_dict`` keys).

        Run the forward pass through ``engine(x)``: calling ``engine.model(x)`` directly
        bypasses autocast and the gradient synchronisation of data parallelism. Under FSDP2 or
        tensor parallelism its parameters are DTensor shards: use :meth:`state_dict` for the
        full weights.
        """
        return self._model

    @property
    def wrapped_model(self) -> nn.Module:
        """The module the training forward pass runs through (DDP / compiled), for inspection."""
        return self._train_module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer that steps: the user's, or under ``zero`` stage 1 a
        ZeroRedundancyOptimizer of its class, or under FSDP2/tensor parallelism a new instance
        of its class over the sharded parameters (same defaults and param groups). The
        ``lr_scheduler`` given to :func:`ember.initialize` drives this one."""
        return self._optimizer

    @property
    def schedule(self) -> Any:
        """How a training batch must run under this Engine's parallelism, for
        ``Trainer(engine, schedule=engine.schedule)``: the pipeline's schedule
        (:class:`~ember.parallel.pipeline_schedule.PipelineSchedule`), else None (the default
        forward, loss, backward). The parallel policy's; the Trainer picks it up by itself."""
        return self.parallel.batch_schedule

    @property
    def has_criterion(self) -> bool:
        """True when a loss function was given."""
        return self._criterion is not None

    @property
    def training(self) -> bool:
        """True in training mode."""
        return self._model.training

    def criterion(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Compute the loss with the user's criterion, under the same autocast as the forward.

        Tensors among the arguments that are not on :attr:`device` are moved there first.
        """
        if self._criterion is None:
            raise EngineError("this Engine has no criterion: pass one to ember.initialize(model, optimizer, criterion)")
        if self._move_inputs:
            args, kwargs = to_device(args, self.device), to_device(kwargs, self.device)
        if not self.precision.autocasts:
            return self._criterion(*args, **kwargs)
        with self.precision.autocast():
            return self._criterion(*args, **kwargs)

    # -- the step ------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model's forward pass under autocast (through DDP while gradients are on).

        On an accelerator, tensor inputs still on another device (a CPU batch) are moved to
        :attr:`device` first, so a loop written for the CPU runs unchanged on a GPU.
        """
        if self._move_inputs:
            args, kwargs = to_device(args, self.device), to_device(kwargs, self.device)
        if not torch.is_grad_enabled():
            module, no_sync = self._eval_module, None
        else:
            # Under DDP the forward decides whether the backward all-reduces: a micro-step that
            # will not close the accumulation cycle runs its forward under no_sync.
            if self.parallel.trainable_changed:  # parameters were unfrozen: DDP rebuilt for them
                self._train_module = self.parallel.follow_trainable()
            module = self._train_module
            no_sync = None if self._closes_cycle() else self.parallel.forward_without_sync()
            self._forward_unsynced = no_sync is not None
        if no_sync is None and not self.precision.autocasts:
            return module(*args, **kwargs)  # the common fp32 case: no context to enter per call
        with no_sync or contextlib.nullcontext(), self.precision.autocast():
            return module(*args, **kwargs)

    def _closes_cycle(self) -> bool:
        return self._boundary_expected or self.micro_step + 1 >= self.gradient_accumulation

    def expect_boundary(self) -> None:
        """Announce that the next micro-step closes the accumulation cycle early.

        Call it before the forward pass of a short cycle's last micro-step (an epoch's last
        batch) and pass ``boundary=True`` to its :meth:`backward`: under DDP the gradients are
        then all-reduced in that backward, overlapped with it. Without the announcement
        ``backward(boundary=True)`` still synchronises, with one extra all-reduce after it.
        The Trainer announces for you.
        """
        self._boundary_expected = True

    def zero_grad(self) -> None:
        """Clear gradients, but only at the start of an accumulation cycle (else a no-op)."""
        if self.micro_step == 0:
            self.precision.zero_grad(self._optimizer)

    def reset_accumulation(self) -> None:
        """Drop a half-finished accumulation cycle: clear gradients and the micro-step count.

        For recovering after an exception mid-cycle; a normal loop never needs it.
        """
        self.micro_step = 0
        self.sync_gradients = self._boundary_expected = self._forward_unsynced = False
        self.precision.zero_grad(self._optimizer)
        if self._moe is not None:  # what the dropped cycle's forwards left for its backward
            self._moe.clear()

    def backward(self, loss: torch.Tensor, *, boundary: bool | None = None) -> None:
        """Back-propagate ``loss`` divided by the accumulation count.

        Args:
            loss: a scalar tensor that requires grad.
            boundary: True closes the accumulation cycle at this micro-step even if fewer than
                ``gradient_accumulation`` micro-steps were taken (the Trainer does this on an
                epoch's last batch). None lets the count decide.
        """
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise EngineError(
                f"engine.backward needs a scalar loss tensor, got {shape}: reduce it (e.g. .mean()) first"
            )
        if not loss.requires_grad:
            raise EngineError(
                "engine.backward got a loss that does not require grad: was it computed under "
                "torch.no_grad(), from a detached output, or with the model frozen?"
            )
        if self._moe is not None:  # the MoE layers' load-balancing losses join the loss here
            extra, self.step_scalars = self._moe.pop()
            loss = loss if extra is None else loss + extra
        if self.loss_check is not None:  # before anything is back-propagated from it
            self.loss_check.note(loss, self.num_updates + 1, self.micro_step + 1)
        self.micro_step += 1
        self.sync_gradients = bool(boundary) or self.micro_step >= self.gradient_accumulation
        unsynced, self._forward_unsynced, self._boundary_expected = self._forward_unsynced, False, False
        if self.gradient_accumulation > 1:
            loss = loss / self.gradient_accumulation
        if self._syncs_in_backward:
            with self.parallel.gradient_sync(self.sync_gradients):
                self.precision.scale(loss).backward()
        else:
            self.precision.scale(loss).backward()
        # A cycle closed early and not announced before its forward is averaged here; DDP checks
        # that its reduction finished and notices parameters unfrozen since it was built.
        self.parallel.finish_backward(self.sync_gradients, unsynced, self._grad_params)

    def run_backward(self, run: Callable[[float], T], *, boundary: bool | None = None) -> T:
        """Count one micro-step whose backward pass happens inside ``run`` (a pipeline schedule).

        The counterpart of :meth:`backward` for schedules that interleave forward and backward
        themselves: the accumulation bookkeeping and gradient synchronisation are the same.

        Args:
            run: called as ``run(loss_factor)``; it must back-propagate its loss multiplied by
                ``loss_factor`` (``1 / gradient_accumulation``).
            boundary: as for :meth:`backward`.

        Returns:
            What ``run`` returned.
        """
        self.micro_step += 1
        self.sync_gradients = bool(boundary) or self.micro_step >= self.gradient_accumulation
        self._boundary_expected = self._forward_unsynced = False
        with self.parallel.gradient_sync(self.sync_gradients):
            return run(1.0 / self.gradient_accumulation)

    def step(self) -> bool:
        """Update the parameters if the accumulation cycle is complete.

        Unscales the gradients, applies the gradient handlers, clamps them to
        ``clip_grad_value``, clips them by global norm (``clip_grad_norm``), steps the optimizer
        through the precision policy. Does nothing on non-boundary micro-steps.

        Returns:
            True when the parameters were updated; False on a non-boundary micro-step and on
            an fp16 step skipped for overflow (``last_step_skipped`` tells which). Count LR
            scheduler steps on True.
        """
        if not (self.sync_gradients and self.micro_step > 0):
            return False
        if self.loss_check is not None:
            self.loss_check.boundary(self.num_updates + 1)
        self.precision.unscale_(self._optimizer)
        if self.gradient_handlers:
            with_grads = [p for p in self._params if p.grad is not None]
            for handler in self.gradient_handlers:
                handler(with_grads)
        if self.clip_grad_value is not None:  # elementwise: the same on whole tensors and on shards
            torch.nn.utils.clip_grad_value_(self._params, self.clip_grad_value)
        if self.clip_grad_norm is not None:
            self.last_grad_norm = self.parallel.clip_grad_norm_(self._params, self.clip_grad_norm)
        updated = self.precision.step(self._optimizer)
        self.last_step_skipped = not updated
        self.micro_step = 0
        self.num_updates += 1
        if not updated:
            self.skipped_updates += 1
            get_dist_logger().info(
                f"fp16 overflow (inf/nan gradients) in update {self.num_updates}: update skipped, "
                f"loss scale lowered to {self.precision.loss_scale:g} ({self.skipped_updates} skipped so far)",
                ranks=[0],
            )
        return updated

    def check_loss(self) -> int | None:
        """The step of the first non-finite loss this Engine saw (None: none, or ``nonfinite_loss="ignore"``).

        On an accelerator this waits for the flag of the last update (see :mod:`ember.loss_check`):
        call it where it must be known now, e.g. before saving a checkpoint.

        Raises:
            NonFiniteLossError: with ``nonfinite_loss="error"``, when that flag shows one.
        """
        return None if self.loss_check is None else self.loss_check.settle()

    def train(self, mode: bool = True) -> Engine:
        """Put the model in training mode (or evaluation mode with ``mode=False``)."""
        self._train_module.train(mode)
        if self._model is not self._train_module:  # a wrapper's train() may not reach the model (compile)
            self._model.train(mode)
        return self

    def eval(self) -> Engine:
        """Put the model in evaluation mode."""
        return self.train(False)

    # -- state ---------------------------------------------------------------------------
    def state_dict(self, *, weights: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly: model (unwrapped keys), optimizer, scaler, counters.

        Mid-way through an accumulation cycle the partial gradients are included too (not under
        FSDP2/tensor parallelism, where that raises EngineError: save at a boundary).

        The model and optimizer entries are full (unsharded) state in the single-process
        format. Under ZeRO-1, FSDP2 and tensor parallelism this is a collective, so call it on
        every rank; only rank 0 gets the sharded parts (ZeRO-1: the optimizer; FSDP2/TP: model
        and optimizer), the other ranks get ``{}`` in their place. Rank 0 saves.

        Args:
            weights: False leaves out the model and optimizer (and the partial gradients): the
                precision state and counters alone, for a sharded checkpoint, whose shards are
                saved with ``torch.distributed.checkpoint`` at an accumulation boundary. Not a
                collective then.
        """
        require_boundary(self.parallel, self.micro_step)
        if not weights:
            return {"precision": self.precision.state_dict(), "micro_step": self.micro_step,
                    "num_updates": self.num_updates, "skipped_updates": self.skipped_updates}  # fmt: skip
        with self.precision.full_precision():  # master weights: the fp32 masters are the weights saved
            model_state, optimizer_state = self.parallel.state_dicts(self._model, self._optimizer)
        state: dict[str, Any] = {
            "model": model_state,
            "optimizer": optimizer_state,
            "precision": self.precision.state_dict(),
            "micro_step": self.micro_step,
            "num_updates": self.num_updates,
            "skipped_updates": self.skipped_updates,
        }
        if self.micro_step > 0:
            state["partial_grads"] = [None if p.grad is None else p.grad.detach().clone() for p in self._grad_params]
        return state

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore what :meth:`state_dict` returned (model keys without any wrapper prefix).

        Under ZeRO-1, FSDP2 and tensor parallelism call it on every rank, with the full state
        on every rank, or on rank 0 only and ``{}`` for ``"model"``/``"optimizer"`` elsewhere
        (as :meth:`state_dict` returns them there): rank 0's state is then broadcast.
        """
        missing = [k for k in ("model", "optimizer") if k not in state]
        if missing:
            raise EngineError(
                f"engine state is missing {missing}: pass what engine.state_dict() returned "
                "(for bare weights use engine.model.load_state_dict(...))"
            )
        with self.precision.full_precision():  # master weights: what is loaded becomes the masters
            state = self.parallel.load(self._model, self._optimizer, state, strict)
        self.precision.load_state_dict(state.get("precision", {}))
        self.micro_step = int(state.get("micro_step", 0))
        self.num_updates = int(state.get("num_updates", 0))
        self.skipped_updates = int(state.get("skipped_updates", 0))
        self.sync_gradients = self._boundary_expected = self._forward_unsynced = False
        grads: Sequence[torch.Tensor | None] | None = state.get("partial_grads")
        if grads is not None:
            if len(grads) != len(self._grad_params):
                raise EngineError(
                    f"engine state has {len(grads)} partial gradients for {len(self._grad_params)} parameters"
                )
            for p, g in zip(self._grad_params, grads, strict=True):
                p.grad = None if g is None else g.to(p.device, p.dtype).clone()
