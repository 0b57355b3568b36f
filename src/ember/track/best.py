"""Which value of a metric is its best: one rule for ``ember runs``, the web console and ``ember ui``.

A run can record the direction of a metric, as W&B's ``define_metric(..., summary="max")`` and
Keras/Lightning's ``monitor`` + ``mode`` say it: :meth:`ember.track.Run.define_metric` keeps
``{"val/acc": "max"}`` under :data:`MODES_KEY` in the run's ``run.json`` (so it survives a resume
and an upload), and the Trainer's ``TrackingHook`` records the mode of every metric an
``EarlyStoppingHook`` or a ``CheckpointHook(save_best=...)`` watches with an explicit ``mode``.

A recorded mode comes first (:func:`metric_mode`). Without one, the direction is read from the
name: names of errors and costs (``loss``, ``err``, ``perplexity``, ``mse``, ``nll``, times...) are
minimised first, then names of scores (``acc``, ``f1``, ``auc``, ``bleu``, ``iou``,
throughput...) are maximised, and anything else is minimised too (``grad_norm``, ``lr``: a larger
value is not a better one). So ``top1_err`` is minimised although it holds ``top1``.

Runs shown together (a page of the runs table, the compare page, ``ember runs compare``) share
one mode per metric (:func:`majority_mode`): the mode most of them record; on a tie, or when
none records one, the name rule. ``ember runs compare --mode min|max`` overrides it for one call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal, cast

from ember.errors import TrackingError, short_repr
from ember.track._values import normalize_type

Mode = Literal["min", "max"]
MODES: tuple[Mode, Mode] = ("min", "max")
MODES_KEY = "metric_modes"
"""The key of ``run.json`` holding the recorded modes: ``{"val/acc": "max", "val/score_gap": "min"}``."""
_MAX_KEY_CHARS = 300

_LOWER_IS_BETTER = re.compile(r"loss|err|perplex|ppl|mse|mae|nll|latency|seconds|time|duration")
_HIGHER_IS_BETTER = re.compile(
    r"acc|top\d|f1|precision|recall|auc|map|iou|bleu|rouge|score|r2|throughput|samples_per_s|tokens_per_s"
)


def check_mode(mode: object, where: str) -> Mode:
    """``mode`` if it is ``"min"`` or ``"max"``, else a :class:`~ember.errors.TrackingError` naming ``where``.

    Example:
        >>> check_mode("max", "define_metric(mode=...)")
        'max'
    """
    if mode not in MODES:
        raise TrackingError(f"{where}: mode must be 'min' or 'max', got {short_repr(mode)}")
    return cast(Mode, mode)


def metric_key(name: object) -> str:
    """The stored key of a metric written ``TYPE/NAME``: its type as ``Run.log`` stores it.

    Args:
        name: e.g. ``"val/acc"``, ``"validation/acc"`` (stored as ``val/acc``) or
            ``"train/time/step_s"`` (the type is the part before the first ``/``).

    Raises:
        TrackingError: not a str of a metric type, a ``/`` and a non-empty metric name.

    Example:
        >>> metric_key("validation/acc"), metric_key("train/time/step_s")
        ('val/acc', 'train/time/step_s')
    """
    if not isinstance(name, str) or "/" not in name or len(name) > _MAX_KEY_CHARS:
        raise TrackingError(
            f"metric {short_repr(name)}: name it TYPE/NAME as the console shows it, e.g. 'val/acc' for "
            f"run.log('val', {{'acc': ...}}) (at most {_MAX_KEY_CHARS} characters)"
        )
    type_, _, metric = name.partition("/")
    if not metric:
        raise TrackingError(f"metric {short_repr(name)} has no name after its type {type_!r}, e.g. 'val/acc'")
    return f"{normalize_type(type_)}/{metric}"


def recorded_modes(meta: Mapping[str, Any] | Any) -> dict[str, Mode]:
    """The modes a run recorded, read from its ``run.json`` (``meta``); entries that are not
    ``"min"``/``"max"`` (a hand-edited or foreign file) are left out.

    Example:
        >>> recorded_modes({"metric_modes": {"val/score_gap": "min", "val/x": "up"}})
        {'val/score_gap': 'min'}
    """
    found = meta.get(MODES_KEY) if isinstance(meta, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {k: cast(Mode, v) for k, v in found.items() if isinstance(k, str) and v in MODES}


def metric_mode(name: str, recorded: str | None = None) -> Mode:
    """Whether the best value of the metric ``name`` is its minimum or its maximum.

    Args:
        name: the metric's name, with or without its type (``"val/acc"`` or ``"acc"``).
        recorded: the mode the run recorded for it (``recorded_modes(meta).get(name)``), or
            None: then the name decides.

    Returns:
        ``recorded`` when given, else ``"min"`` or ``"max"`` by the name (see the module).

    Raises:
        TrackingError: ``recorded`` is neither None, ``"min"`` nor ``"max"``.

    Example:
        >>> metric_mode("val/acc"), metric_mode("train/loss"), metric_mode("grad_norm"), metric_mode("top1_err")
        ('max', 'min', 'min', 'min')
        >>> metric_mode("val/score_gap"), metric_mode("val/score_gap", recorded="min")
        ('max', 'min')
    """
    if recorded is not None:
        return check_mode(recorded, f"metric_mode({short_repr(name)}, recorded=...)")
    lowered = name.rsplit("/", 1)[-1].lower()
    if _LOWER_IS_BETTER.search(lowered):
        return "min"
    return "max" if _HIGHER_IS_BETTER.search(lowered) else "min"


def majority_mode(name: str, recorded: Iterable[str | None]) -> Mode:
    """The one mode of a metric for runs shown together, each of which may have recorded one.

    The mode most of the runs that recorded one recorded; a tie, or no run recording one: the
    name rule (:func:`metric_mode`). Runs that recorded nothing do not vote.

    Args:
        name: the metric, ``TYPE/NAME``.
        recorded: per run, its recorded mode for ``name`` or None.

    Example:
        >>> majority_mode("val/score_gap", ["min", None, "min", "max"])
        'min'
        >>> majority_mode("val/score_gap", ["min", "max"]), majority_mode("val/loss", [None, None])
        ('max', 'min')
    """
    votes = Counter(m for m in recorded if m in MODES)
    if votes["min"] == votes["max"]:
        return metric_mode(name)
    return "min" if votes["min"] > votes["max"] else "max"


def best_value(name: str, minimum: float | None, maximum: float | None, mode: str | None = None) -> float | None:
    """The best of a metric's values, given their minimum and maximum (NaN left out by the caller).

    Args:
        mode: the metric's mode when known (recorded, or agreed by :func:`majority_mode`);
            None: the name rule.

    Example:
        >>> best_value("val/acc", 0.1, 0.9), best_value("train/loss", 0.1, 0.9), best_value("val/acc", 0.1, 0.9, "min")
        (0.9, 0.1, 0.1)
    """
    return maximum if metric_mode(name, mode) == "max" else minimum
