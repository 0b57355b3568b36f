"""The compare page's "best" highlight: every run that ties for a metric's best value is marked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ember.server.console.compare import best_runs


def _runs(bests: dict[str, float | None]) -> tuple[list[Any], dict[int, dict[str, dict[str, Any]]]]:
    runs = [SimpleNamespace(pk=pk, id=run_id) for pk, run_id in enumerate(bests)]
    summary = {pk: ({} if best is None else {"val/loss": {"best": best}, "val/acc": {"best": best}})
               for pk, best in enumerate(bests.values())}  # fmt: skip
    return runs, summary


def test_every_run_tying_for_the_best_value_is_marked_not_only_the_first() -> None:
    runs, summary = _runs({"a": 0.5, "b": 0.25, "c": 0.25, "d": 0.75, "e": None})
    best = best_runs(runs, summary, ["val/loss", "val/acc"])
    assert best["val/loss"] == {"b", "c"}  # a loss: the lowest, held by two runs
    assert best["val/acc"] == {"d"}  # an accuracy: the highest


def test_a_metric_no_run_has_gets_no_entry() -> None:
    runs, summary = _runs({"a": None})
    assert best_runs(runs, summary, ["val/loss"]) == {}
