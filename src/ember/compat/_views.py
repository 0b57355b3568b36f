"""One ember checkpoint file with a peer's keys on top, for the compat packages' checkpointers.

pytorch-accelerated users read ``torch.load(path)["model_state_dict"]``, detectron2 users
``torch.load(path)["model"]``. :func:`save_with_view` writes ember's checkpoint of a trainer (it
resumes exactly) and adds the peer's keys at the top level, sharing the tensors (``torch.save``
stores a tensor once however many keys hold it), so there is one format underneath.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ember import checkpoint
from ember.checkpoint.snapshot import capture
from ember.errors import CheckpointError

__all__ = ["CHECKPOINT_SECTIONS", "save_with_view"]

CHECKPOINT_SECTIONS = frozenset(
    {"format", "version", "meta", "engine", "trainer", "hooks", "sampler", "ranks", "shards"}
)
"""The top-level keys of an ember checkpoint: a peer's view may not use them."""


def save_with_view(
    path: str | os.PathLike[str],
    trainer: checkpoint.TrainingState,
    view: Callable[[dict[str, Any]], Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write ``trainer``'s ember checkpoint to ``path`` with ``view(state)``'s keys on top; a collective.

    Args:
        path: the file (its parent is created).
        trainer: the ember Trainer (a :class:`~ember.checkpoint.TrainingState`).
        view: given the captured state (rank 0), returns the peer's top-level entries; it may
            also change the state (drop the optimizer's, say).
        extra: kept in ember's metadata (``meta["extra"]``), as :func:`ember.checkpoint.save` does.

    Raises:
        CheckpointError: the view uses a key of ember's; on every rank when rank 0 could not write.
    """
    state = capture(trainer, reason="manual", extra=extra)
    error: Exception | None = None
    if state is not None:
        top = dict(view(state))
        taken = sorted(set(top) & CHECKPOINT_SECTIONS)
        if taken:
            error = CheckpointError(f"the checkpoint's own keys {taken} cannot hold your entries: rename them")
        else:
            state.update(top)
            try:
                checkpoint.save_file(state, path)
            except (OSError, CheckpointError) as exc:
                error = exc if isinstance(exc, CheckpointError) else checkpoint.write_error(path, exc)
    checkpoint.agree_on_error(error, f"rank 0 could not write checkpoint {str(path)!r}")
