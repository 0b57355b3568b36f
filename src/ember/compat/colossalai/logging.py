"""Colossal-AI's ``colossalai.logging``: ember's rank-aware logger under the same names.

``get_dist_logger()`` returns ember's :class:`~ember.logging.DistributedLogger`, whose
``info(msg, ranks=[0])`` logs on the listed ranks only, as Colossal-AI's does;
``disable_existing_loggers`` quiets the other libraries' loggers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ember.logging import DistributedLogger, get_dist_logger

__all__ = ["DistributedLogger", "disable_existing_loggers", "get_dist_logger"]


def disable_existing_loggers(include: Sequence[str] | None = None, exclude: Sequence[str] = ("colossalai",)) -> None:
    """Set the loggers created so far to ERROR, so only errors of other libraries show.

    Args:
        include: only these loggers (None: every logger created so far).
        exclude: loggers left as they are (their names and the loggers below them); ember's
            own (``"ember"``) is always left.

    Example:
        >>> disable_existing_loggers()   # before launch: other libraries' INFO lines go
    """
    kept = (*exclude, "ember")
    names = list(logging.root.manager.loggerDict) if include is None else list(include)
    for name in names:
        if any(name == k or name.startswith(f"{k}.") for k in kept):
            continue
        logging.getLogger(name).setLevel(logging.ERROR)
