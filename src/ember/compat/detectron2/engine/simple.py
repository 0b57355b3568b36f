"""detectron2's ``SimpleTrainer`` on ember's Trainer (its iteration mode, ``fit(max_steps=...)``).

How its iterations map onto ember's loop::

    SimpleTrainer.train(start_iter, max_iter)
        ember_trainer.fit(data_loader, max_steps=max_iter, hooks=[...])   # from cur_step = start_iter
            before_train                       -> trainer.before_train()   -> hook.before_train()
            for each batch (one iteration):
                before_train_iter              -> trainer.before_step()    -> hook.before_step()
                engine: the model's loss dict, backward of their sum      -> hook.after_backward()
                engine.step()                  (ember: precision, clipping, DDP/ZeRO/FSDP)
                after_train_iter               -> trainer.after_step()     -> hook.after_step()
            after_train (finally)              -> trainer.after_train()    -> hook.after_train()

The detectron2 hooks run in the order they were registered, in one block at ember's
``Priority.NORMAL``; ember hooks registered with them keep their own priorities (metrics
before, logging and LR schedulers after, checkpoints last). ``storage.iter == trainer.iter``
during every step; ``after_train`` sees ``trainer.iter == max_iter`` after a run that finished.
A subclass with a ``run_step`` of its own trains in ``TrainerBase.train`` (detectron2's loop).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset

import ember
from ember import distributed
from ember.checkpoint.state import rng_state, set_rng_state
from ember.compat.detectron2.engine._ember import Step, batch_size, ember_hooks
from ember.compat.detectron2.engine.base import TrainerBase, check_range
from ember.compat.detectron2.utils.events import EventStorage, get_event_storage
from ember.context import is_launched
from ember.data import make_resumable
from ember.errors import TrainerError
from ember.logging import get_dist_logger
from ember.trainer import Trainer

if TYPE_CHECKING:
    from torch import nn

__all__ = ["SimpleTrainer"]


class SimpleTrainer(TrainerBase):
    """Train ``model`` (which returns a dict of losses) on ``data_loader`` with ``optimizer``, on
    ember's Trainer.

    Started by ``torchrun`` or ``ember run`` with several processes, it joins the process group
    first (``ember.launch_from_torch``, the program's random state kept). The model, optimizer
    and loader go through :func:`ember.initialize`: the model is moved to
    the process's device and made data-parallel as ember's config says, a DataLoader over a
    map-style dataset gets ember's resumable sampler (sharded across ranks: a checkpoint resumes
    at the next batch); the optimizer steps through ember's Engine (precision, clipping,
    gradient handlers of the config). One iteration is one batch and one
    optimizer update; the losses' sum is back-propagated and the losses (averaged across ranks
    every ``gather_metric_period`` iterations) go into the storage as ``total_loss`` and by name.

    Args:
        model: a module called as ``model(batch)``, returning a dict of scalar losses (or one loss).
        data_loader: a DataLoader, or any iterable of batches (an infinite one is fine).
        optimizer: the optimizer over ``model``'s parameters.
        gather_metric_period: iterations between the writes of the losses into the storage
            (each write reads them: one host-device sync, and raises FloatingPointError on a
            non-finite loss).
        zero_grad_before_forward: accepted for detectron2's signature; gradients are cleared
            before each forward either way (the same result).
        async_write_metrics: accepted for detectron2's signature; the losses are put lazily
            anyway (no sync but the one every ``gather_metric_period``).

    Attributes:
        engine: the ember Engine that runs the forward, backward and step.
        ember_trainer: the ember :class:`~ember.trainer.Trainer` that runs the loop.

    Example:
        >>> trainer = SimpleTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> trainer.register_hooks([hooks.IterationTimer(), hooks.LRScheduler(scheduler=sched)])
        >>> trainer.train(0, 1000)
    """

    def __init__(
        self,
        model: nn.Module,
        data_loader: Any,
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        async_write_metrics: bool = False,
    ) -> None:
        super().__init__()
        if (
            isinstance(gather_metric_period, bool)
            or not isinstance(gather_metric_period, int)
            or gather_metric_period < 1
        ):
            raise TrainerError(
                f"SimpleTrainer(gather_metric_period=...) must be a positive int, got {gather_metric_period!r}"
            )
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            raise TrainerError(
                f"SimpleTrainer got a {type(model).__name__}: give it the plain model, ember makes it data-parallel "
                "itself when launched with several processes"
            )
        _join_process_group()
        # A map-style DataLoader gets ember's resumable, sharded sampler; other iterables (an
        # IterableDataset that shards itself, a generator) are each rank's own, used as given.
        is_loader = _is_map_loader(data_loader)
        engine, loader, _, _ = ember.initialize(model, optimizer, None, data_loader if is_loader else None)
        if engine.gradient_accumulation != 1:
            raise TrainerError(
                f"SimpleTrainer makes one optimizer update per iteration, but the config sets gradient_accumulation="
                f"{engine.gradient_accumulation}: leave it at 1 (accumulate in a run_step of your own)"
            )
        model.train()
        self.model, self.optimizer = model, optimizer
        self.data_loader = loader if is_loader else data_loader
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward, self.async_write_metrics = zero_grad_before_forward, async_write_metrics
        self.engine = engine
        self.ember_trainer = Trainer(engine=engine, schedule=Step(self))
        self._data_iter: Iterator[Any] | None = None
        self._step_end = time.perf_counter()  # when the last iteration ended: the next one's data time starts

    def mark_step_end(self) -> None:
        """An iteration ended now: the next one's data time starts (ember's hooks call it)."""
        self._step_end = time.perf_counter()

    def since_step_end(self) -> float:
        """Seconds since the last iteration ended: the data time of the one starting."""
        return time.perf_counter() - self._step_end

    def train(self, start_iter: int, max_iter: int) -> None:
        """Run iterations ``start_iter`` to ``max_iter - 1`` on ember's Trainer.

        ``start_iter`` is where ember's step count stands now (a checkpoint loaded by
        :class:`~ember.compat.detectron2.checkpoint.Checkpointer` puts it at the saved
        iteration + 1, and the data loader at the batch that followed). A subclass with its own
        ``run_step`` trains in :meth:`TrainerBase.train` instead.
        """
        if not self._runs_on_ember():
            super().train(start_iter, max_iter)
            return
        check_range(start_iter, max_iter)
        get_dist_logger().info(f"Starting training from iteration {start_iter}", ranks=[0])
        self.ember_trainer.continue_at(start_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        with EventStorage(start_iter) as self.storage:
            self.ember_trainer.storage = self.storage.scalars
            self.ember_trainer.fit(self.data_loader, max_steps=max_iter, hooks=ember_hooks(self))

    def reset_data_loader(self, data_loader_builder: Callable[[], Any]) -> None:
        """Replace the data loader with ``data_loader_builder()`` (e.g. a fresh, re-seeded one),
        prepared as the first one was (a map-style DataLoader gets ember's resumable, sharded
        sampler); the next ``train`` and ``run_step`` read from it.

        Example:
            >>> trainer.reset_data_loader(lambda: build_loader(cfg, seed=epoch))
        """
        loader = data_loader_builder()
        if _is_map_loader(loader):
            loader = make_resumable(loader, num_replicas=self.engine.data_parallel_size,
                                    rank=self.engine.data_parallel_rank)  # fmt: skip
        self.data_loader = loader
        self._data_iter = None

    def run_step(self) -> None:
        """One iteration: the next batch, the model's losses, backward, optimizer step.

        ``train`` does not call it (ember's loop runs these same pieces); it is here for
        subclasses whose own ``run_step`` calls ``super().run_step()``, and for wrappers that
        delegate to it.
        """
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        self.forward_backward(data, time.perf_counter() - start)
        self.engine.step()

    def forward_backward(self, data: Any, data_time: float, boundary: bool = False) -> dict[str, Any]:
        """The model's losses on ``data``, their sum back-propagated; hooks' ``after_backward``
        and the storage writes included (not the optimizer step).

        Returns:
            ``{"loss": total, "output": the loss dict, "label": None, "batch_size": n}``, what
            ember's Trainer gives its hooks.
        """
        if not self.model.training:
            raise TrainerError("SimpleTrainer: the model was put in eval mode; call model.train() after evaluating")
        engine = self.engine
        engine.zero_grad()
        if boundary:
            engine.expect_boundary()
        loss_dict, total = self.losses(data)
        engine.backward(total, boundary=True if boundary else None)
        self.after_backward()
        self._write_metrics(loss_dict, data_time)
        return {"loss": total, "output": loss_dict, "label": None, "batch_size": batch_size(data)}

    def losses(self, data: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The model's loss dict on ``data`` (run through the Engine: autocast, DDP) and its sum.

        Raises:
            TrainerError: the model returned something else than a dict of losses or one loss.
        """
        loss_dict = self.engine(data)
        if isinstance(loss_dict, torch.Tensor):
            loss_dict = {"total_loss": loss_dict}
        if not isinstance(loss_dict, Mapping) or not loss_dict:
            raise TrainerError(
                f"SimpleTrainer's model must return a dict of losses (or one loss tensor), got {loss_dict!r:.80}"
            )
        losses = iter(loss_dict.values())
        total = next(losses)
        for loss in losses:
            total = total + loss
        return dict(loss_dict), total

    def _write_metrics(
        self, loss_dict: Mapping[str, Any], data_time: float, prefix: str = "", iter: int | None = None
    ) -> None:
        """Put the losses (averaged across ranks), their sum and the data time into the storage,
        every ``gather_metric_period`` iterations."""
        iteration = self.iter if iter is None else iter
        if (iteration + 1) % self.gather_metric_period:
            return
        values = torch.stack([torch.as_tensor(v).detach().float().reshape(()) for v in loss_dict.values()])
        if distributed.is_active():
            device = values.device
            values = distributed.all_reduce(values.to(distributed.collective_device())).to(device)
            values /= distributed.world_size()
        total = values.sum()
        if not bool(torch.isfinite(total)):
            raise FloatingPointError(
                f"the loss is not finite at iteration {iteration}: {dict(zip(loss_dict, values.tolist(), strict=True))}"
            )
        storage = get_event_storage()
        storage.put_scalar("data_time", data_time, cur_iter=iteration)
        storage.put_scalar(f"{prefix}total_loss", total, cur_iter=iteration)
        if len(loss_dict) > 1:
            for name, value in zip(loss_dict, values.unbind(), strict=True):
                storage.put_scalar(name, value, cur_iter=iteration)

    @property
    def _data_loader_iter(self) -> Iterator[Any]:
        """The iterator :meth:`run_step` reads batches from (made at first use, kept across ``train`` calls)."""
        if self._data_iter is None:
            self._data_iter = _Batches(self.data_loader)
        return self._data_iter

    def _runs_on_ember(self) -> bool:
        return "run_step" not in vars(self) and type(self).run_step is SimpleTrainer.run_step


class _Batches(Iterator[Any]):
    """Batches of ``loader``, and a clear error instead of a bare StopIteration when it runs out."""

    def __init__(self, loader: Any) -> None:
        self._it, self._read = iter(loader), 0

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            raise TrainerError(
                f"the data loader ran out after {self._read} batches: a run_step of your own reads one batch per "
                "iteration, so give it an endless loader (detectron2's training samplers are)"
            ) from None
        self._read += 1
        return batch


def _is_map_loader(loader: Any) -> bool:
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def _join_process_group() -> None:
    """Under ``torchrun``/``ember run`` with several processes, launch ember once (detectron2's own
    ``launch`` is not needed), leaving the program's random generators as it seeded them."""
    if is_launched() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    seeded = rng_state()
    ember.launch_from_torch(verbose=False)
    set_rng_state(seeded)
