"""Which value of a metric is its best: one rule for ``ember runs`` and the web console.

A run records no direction for its metrics, so the direction is read from the name: names of
errors and costs (``loss``, ``err``, ``perplexity``, ``mse``, ``nll``, times...) are minimised
first, then names of scores (``acc``, ``f1``, ``auc``, ``bleu``, ``iou``, throughput...) are
maximised, and anything else is minimised too (``grad_norm``, ``lr``: a larger value is not a
better one). So ``top1_err`` is minimised although it holds ``top1``. ``ember runs compare
--mode min|max`` overrides it for one call.
"""

from __future__ import annotations

import re
from typing import Literal

Mode = Literal["min", "max"]

_LOWER_IS_BETTER = re.compile(r"loss|err|perplex|ppl|mse|mae|nll|latency|seconds|time|duration")
_HIGHER_IS_BETTER = re.compile(
    r"acc|top\d|f1|precision|recall|auc|map|iou|bleu|rouge|score|r2|throughput|samples_per_s|tokens_per_s"
)


def metric_mode(name: str) -> Mode:
    """Whether the best value of the metric ``name`` is its minimum or its maximum.

    Args:
        name: the metric's name, with or without its type (``"val/acc"`` or ``"acc"``).

    Returns:
        ``"min"`` or ``"max"`` (see the module for the rule).

    Example:
        >>> metric_mode("val/acc"), metric_mode("train/loss"), metric_mode("grad_norm"), metric_mode("top1_err")
        ('max', 'min', 'min', 'min')
    """
    lowered = name.rsplit("/", 1)[-1].lower()
    if _LOWER_IS_BETTER.search(lowered):
        return "min"
    return "max" if _HIGHER_IS_BETTER.search(lowered) else "min"


def best_value(name: str, minimum: float | None, maximum: float | None) -> float | None:
    """The best of a metric's values, given their minimum and maximum (NaN left out by the caller).

    Example:
        >>> best_value("val/acc", 0.1, 0.9), best_value("train/loss", 0.1, 0.9)
        (0.9, 0.1)
    """
    return maximum if metric_mode(name) == "max" else minimum
