"""What a checkpoint holds besides the model: random number generators, copies to CPU."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ember.errors import CheckpointError


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
    random.setstate(as_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def as_tuple(value: Any) -> Any:
    """Lists as tuples, all the way down: what ``random.setstate`` wants (some loaders give lists)."""
    if isinstance(value, list | tuple):
        return tuple(as_tuple(v) for v in value)
    return value


def to_cpu(obj: Any, staging: StagingBuffers | None = None, defer: Callable[[torch.Tensor], bool] | None = None) -> Any:
    """A deep copy of ``obj`` with every tensor cloned to CPU (for writing in the background).

    With ``staging``, the copies go into its buffers, reused from the previous call where the
    tensors match (see :class:`StagingBuffers`); CPU tensors for which ``defer`` is true get
    their buffers but are copied later, by the :class:`DeferredCopy` that
    :meth:`StagingBuffers.take_deferred` returns.
    """
    if staging is None:
        return _copy_tree(obj, lambda t: t.detach().to("cpu", copy=True))
    staging.start(defer)
    copied = _copy_tree(obj, staging.copy)
    staging.finish()
    return copied


_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def only_scalars(seq: list[Any] | tuple[Any, ...] | set[Any]) -> bool:
    """Whether a sequence holds plain numbers/strings only (Python's RNG state is 625 ints):
    the tree walks skip its items at C speed."""
    return set(map(type, seq)) <= _SCALARS


def _copy_tree(obj: Any, copy: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return copy(obj)
    if isinstance(obj, dict):
        return {k: _copy_tree(v, copy) for k, v in obj.items()}
    if isinstance(obj, list):
        return list(obj) if only_scalars(obj) else [_copy_tree(v, copy) for v in obj]
    if isinstance(obj, tuple):
        return obj if only_scalars(obj) else tuple(_copy_tree(v, copy) for v in obj)
    return obj


class StagingBuffers:
    """CPU memory for background checkpoint writes, kept from one save to the next.

    Copying a state into freshly allocated memory costs page faults on every byte (here the
    first copy of a 100 MB state took ~100 ms against ~10 ms into touched memory). So a save
    copies into the buffers of the previous one (matched by shape and dtype; pinned when the
    source is on CUDA, so the copy is asynchronous until one final synchronize), and
    :meth:`prepare` can allocate and touch the first save's buffers in a background thread
    while training goes on.

    The buffers of one save are overwritten by the next, so the caller must wait for the
    previous write to finish first (:class:`~ember.checkpoint.AsyncWriter` does).

    Tensors that only the optimizer step changes (its state; for most models the parameters)
    need not be copied before training goes on, only before that step: :meth:`start` takes a
    ``defer`` test, such CPU tensors are left out of :meth:`finish`, and :meth:`take_deferred`
    returns them as a :class:`DeferredCopy`, to copy in the background while the next batch's
    forward and backward pass run (as CheckFreq does).
    """

    def __init__(self) -> None:
        self._used: list[torch.Tensor] = []  # the current (or last) save's buffers
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._cuda = False
        self._deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._defer: Callable[[torch.Tensor], bool] | None = None
        self._later: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._preparing: threading.Thread | None = None

    @staticmethod
    def _key(shape: torch.Size, dtype: torch.dtype, pinned: bool) -> tuple[Any, ...]:
        return (tuple(shape), dtype, pinned)

    def prepare(self, tensors: list[torch.Tensor]) -> None:
        """Allocate and touch buffers for ``tensors`` in a background thread (once, before the
        first save), so that save copies into memory that is already mapped."""
        if self._preparing is not None or self._used:
            return
        specs = [(t.shape, t.dtype, t.device.type == "cuda") for t in tensors]

        def allocate() -> None:
            for shape, dtype, pinned in specs:
                buf = torch.empty(shape, dtype=dtype, pin_memory=pinned)
                buf.zero_()  # fault the pages in now, not during the save
                self._free.setdefault(self._key(shape, dtype, pinned), []).append(buf)

        self._preparing = threading.Thread(target=allocate, name="ember-staging-prepare", daemon=True)
        self._preparing.start()

    def start(self, defer: Callable[[torch.Tensor], bool] | None = None) -> None:
        """Begin a copy of a whole state: the last save's buffers become free for reuse.

        ``defer``: which CPU tensors to leave for :meth:`take_deferred` (None: copy all now).
        """
        if self._preparing is not None:
            self._preparing.join()
        for buf in self._used:
            self._free.setdefault(self._key(buf.shape, buf.dtype, buf.is_pinned()), []).append(buf)
        self._used, self._cuda = [], False
        self._deferred.clear()
        self._defer, self._later = defer, []

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """The next tensor of the state, copied into a buffer."""
        src = tensor.detach()
        on_cuda = src.device.type == "cuda"
        self._cuda |= on_cuda
        free = self._free.get(self._key(src.shape, src.dtype, on_cuda))
        buf = free.pop() if free else torch.empty(src.shape, dtype=src.dtype, pin_memory=on_cuda)
        self._used.append(buf)
        if not on_cuda and self._defer is not None and self._defer(src):
            self._later.append((buf, src, src._version))  # copied by take_deferred()'s DeferredCopy
            return buf
        if not on_cuda and _parallel(src):
            self._deferred.append((buf, src))  # copied in parallel chunks by finish()
            return buf
        return buf.copy_(src, non_blocking=on_cuda)

    def finish(self) -> None:
        """End the copy: copy the large CPU tensors, free buffers the state no longer has,
        wait for CUDA copies."""
        self._free.clear()
        if self._deferred:
            _parallel_copy(self._deferred)
            self._deferred.clear()
        if self._cuda:
            torch.cuda.synchronize()

    def take_deferred(self) -> DeferredCopy | None:
        """The copies :meth:`copy` left for later (None when there are none)."""
        later, self._later = self._later, []
        return DeferredCopy(later) if later else None


class DeferredCopy:
    """Copies of a checkpoint's tensors made in a background thread, checked in the training thread.

    The writer thread calls :meth:`run`: it copies, then waits for the training thread's
    :meth:`check` before the checkpoint may be written. The training thread calls
    :meth:`wait_copied` and then :meth:`check` before anything may change the sources (the
    optimizer step): ``check`` compares each source's version counter with the one it had when
    the state was captured. It runs in the training thread because an in-place operation there
    moves the counter only when it has finished; by then every one has. A change made where
    torch does not count it (through ``.data``, or a NumPy view) is not seen.
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor, int]]) -> None:
        self._pairs = pairs  # (buffer, source, the source's version when captured)
        self._owner = threading.current_thread()  # the training thread, which calls check()
        self._copied = threading.Event()
        self._checked = threading.Event()
        self._moved: list[torch.Tensor] = []

    def run(self) -> None:
        """Copy (in the writer thread), then wait for :meth:`check`.

        Raises:
            CheckpointError: a source was changed in place before the check (the copies may
                mix two states: nothing is to be written), or the training thread ended
                without checking.
        """
        try:
            _parallel_copy([(buf, src) for buf, src, _ in self._pairs])
        finally:
            self._copied.set()
        while not self._checked.wait(0.5):
            if not self._owner.is_alive():
                raise CheckpointError("the training thread ended before the checkpoint's background copy was checked")
        if self._moved:
            shapes = ", ".join(str(tuple(t.shape)) for t in self._moved[:3])
            raise CheckpointError(
                f"{len(self._moved)} tensor(s) of the optimizer's state or parameters (shapes {shapes}) were "
                "changed in place between the save and the optimizer step, while async_save was copying them: "
                "the checkpoint would mix two states and was not written. A model whose forward writes its own "
                "weights (nn.Embedding(max_norm=...)) needs background_copy=False"
            )

    def wait_copied(self) -> None:
        """Block (in the training thread) until the copies are made."""
        self._copied.wait()

    def check(self) -> None:
        """Compare the sources' version counters (in the training thread, after :meth:`wait_copied`);
        :meth:`run` then lets the write go on, or raises."""
        self._moved = [src for _, src, version in self._pairs if src._version != version]
        self._checked.set()


