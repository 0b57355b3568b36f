"""Metric hooks: loss, accuracy, and any per-batch metric, averaged over samples and ranks.

Each keeps ``[sum, count]`` on the device while batches come (no host-device synchronisation
per batch) and reduces it across ranks once, at the end of the train or test epoch, then
records ``"<phase>/<name>"`` in ``trainer.history``. The Trainer drops the distributed
sampler's padding repeats from test batches before these hooks see them, so each evaluation
sample counts exactly once.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ember import distributed
from ember.errors import HookError
from ember.trainer.hooks._util import PHASES, accumulator, check_phases
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.storage import Mode, held

__all__ = ["AccuracyHook", "LossHook", "MetricHook"]


_FOLD_EVERY = 128
"""Per-batch tensors a metric hook collects before folding them into its float64 sum."""


class _AveragedMetric(BaseHook):
    """Accumulates per-sample sums per phase; records the cross-rank mean at each epoch end."""

    metric_name = "metric"
    mode: Mode = "max"
    state_per_rank = True  # each rank sums its own shard's batches
    _always: frozenset[str] = frozenset()  # events called even for a phase it does not measure

    def __init__(self, on: str | Iterable[str], priority: int | str, name: str | None) -> None:
        super().__init__(priority, name)
        self.on = check_phases(on, type(self).__name__)
        # The sum is a 0-dim float64 tensor on the device (no host sync per batch); the count
        # stays a Python number unless a hook counts with tensors. A batch's value is not added
        # at once: it waits in `_pending` (with its scale) and _FOLD_EVERY of them are added in
        # one go, because one tensor op per batch is measurable on a small model. It waits as
        # the storage keeps it (`held`): a float on the CPU, a tensor on an accelerator.
        self._sum: dict[str, torch.Tensor | None] = {"train": None, "test": None}
        self._seen: dict[str, torch.Tensor | float] = {"train": 0, "test": 0}
        self._pending: dict[str, list[torch.Tensor | float]] = {"train": [], "test": []}
        self._scales: dict[str, list[int | float]] = {"train": [], "test": []}

    def records(self) -> list[str]:
        """``"<phase>/<metric>"`` for each phase measured."""
        return [f"{phase}/{self.metric_name}" for phase in self.on]

    def events(self) -> list[str]:
        """The overridden lifecycle methods, less those of a phase this hook does not measure."""
        unmeasured = {f"{when}_{phase}_{part}" for phase in PHASES if phase not in self.on
                      for when in ("before", "after") for part in ("epoch", "iter")}  # fmt: skip
        return [e for e in super().events() if e not in unmeasured or e in self._always]

    def _reset(self, phase: str) -> None:
        self._sum[phase], self._seen[phase] = None, 0
        self._pending[phase], self._scales[phase] = [], []

    def _add(self, phase: str, total: torch.Tensor | float, count: torch.Tensor | int, scale: int | float = 1) -> None:
        """Add ``total * scale`` to the phase's sum and ``count`` to its count."""
        if isinstance(total, torch.Tensor):
            if total.requires_grad or total.dim():  # per batch: one test for the usual detached 0-dim value
                total = _one_value(total.detach(), self.name)
            total = held(total)
        pending = self._pending[phase]
        pending.append(total)
        self._scales[phase].append(scale)
        if len(pending) >= _FOLD_EVERY:
            self._fold(phase)
        seen = self._seen
        seen[phase] = seen[phase] + (count.detach() if isinstance(count, torch.Tensor) else count)

    def _accumulator(self, phase: str, device: torch.device) -> torch.Tensor:
        """The phase's running sum on ``device`` (created, or moved there after a restore)."""
        acc = self._sum[phase]
        if acc is None:
            acc = self._sum[phase] = accumulator(device)[0].clone()
        elif acc.device != device:
            acc = self._sum[phase] = acc.to(device)
        return acc

    def _fold(self, phase: str) -> None:
        """Add the pending tensors to the sum: one sum per run of equal scales (usually one)."""
        pending, scales = self._pending[phase], self._scales[phase]
        if not pending:
            return
        values = _stacked(pending)
        acc = self._accumulator(phase, values.device)
        begin = 0
        for scale, same in itertools.groupby(scales):
            end = begin + len(list(same))
            acc.add_(values[begin:end].sum(dtype=acc.dtype), alpha=scale)
            begin = end
        self._pending[phase], self._scales[phase] = [], []

    def _packed(self, phase: str, device: torch.device) -> torch.Tensor | None:
        """``[sum, count]`` of the folded values as one float64 tensor (None: nothing added)."""
        total = self._sum[phase]
        if total is None and not self._pending[phase]:
            return None
        acc = accumulator(device)
        if total is not None:
            acc[0] = total
        acc[1] = self._seen[phase]
        return acc

    def _finish(self, phase: str) -> None:
        self._fold(phase)
        acc = self._packed(phase, self.trainer.engine.device)
        local = acc if acc is not None else accumulator(self.trainer.engine.device)
        reduced = distributed.all_reduce(local.to(distributed.collective_device()))
        total, count = reduced.tolist()
        self._reset(phase)
        if count > 0:
            self.trainer.record_metric(f"{phase}/{self.metric_name}", total / count, self.mode)

    def before_train_epoch(self) -> None:
        """Start a fresh training average."""
        if "train" in self.on:
            self._reset("train")

    def after_train_epoch(self) -> None:
        """Reduce across ranks and record ``train/<name>``."""
        if "train" in self.on:
            self._finish("train")

    def before_test_epoch(self) -> None:
        """Start a fresh test average."""
        if "test" in self.on:
            self._reset("test")

    def after_test_epoch(self) -> None:
        """Reduce across ranks and record ``test/<name>``."""
        if "test" in self.on:
            self._finish("test")

    def _batch_size(self) -> int:
        return int(self.trainer.step_result["batch_size"])

    def state_dict(self) -> dict[str, Any]:
        """The running sums of an epoch in progress (this rank's), and the values not yet folded
        into them (kept apart, so a resumed run adds them up exactly as an uninterrupted one)."""
        state: dict[str, Any] = {"acc": {p: self._packed(p, torch.device("cpu")) for p in self._sum}}
        pending = {p: {"values": _stacked(v).cpu(), "scales": list(self._scales[p])}
                   for p, v in self._pending.items() if v}  # fmt: skip
        if pending:
            state["pending"] = pending
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the running sums."""
        if "acc" not in state:
            raise HookError(f"hook {self.name!r}: state has no 'acc'; pass what state_dict() returned")
        for phase, acc in state["acc"].items():
            self._reset(phase)
            if acc is not None:
                self._sum[phase], self._seen[phase] = acc[0].clone(), acc[1].item()
        for phase, saved in state.get("pending", {}).items():
            self._pending[phase], self._scales[phase] = list(saved["values"].unbind()), list(saved["scales"])


def _stacked(values: list[torch.Tensor | float]) -> torch.Tensor:
    """``values`` as one tensor: the floats read on the CPU as float64; tensors on the device of the
    newest (restored values wait on the CPU at the front of the list, new ones are made on the
    Engine's device); a mix (a run resumed on the CPU, or a metric computed apart from the
    device) in the accumulator's dtype there."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return torch.tensor(values, dtype=torch.float64)
    device = tensors[-1].device
    if len(tensors) == len(values):
        if tensors[0].device != device:  # restored values (on the CPU): moved, in the new ones' dtype
            tensors = [v.to(device, tensors[-1].dtype) for v in tensors]
        return torch.stack(tensors)
    dtype = accumulator(device).dtype
    return torch.stack([torch.as_tensor(v, dtype=dtype, device=device) for v in values])


