"""``titans.utils.barrier_context``: rank 0 runs the block first (a download), the others after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ember import distributed


@contextlib.contextmanager
def barrier_context(executor_rank: int = 0, parallel_mode: object = None) -> Iterator[None]:
    """Rank ``executor_rank`` enters first; the others wait for it at a barrier."""
    if distributed.rank() != executor_rank:
        distributed.barrier()
    yield
    if distributed.rank() == executor_rank:
        distributed.barrier()
