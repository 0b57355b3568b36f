"""A logger that knows about ranks: ``logger.info("msg", ranks=[0])`` logs on rank 0 only."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

from ember import distributed

_LOGGERS: dict[str, DistributedLogger] = {}
_FORMAT = "[%(asctime)s] %(levelname)s %(name)s%(rank)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test captures, notebooks swap it)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class DistributedLogger:
    """A thin wrapper of :class:`logging.Logger` whose methods take ``ranks``.

    Args:
        name: the underlying ``logging`` logger's name.

    Example:
        >>> logger = get_dist_logger()
        >>> logger.info("epoch 1 done", ranks=[0])
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger = logging.getLogger(name)
        self._logger.propagate = False
        if not self._logger.handlers:
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
            self._logger.addHandler(handler)
            self._logger.setLevel(logging.INFO)

    @property
    def logger(self) -> logging.Logger:
        """The wrapped standard-library logger (add handlers or change its level here)."""
        return self._logger

    def set_level(self, level: int | str) -> None:
        """Set the level, e.g. ``"DEBUG"`` or ``logging.WARNING``."""
        self._logger.setLevel(level)

    def log_to_file(self, path: str) -> None:
        """Also write this logger's records to ``path`` (appending)."""
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(_FORMAT))
        self._logger.addHandler(handler)

    def _log(self, level: int, msg: str, ranks: Iterable[int] | None, args: tuple[Any, ...]) -> None:
        rank = distributed.rank()
        if ranks is not None and rank not in ranks:
            return
        suffix = f" (rank {rank})" if distributed.world_size() > 1 else ""
        self._logger.log(level, msg, *args, extra={"rank": suffix}, stacklevel=3)

    def debug(self, msg: str, *args: Any, ranks: Iterable[int] | None = None) -> None:
        """Log ``msg`` at DEBUG on the listed ranks (all ranks when ``ranks`` is None)."""
        self._log(logging.DEBUG, msg, ranks, args)

    def info(self, msg: str, *args: Any, ranks: Iterable[int] | None = None) -> None:
        """Log ``msg`` at INFO on the listed ranks (all ranks when ``ranks`` is None)."""
        self._log(logging.INFO, msg, ranks, args)

    def warning(self, msg: str, *args: Any, ranks: Iterable[int] | None = None) -> None:
        """Log ``msg`` at WARNING on the listed ranks (all ranks when ``ranks`` is None)."""
        self._log(logging.WARNING, msg, ranks, args)

    def error(self, msg: str, *args: Any, ranks: Iterable[int] | None = None) -> None:
        """Log ``msg`` at ERROR on the listed ranks (all ranks when ``ranks`` is None)."""
        self._log(logging.ERROR, msg, ranks, args)


def get_dist_logger(name: str = "ember") -> DistributedLogger:
    """Return the rank-aware logger called ``name`` (one instance per name)."""
    if name not in _LOGGERS:
        _LOGGERS[name] = DistributedLogger(name)
    return _LOGGERS[name]
