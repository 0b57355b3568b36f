"""Batches as ember's loops see them: tensors, tuples, lists or dicts of them.

One set of conventions for the Trainer, its default schedule and the pipeline schedule: how a
batch splits into the model's inputs and its label (:func:`split_batch`), how many samples it
holds (:func:`batch_size`), and one forward pass over it (:func:`forward`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from ember.data import to_device
from ember.errors import TrainerError

T = TypeVar("T")

__all__ = ["LABEL_KEYS", "batch_size", "batches_per_epoch", "forward", "predict", "split_batch", "to_device", "trim"]

LABEL_KEYS = ("label", "labels", "target", "targets", "y")
"""Keys taken as the label of a dict batch, first match wins."""


def split_batch(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """Split a batch into the model's positional and keyword inputs and the label.

    * a tensor: the input, no label;
    * a tuple or list: all but the last item are inputs, the last is the label (one item: the
      input, no label);
    * a dict: the first of ``label``, ``labels``, ``target``, ``targets``, ``y`` is the label,
      the other items are keyword inputs.

    Override :meth:`Trainer.train_step` for other layouts.
    """
    if type(batch) is tuple and len(batch) == 2:  # the common (inputs, label) pair, without the checks below
        return (batch[0],), {}, batch[1]
    if isinstance(batch, torch.Tensor):
        return (batch,), {}, None
    if isinstance(batch, (tuple, list)):
        if len(batch) == 0:
            raise TrainerError("got an empty batch (a tuple/list with no items)")
        if len(batch) == 1:
            return (batch[0],), {}, None
        return tuple(batch[:-1]), {}, batch[-1]
    if isinstance(batch, Mapping):
        key = next((k for k in LABEL_KEYS if k in batch), None)
        inputs = {str(k): v for k, v in batch.items() if k != key}
        return (), inputs, None if key is None else batch[key]
    raise TrainerError(
        f"cannot split a batch of type {type(batch).__name__} into inputs and label: batches must be "
        "tensors, tuples, lists or dicts, or override Trainer.train_step/eval_step"
    )


def forward(engine: Any, batch: Any, move: bool = False) -> tuple[Any, Any, int]:
    """Run ``engine``'s forward pass on ``batch``: ``(output, label, batch size)``.

    Args:
        engine: the :class:`~ember.engine.Engine` (or anything callable with the inputs).
        batch: split by :func:`split_batch` into positional or keyword inputs and the label.
        move: move the whole batch, label included, to ``engine.device`` first (so that hooks
            compare labels with outputs on one device).

    Example:
        >>> output, label, n = forward(engine, (x, y))
    """
    if move:
        batch = to_device(batch, engine.device)
    args, kwargs, label = split_batch(batch)
    output = engine(*args, **kwargs) if kwargs else engine(*args)
    return output, label, batch_size(batch)


@torch.no_grad()
def predict(engine: Any, data: Any) -> Any:
    """``Trainer.predict``: the Engine's forward pass in evaluation mode on a batch or a loader."""
    was_training = engine.training
    engine.eval()
    try:
        if isinstance(data, torch.Tensor):
            return engine(to_device(data, engine.device))
        if isinstance(data, (tuple, list)):
            return engine(*to_device(data, engine.device))
        if isinstance(data, Mapping):
            return engine(**to_device(data, engine.device))
        outputs = []
        for batch in data:
            args, kwargs, _ = split_batch(to_device(batch, engine.device))
            outputs.append(engine(*args, **kwargs))
    finally:
        engine.train(was_training)
    return torch.cat(outputs) if outputs and all(isinstance(o, torch.Tensor) for o in outputs) else outputs


def batch_size(batch: Any) -> int:
    """The number of samples in ``batch``: the first dimension of its first tensor."""
    first = batch[0] if type(batch) is tuple and batch else batch
    if type(first) is torch.Tensor and first.dim() > 0:  # the common case, without the search below
        return first.shape[0]
    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise TrainerError(
            f"cannot tell the batch size of a {type(batch).__name__} batch (no tensor with a batch "
            "dimension): return 'batch_size' from an overridden train_step/eval_step"
        )
    return int(tensor.shape[0])


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    items: Iterable[Any] = ()
    if isinstance(batch, (list, tuple)):  # before Mapping: an ABC check costs more
        items = batch
    elif isinstance(batch, Mapping):
        items = batch.values()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def trim(batch: Any, n: int, size: int) -> Any:
    """The first ``n`` samples of a batch of ``size`` samples.

    Tensors are cut along their first dimension; lists and tuples of plain values (strings,
    numbers) whose length is the batch size are cut too; nested containers are followed.
    """
    if isinstance(batch, torch.Tensor):
        return batch[:n] if batch.dim() > 0 and batch.shape[0] == size else batch
    if isinstance(batch, Mapping):
        return {k: trim(v, n, size) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        if len(batch) == size and all(isinstance(v, (str, bytes, int, float)) or v is None for v in batch):
            return type(batch)(batch[:n]) if not hasattr(batch, "_fields") else batch
        items = [trim(v, n, size) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def batches_per_epoch(loader: Any) -> int | None:
    """Batches in a full epoch on this rank (a pending mid-epoch start does not shorten it)."""
    sampler = getattr(loader, "sampler", None)
    bs = getattr(loader, "batch_size", None)
    if getattr(loader, "batch_sampler", None) is not None and bs and hasattr(sampler, "num_samples"):
        n = int(sampler.num_samples)  # type: ignore[union-attr]
        return n // bs if loader.drop_last else math.ceil(n / bs)
    try:
        return len(loader)
    except TypeError:
        return None


def mark_last(iterable: Iterable[T], total: int | None, start: int) -> Iterator[tuple[T, bool]]:
    """Yield ``(item, is_last)`` for an epoch of ``total`` batches of which ``start`` were consumed.

    With a known length nothing is read ahead (reading batch k+1 before batch k's hooks ran
    would move random state a checkpoint taken there records), and no Python frame runs per
    item; without one, look one ahead.
    """
    if total is None:
        return with_last(iterable)
    return zip(iterable, map(total.__eq__, itertools.count(start + 1)), strict=False)  # the count is endless


def with_last(iterable: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Yield ``(item, is_last)``, looking one item ahead (works without ``len``)."""
    it = iter(iterable)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


def hook_args(result: Mapping[str, Any], keep_outputs: bool) -> tuple[Any, Any, Any]:
    """``(output, label, loss)`` for ``after_*_iter`` (outputs and labels None unless kept)."""
    if keep_outputs:
        return result["output"], result["label"], result["loss"]
    return None, None, result["loss"]
