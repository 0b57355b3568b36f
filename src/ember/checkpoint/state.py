"""What a checkpoint holds besides the model: random number generators, copies to CPU."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states (plain, safe-to-load types)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(_as_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value: Any) -> Any:
    # random.setstate wants tuples all the way down; some loaders hand back lists.
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value


def to_cpu(obj: Any, staging: StagingBuffers | None = None) -> Any:
    """A deep copy of ``obj`` with every tensor cloned to CPU (for writing in the background).

    With ``staging``, the copies go into its buffers, reused from the previous call where the
    tensors match (see :class:`StagingBuffers`).
    """
    if staging is None:
        return _copy_tree(obj, lambda t: t.detach().to("cpu", copy=True))
    staging.start()
    copied = _copy_tree(obj, staging.copy)
    staging.finish()
    return copied


def _copy_tree(obj: Any, copy: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return copy(obj)
    if isinstance(obj, dict):
        return {k: _copy_tree(v, copy) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy_tree(v, copy) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy_tree(v, copy) for v in obj)
    return obj


class StagingBuffers:
    """CPU memory for background checkpoint writes, kept from one save to the next.

    Copying a state into freshly allocated memory costs page faults on every byte (on this
    machine the copy then ran at ~1 GB/s and stalled training for half a synchronous save); a
    second save of the same model copies into the same buffers (pinned when the source is on
    CUDA, so the copy is asynchronous until one final synchronize). Tensors are matched by
    their order in the state, shape and dtype; anything else gets a new buffer.

    The buffers of one save are overwritten by the next, so the caller must wait for the
    previous write to finish first (:class:`~ember.checkpoint.AsyncWriter` does).
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._cuda = False

    def start(self) -> None:
        """Begin a copy of a whole state."""
        self._next, self._cuda = 0, False

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """The next tensor of the state, copied into its buffer."""
        i, self._next = self._next, self._next + 1
        src = tensor.detach()
        on_cuda = src.device.type == "cuda"
        self._cuda |= on_cuda
        if i < len(self._buffers):
            buf = self._buffers[i]
            if buf.shape == src.shape and buf.dtype == src.dtype and (buf.is_pinned() or not on_cuda):
                return buf.copy_(src, non_blocking=on_cuda)
        buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=on_cuda)
        if i < len(self._buffers):
            self._buffers[i] = buf
        else:
            self._buffers.append(buf)
        return buf.copy_(src, non_blocking=on_cuda)

    def finish(self) -> None:
        """End the copy: drop buffers the state no longer has, wait for CUDA copies."""
        del self._buffers[self._next :]
        if self._cuda:
            torch.cuda.synchronize()
