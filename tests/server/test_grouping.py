"""The runs table's groups (issue 33, item 6): one per combination of the keys' values, each with
the mean and population std of its runs' finite last and best values; keys checked."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ember.server.services.grouping import MAX_KEYS, group_runs, parse_keys
from ember.server.storage.domain_errors import Invalid


def _row(name: str, hparams: dict[str, Any], last: Any, best: Any = None) -> dict[str, Any]:
    return {"name": name, "hparams": hparams, "metrics": {"val/acc": {"last": last, "best": best}}}


def test_one_group_per_combination_in_table_order_with_mean_and_std_of_finite_values() -> None:
    rows = [
        _row("a", {"opt": "sgd", "lr": 0.1}, 0.5, 0.6),
        _row("b", {"opt": "adam", "lr": 0.1}, 0.7, 0.8),
        _row("c", {"opt": "sgd", "lr": 0.1}, 0.9, 1.0),
        _row("d", {"opt": "sgd", "lr": 0.01}, math.nan, None),  # no finite value: not counted
        _row("e", {"lr": 0.1}, 0.1),  # no opt: its own group
    ]
    groups = group_runs(rows, ["opt", "lr"], ["val/acc", "val/loss"])
    assert [(g.label, [r["name"] for r in g.runs]) for g in groups] == [
        ("opt=sgd · lr=0.1", ["a", "c"]),
        ("opt=adam · lr=0.1", ["b"]),
        ("opt=sgd · lr=0.01", ["d"]),
        ("opt=— · lr=0.1", ["e"]),
    ]
    sgd = groups[0].metrics["val/acc"]
    assert sgd["n"] == 2 and sgd["last_mean"] == pytest.approx(0.7) and sgd["last_std"] == pytest.approx(0.2)
    assert sgd["best_mean"] == pytest.approx(0.8) and sgd["best_std"] == pytest.approx(0.2)
    assert groups[1].metrics["val/acc"]["last_std"] == 0.0  # one run
    assert "val/acc" not in groups[2].metrics and "val/loss" not in groups[0].metrics
    assert groups[0].hparams == {"lr": (0.1, 1), "opt": ("sgd", 1)}


def test_keys_are_checked() -> None:
    assert parse_keys(" opt, lr ,opt,", ["lr", "opt"]) == ["opt", "lr"]
    with pytest.raises(Invalid, match=r"no run here has the hyper-parameter 'nope'.*here: lr, opt"):
        parse_keys("opt,nope", ["lr", "opt"])
    with pytest.raises(Invalid, match=f"at most {MAX_KEYS}"):
        parse_keys(",".join("abcde"), list("abcde"))
