"""ember's logger: standard ``logging`` records, with ``ranks=[0]`` to log on some ranks only.

ember logs under the ``"ember"`` logger (and its children, e.g. ``"ember.track.client"``). The
library installs no handler and sets no level: records propagate to the application's handlers
like any library's, and ``pytest``'s ``caplog`` sees them. Output is set up only by the ``ember``
command and the launch functions (:func:`setup_output`), and only when the application has not
configured logging itself.

Example:
    >>> logger = get_dist_logger()
    >>> logger.info("epoch %d done", 1, ranks=[0])     # on rank 0 only
    >>> logger.exception("evaluation failed")          # every rank, with the traceback
    >>> logging.getLogger("ember").setLevel("WARNING")  # as for any library
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

ROOT = "ember"
"""The name of ember's top logger; every ember logger is below it."""

_LOGGERS: dict[str, DistributedLogger] = {}
_FORMAT = "[%(asctime)s] %(levelname)s %(name)s%(rank)s: %(message)s"
_RANKS = "ember_ranks"  # the LogRecord attribute that carries a call's ``ranks``


def _rank_suffix() -> str:
    """`` (rank N)`` in a job of several processes, else nothing."""
    from ember import distributed  # imports torch: not at import time, so `ember runs ls` stays fast

    return f" (rank {distributed.rank()})" if distributed.world_size() > 1 else ""


class RankFilter(logging.Filter):
    """Drops a record whose ``ranks`` leave out this process's rank; sets ``record.rank``.

    ``ranks`` comes from a :class:`DistributedLogger` call (``logger.info(msg, ranks=[0])``);
    a record without it passes on every rank. ``record.rank`` is ``" (rank N)"`` when the job
    has several processes, else ``""``, for formats such as ember's
    ``"%(name)s%(rank)s: %(message)s"``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether this rank logs ``record``."""
        ranks = getattr(record, _RANKS, None)
        if ranks is not None:
            from ember import distributed

            if distributed.rank() not in ranks:
                return False
        if not hasattr(record, "rank"):
            record.rank = _rank_suffix()
        return True


class _Formatter(logging.Formatter):
    """ember's format; a record logged without a DistributedLogger gets its ``rank`` here."""

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "rank"):
            record.rank = _rank_suffix()
        return super().format(record)


class _StderrHandler(logging.StreamHandler):
    """ember's default output: whatever ``sys.stderr`` is at the time (notebooks swap it).

    It steps aside once the application gives the root logger a handler (``logging.basicConfig``
    after the launch): the root's handlers then get ember's records, and nothing prints twice.
    """

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def setup_output(level: int | str = logging.INFO) -> bool:
    """Print ember's records on stderr in ember's format, unless the application configured logging.

    The ``ember`` command and the launch functions (``ember.launch``, ``launch_from_*``) call it.
    It does nothing when the root logger has a handler (the application configured logging).
    Otherwise it gives the ``"ember"`` logger ``level`` if it has no level yet, and a stderr
    handler if it has no handler yet (one the application added, or this one from an earlier
    call). Records still propagate.

    Args:
        level: the ``"ember"`` logger's level when it has none (default INFO).

    Returns:
        Whether it added the stderr handler.

    Example:
        >>> logging.basicConfig(level=logging.DEBUG)  # before ember.launch: yours wins
        >>> ember.launch_from_torch()                 # calls setup_output(), which does nothing
    """
    logger = logging.getLogger(ROOT)
    if logging.getLogger().handlers:
        return False
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
    if logger.handlers:
        return False
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(_FORMAT, datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    return True


class DistributedLogger(logging.LoggerAdapter):
    """A :class:`logging.LoggerAdapter` whose methods also take ``ranks``: log on those ranks only.

    Every ``logging`` method works as on a Logger (``debug`` … ``critical``, ``exception``,
    ``log``, with ``exc_info``, ``stack_info``, ``stacklevel``, ``extra``); ``ranks=[0]`` (any
    iterable of global ranks; None: every rank) is carried on the record and applied by the
    :class:`RankFilter` this adapter puts on its logger.

    Args:
        name: the underlying ``logging`` logger's name.

    Example:
        >>> logger = get_dist_logger()
        >>> logger.info("epoch 1 done", ranks=[0])
        >>> logger.exception("step %d failed", 7, ranks=[0])
    """

    logger: logging.Logger

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})
        if not any(isinstance(f, RankFilter) for f in self.logger.filters):
            self.logger.addFilter(RankFilter())

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        """Move ``ranks`` from the call's keywords onto the record (as its ``extra``)."""
        ranks: Iterable[int] | None = kwargs.pop("ranks", None)
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        kwargs["extra"][_RANKS] = None if ranks is None else tuple(ranks)
        return msg, kwargs

    def set_level(self, level: int | str) -> None:
        """Set the level, e.g. ``"DEBUG"`` or ``logging.WARNING``."""
        self.logger.setLevel(level)

    def log_to_file(
        self, path: str | os.PathLike[str], mode: str = "a", level: int | str | None = None, suffix: str | None = None
    ) -> None:
        """Also write this logger's records to a file, in ember's format.

        Args:
            path: the file; or a folder, holding then ``rank_<rank>.log`` (``rank_<rank>_<suffix>.log``)
                as Colossal-AI's ``log_to_file(folder)`` writes.
            mode: ``"a"`` appends, ``"w"`` starts the file afresh.
            level: the lowest level written (default: every record the logger passes on).
            suffix: the file name's suffix when ``path`` is a folder.

        Example:
            >>> get_dist_logger().log_to_file("train.log")
        """
        target = Path(path)
        if target.is_dir():
            from ember import distributed

            target = target / f"rank_{distributed.rank()}{'' if suffix is None else '_' + suffix}.log"
        handler = logging.FileHandler(target, mode=mode)
        handler.setFormatter(_Formatter(_FORMAT))
        if level is not None:
            handler.setLevel(level)
        self.logger.addHandler(handler)


def get_dist_logger(name: str = ROOT) -> DistributedLogger:
    """Return the rank-aware logger called ``name`` (one instance per name).

    Args:
        name: a ``logging`` name; ember's own are ``"ember"`` and names below it.

    Returns:
        The :class:`DistributedLogger` over ``logging.getLogger(name)``.

    Example:
        >>> get_dist_logger().warning("loss is NaN", ranks=[0])
    """
    if name not in _LOGGERS:
        _LOGGERS[name] = DistributedLogger(name)
    return _LOGGERS[name]
