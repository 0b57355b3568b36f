"""What the hooks that log one line per epoch share: the logger, the ranks and the line's writing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember.trainer.hooks.base import BaseHook, Priority


class EpochLogHook(BaseHook):
    """A hook that logs a line of ``" | "``-joined parts each epoch, on some ranks.

    Args:
        logger: an ember ``DistributedLogger`` (default: the Trainer's).
        ranks: ranks that log (default rank 0; None: every rank).
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Attributes:
        last: the numbers logged last.
    """

    def __init__(
        self, logger: Any = None, ranks: Iterable[int] | None = (0,), priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        self._logger, self.ranks = logger, None if ranks is None else list(ranks)
        self.last: dict[str, float] = {}

    def _log_line(self, parts: list[str]) -> None:
        """Log ``parts`` joined with ``" | "`` with the hook's logger, or the Trainer's."""
        logger = self._logger if self._logger is not None else self.trainer.logger
        logger.info(" | ".join(parts), ranks=self.ranks)
