"""Colossal-AI's ``colossalai.logging``: ember's rank-aware logger under the same names.

``get_dist_logger()`` returns ember's :class:`~ember.logging.DistributedLogger`, whose
``info(msg, ranks=[0])`` logs on the listed ranks only, as Colossal-AI's does.
"""

from __future__ import annotations

from ember.logging import DistributedLogger, get_dist_logger

__all__ = ["DistributedLogger", "get_dist_logger"]