def _parallel(src: torch.Tensor) -> bool:
    return src.is_contiguous() and src.nbytes >= _PARALLEL_COPY_BYTES


_PARALLEL_COPY_BYTES = 1 << 20
_CHUNK_BYTES = 8 << 20
_copy_pool: ThreadPoolExecutor | None = None


def _parallel_copy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy ``src`` into ``dst`` for each pair: large contiguous tensors in chunks spread over a
    few threads, the others here.

    One thread copies at well under the memory bandwidth (about 4 GB/s here), and the training
    loop is waiting on this copy: ``copy_`` releases the GIL, so the chunks run on every core
    (at most 4 threads), whatever ``torch.get_num_threads()`` says.
    """
    global _copy_pool
    workers = min(4, os.cpu_count() or 1)
    chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
    for dst, src in pairs:
        if not _parallel(src):
            dst.copy_(src)
            continue
        flat_dst, flat_src = dst.view(-1), src.view(-1)
        step = max(1, _CHUNK_BYTES // src.element_size())
        chunks += [(flat_dst[i : i + step], flat_src[i : i + step]) for i in range(0, flat_src.numel(), step)]
    if workers == 1 or len(chunks) <= 1:
        for dst, src in chunks:
            dst.copy_(src)
        return
    if _copy_pool is None:
        _copy_pool = ThreadPoolExecutor(workers, thread_name_prefix="ember-staging")
    for done in _copy_pool.map(lambda pair: pair[0].copy_(pair[1]), chunks):
        del done  # map re-raises a worker's exception here