def _one_value(total: torch.Tensor, hook: str) -> torch.Tensor:
    if total.numel() != 1:
        raise HookError(
            f"hook {hook!r}: a batch's metric must be one number, got a tensor of shape {tuple(total.shape)}"
        )
    return total.reshape(())


class LossHook(_AveragedMetric):
    """Records the sample-weighted mean loss of each epoch: ``train/loss`` and ``test/loss``.

    Also puts every batch's loss into ``trainer.storage`` as ``train/loss`` (on an accelerator
    a tensor, read only where it is logged; on the CPU the float, read at once: see
    :func:`~ember.trainer.storage.held`). With gradient accumulation the loss is the micro-batch's own
    (not divided by the accumulation count).

    Args:
        on: phases to measure: ``"train"``, ``"test"`` or both.
        priority: default ``ABOVE_NORMAL`` (before logging hooks read the history).
        name: hook name (default ``"LossHook"``).

    Example:
        >>> trainer.fit(train_dl, epochs=3, test_dataloader=test_dl, hooks=[hooks.LossHook()])
        >>> trainer.history.values("train/loss")
    """

    metric_name = "loss"
    mode: Mode = "min"
    _always = frozenset({"after_train_iter"})  # puts every batch's loss into the step storage

    def __init__(
        self,
        on: str | Iterable[str] = ("train", "test"),
        priority: int | str = Priority.ABOVE_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(on, priority, name)

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Add this batch's loss to the epoch's sum and to the step storage."""
        value, trainer = held(loss), self._trainer_ref  # called by the bus: registered
        trainer.storage.put_scalar("train/loss", value)
        if "train" in self.on:
            n = int(trainer.step_result["batch_size"])
            self._add("train", value, n, n)

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Add this test batch's loss to the sum."""
        if "test" in self.on:
            n = self._batch_size()
            self._add("test", loss, n, scale=n)


def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "logits" in output:
        return output["logits"]
    if hasattr(output, "logits"):
        return output.logits
    raise HookError(
        f"AccuracyHook needs the model output to be a logits tensor (or have 'logits'), got {type(output).__name__}: "
        "pass accuracy_func=..."
    )


def topk_correct(output: Any, label: torch.Tensor, k: int = 1) -> torch.Tensor:
    """How many rows of ``output`` (N, C) have ``label`` among their ``k`` largest scores."""
    logits = _logits(output)
    if logits.dim() != 2 or not isinstance(label, torch.Tensor):
        raise HookError(
            f"AccuracyHook's default needs (N, C) logits and (N,) class labels, got logits of shape "
            f"{tuple(logits.shape)} and label {type(label).__name__}: pass accuracy_func=..."
        )
    if label.dim() == 2:  # one-hot or probabilities
        label = label.argmax(dim=1)
    top = logits.topk(min(k, logits.shape[1]), dim=1).indices
    return (top == label.view(-1, 1)).any(dim=1).sum()


class AccuracyHook(_AveragedMetric):
    """Records classification accuracy: ``test/accuracy`` (``top5_accuracy`` for ``topk=5``).

    Args:
        accuracy_func: ``f(output, label) -> number of correct samples`` in the batch (a
            tensor or int); default: top-``k`` over ``(N, C)`` logits and class labels.
        topk: ``k`` for the default function.
        on: phases to measure (default only ``"test"``; add ``"train"`` for train accuracy).
        priority: default ``ABOVE_NORMAL``.
        name: hook name.

    Example:
        >>> hooks.AccuracyHook(topk=5, on=("train", "test"))
    """

    mode: Mode = "max"

    def __init__(
        self,
        accuracy_func: Callable[[Any, Any], torch.Tensor | int] | None = None,
        topk: int = 1,
        on: str | Iterable[str] = ("test",),
        priority: int | str = Priority.ABOVE_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(on, priority, name)
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise HookError(f"AccuracyHook(topk=...) must be a positive int, got {topk!r}")
        if accuracy_func is not None and not callable(accuracy_func):
            raise HookError(f"AccuracyHook(accuracy_func=...) must be callable, got {type(accuracy_func).__name__}")
        self.topk = topk
        self.accuracy_func = accuracy_func
        self.metric_name = "accuracy" if topk == 1 else f"top{topk}_accuracy"

    def _count(self, phase: str, output: Any, label: Any) -> None:
        if output is None:
            raise HookError("AccuracyHook needs outputs and labels: do not pass return_output_label=False to fit")
        correct = self.accuracy_func(output, label) if self.accuracy_func else topk_correct(output, label, self.topk)
        self._add(phase, correct, self._batch_size())

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Count correct training predictions (when measuring ``"train"``)."""
        if "train" in self.on:
            self._count("train", output, label)

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Count correct test predictions."""
        if "test" in self.on:
            self._count("test", output, label)


class MetricHook(_AveragedMetric):
    """Records any metric: a per-batch function, or a torchmetrics ``Metric``.

    A callable ``metric(output, label)`` returns the batch's mean value; the hook averages it
    over samples and ranks. An object with ``update``/``compute``/``reset`` (a torchmetrics
    ``Metric``) is updated every batch and computed at the epoch's end (torchmetrics reduces
    across ranks itself: ``compute`` gathers every rank's state and applies its reductions).

    :meth:`state_dict` carries an epoch in progress, so a mid-epoch resume ends with the same
    epoch value: the running sums for a callable; for a torchmetrics ``Metric`` its accumulated
    ``metric_state`` and update count, this rank's own (checkpoints keep one per rank, and
    ``compute`` combines them after the resume as it would have without one). Another object
    with ``update``/``compute``/``reset`` is saved through its ``state_dict``/``load_state_dict``
    when it has them; without them its progress in an epoch is not saved.

    Args:
        metric: the callable or the Metric object.
        name: the metric's name; recorded as ``"<phase>/<name>"``. Also the hook's name.
        mode: ``"max"`` if higher is better, ``"min"`` otherwise (for ``history.best``).
        on: phases to measure (default ``"test"``).
        priority: default ``ABOVE_NORMAL``.

    Example:
        >>> hooks.MetricHook(lambda out, y: (out.argmax(1) == y).float().mean(), "acc")
        >>> hooks.MetricHook(torchmetrics.F1Score(task="multiclass", num_classes=10), "f1")
    """

    def __init__(
        self,
        metric: Any,
        name: str,
        mode: Mode = "max",
        on: str | Iterable[str] = ("test",),
        priority: int | str = Priority.ABOVE_NORMAL,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise HookError(f"MetricHook needs a non-empty metric name, got {name!r}")
        super().__init__(on, priority, name)
        if mode not in ("min", "max"):
            raise HookError(f"MetricHook(mode=...) must be 'min' or 'max', got {mode!r}")
        self.stateful = all(callable(getattr(metric, m, None)) for m in ("update", "compute", "reset"))
        if not self.stateful and not callable(metric):
            got = type(metric).__name__
            raise HookError(f"MetricHook(metric=...) must be callable or a torchmetrics Metric, got {got}")
        self.metric, self.metric_name, self.mode = metric, name, mode
        # The test pass runs inside a training epoch: each phase needs its own Metric object.
        self._objects: dict[str, Any] = {}
        if self.stateful:
            self._objects = {p: metric if i == 0 else copy.deepcopy(metric) for i, p in enumerate(self.on)}

    def after_hook_is_attached(self) -> None:
        """Move Metric objects to the Engine's device."""
        for phase, obj in self._objects.items():
            if callable(getattr(obj, "to", None)):
                self._objects[phase] = obj.to(self.trainer.engine.device)

    def _reset(self, phase: str) -> None:
        super()._reset(phase)
        if self.stateful and phase in self._objects:  # loading a state resets every phase, measured or not
            self._objects[phase].reset()

    def _update(self, phase: str, output: Any, label: Any) -> None:
        if self.stateful:
            self._objects[phase].update(output, label)
            return
        value = self.metric(output, label)
        n = self._batch_size()
        self._add(phase, value * n, n)

    def _finish(self, phase: str) -> None:
        if not self.stateful:
            super()._finish(phase)
            return
        value = self._objects[phase].compute()
        self.trainer.record_metric(f"{phase}/{self.metric_name}", value, self.mode)
        self._objects[phase].reset()

    def state_dict(self) -> dict[str, Any]:
        """The epoch in progress: running sums, and a stateful metric's accumulated state per phase."""
        state = super().state_dict()
        if self.stateful:
            saved = {phase: _object_state(obj) for phase, obj in self._objects.items()}
            if any(v is not None for v in saved.values()):
                state["metric"] = saved
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the running sums and a stateful metric's accumulated state."""
        super().load_state_dict(state)  # resets the Metric objects; their saved state follows
        for phase, saved in state.get("metric", {}).items():
            if phase not in self._objects:
                raise HookError(
                    f"hook {self.name!r}: saved metric state for phase {phase!r}, which this hook does not "
                    f"measure (on={self.on}); build it with the same on=... as the run that saved it"
                )
            if saved is not None:
                _load_object_state(self._objects[phase], saved, self.name)

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Update on a training batch (when measuring ``"train"``)."""
        if "train" in self.on:
            self._update("train", output, label)

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Update on a test batch."""
        if "test" in self.on:
            self._update("test", output, label)


def _cpu_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (list, tuple)):
        return [_cpu_copy(v) for v in value]
    return copy.deepcopy(value)


def _on_device(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device) if device is not None else value.clone()
    if isinstance(value, (list, tuple)):
        return [_on_device(v, device) for v in value]
    return copy.deepcopy(value)


def _object_state(obj: Any) -> dict[str, Any] | None:
    """A stateful metric's accumulated state on this rank, copied to the CPU (None: it exposes none)."""
    tensors = getattr(obj, "metric_state", None)  # torchmetrics: the states its compute() syncs and reduces
    if isinstance(tensors, Mapping):
        return {"metric_state": {k: _cpu_copy(v) for k, v in tensors.items()}, "updates": int(obj.update_count)}
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return {"state_dict": _cpu_copy(dict(obj.state_dict()))}
    return None


def _load_object_state(obj: Any, saved: Mapping[str, Any], hook: str) -> None:
    """Put :func:`_object_state`'s output back into a freshly reset metric object."""
    if "state_dict" in saved:
        obj.load_state_dict(saved["state_dict"])
        return
    current = getattr(obj, "metric_state", None)
    names = set(saved.get("metric_state", {}))
    if not isinstance(current, Mapping) or names != set(current):
        have = sorted(current) if isinstance(current, Mapping) else "none"
        raise HookError(
            f"hook {hook!r}: saved metric state {sorted(names)} does not fit {type(obj).__name__} "
            f"(its states: {have}): load it into the same kind of metric"
        )
    device = getattr(obj, "device", None)
    for name, value in saved["metric_state"].items():
        setattr(obj, name, _on_device(value, device))  # as torchmetrics' own _load_from_state_dict does
    # compute() warns when no update was counted, and "mean"-reduced states are weighted by the count.
    obj._update_count = int(saved.get("updates", 0))
