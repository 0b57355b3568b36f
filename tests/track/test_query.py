"""The filter language (issue 33, item 1): its parser, every error pointing at its column, today's
``hp:``/``m:`` filters read as before, the Python evaluator's rules, and ``ember runs ls --filter``.

The same filters through the SQL evaluator: ``tests/server/test_filter_equivalence.py``.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track import query
from ember.track.cli import add_commands
from ember.track.query import Evidence, FilterError, RunFacts, matches, parse, render

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # the dev extra has it (pyproject.toml); under CI its absence is a failure
    if os.environ.get("CI"):
        raise
    pytest.skip("hypothesis is not installed: pip install -e '.[dev]'", allow_module_level=True)


def ember(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.handler(args))


def run(name: str = "r", status: str = "Complete", labels: tuple[str, ...] = (), start: Any = None,
        hparams: dict[str, Any] | None = None, **metrics: tuple[Any, Any, Any]) -> RunFacts:  # fmt: skip
    """A run as the evaluator sees it; ``val_acc=(last, min, max)`` is the metric ``val/acc``."""
    facts = {k.replace("_", "/", 1): query.metric_facts(k.replace("_", "/", 1), *v, {}) for k, v in metrics.items()}
    return RunFacts(name, status, labels, start, hparams or {}, facts)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("hp:lr>=0.01; m:val/acc>0.9", "hp:lr >= 0.01 and m:val/acc > 0.9"),  # the console's bookmarks
        ("hp:opt~SG", "hp:opt ~ SG"),
        ("hp:config.opt.name=adam", "hp:config.opt.name = adam"),
        ("m:val/acc>0.9 and hp:lr<0.001", "m:val/acc > 0.9 and hp:lr < 0.001"),
        ("m:validation/acc.BEST > .5", "m:val/acc.best > .5"),  # the type as Run.log stores it
        ("HP:lr == 1E-3 AND NOT status = crashed", "hp:lr = 1E-3 and not status = Crashed"),
        ("hp:a=1 or hp:b=2 and hp:c=3", "hp:a = 1 or (hp:b = 2 and hp:c = 3)"),  # and binds tighter
        ("(hp:a=1 or hp:b=2) and hp:c=3", "(hp:a = 1 or hp:b = 2) and hp:c = 3"),
        ("hp:a=1 or hp:b=2; hp:c=3", "(hp:a = 1 or hp:b = 2) and hp:c = 3"),  # ';' joins whole conditions
        ("not not hp:a = 1", "not not hp:a = 1"),
        ("hp:opt not in (adam, 'sgd w')", 'hp:opt not in (adam, "sgd w")'),
        ('hp:"batch size" != null', 'hp:"batch size" != null'),
        ('m:"val/acc.best".max <= 3', 'm:"val/acc.best".max <= 3'),  # a metric named acc.best, its maximum
        ("label in (base, x) , name ~ 'res net'", 'label in (base, x) and name ~ "res net"'),
        ("start>=2026-11-01T10:00:00.5Z or start<7d ago", "start >= 2026-11-01T10:00:00.5Z or start < 7d ago"),
        ("  ; hp:a = 1 ;  ", "hp:a = 1"),
    ],
)  # fmt: skip
def test_a_filter_reads_as_its_canonical_text_and_back(text: str, canonical: str) -> None:
    tree = parse(text, now=1e9)
    assert tree is not None and render(tree) == canonical
    assert parse(canonical, now=1e9) == tree


@pytest.mark.parametrize(
    ("text", "column", "says"),
    [
        ("lr>0.05", 1, "write hp:lr for a hyper-parameter"),
        ("m:val/acc>abc", 11, "m:val/acc is a number, and 'abc' is not one"),  # the issue: it said nothing
        ("m:val/acc>0.9 and hp:lr<", 25, "expected a value after hp:lr <"),
        ("hp:a=1 hp:b=2", 8, "two conditions need 'and' or 'or' between them"),
        ("(hp:a=1 or hp:b=2", 1, "this '(' is never closed"),
        ("hp:a=1)", 7, "this ')' closes nothing"),
        ("status = complet", 10, "not one of Running, Crashed, Complete"),
        ("label < 3", 7, "label takes =, !=, ~, in or not in"),
        ("start = 2026-01-01", 7, "for one day write start >= 2026-11-01 and start < 2026-11-02"),
        ("start > 2026-13-01", 9, "is not a time"),
        ("start > 7y ago", 9, "is not a time"),
        ("hp:x in 3", 9, "in takes a list in parentheses"),
        ("hp:x in (1 2)", 12, "expected ',' or ')' in the list"),
        ("m:acc > 1", 1, "name it TYPE/NAME"),
        ("m:val/acc ~ 1", 11, "'~' (contains) is for text"),
        ('m:"val/acc".mean > 1', 12, "read as .last, .best, .min or .max"),
        ("hp: = 3", 1, "hp: needs a name after the colon"),
        ('hp:a = "x', 8, 'this " opens a string that is never closed'),
        ("hp:a ! 3", 6, "'!' must be followed by '='"),
        ("hp:a..b = 1", 1, "cannot be looked up"),
        ("and hp:a = 1", 1, "expected a condition"),
        ("hp:a = 1 or", 12, "a condition is missing"),
        ("()", 1, "nothing between these parentheses"),
        ("hp:a", 5, "expected an operator"),
        ("x:y = 1", 1, "a key starts with hp: (hyper-parameter) or m: (metric, TYPE/NAME)"),
        ("(" * 51 + "hp:a=1" + ")" * 51, 51, "more than 50 parentheses or nots inside each other"),
        ("not " * 51 + "hp:a=1", 201, "more than 50 parentheses or nots inside each other"),
        (" or ".join(["hp:a=1"] * 201), 2001, "more than 200 conditions in one filter"),
    ],
)  # fmt: skip
def test_every_unreadable_filter_names_the_column_of_its_error(text: str, column: int, says: str) -> None:
    with pytest.raises(FilterError) as caught:
        parse(text)
    e = caught.value
    where = "at the end" if column > len(text) else f"at column {column}"
    assert e.column == column and str(e).startswith(f"filter not understood {where}: "), str(e)
    assert says in str(e) and e.pointer() == f"{text}\n{' ' * (column - 1)}^"
    assert isinstance(e, TrackingError)


def test_a_filter_longer_than_ten_thousand_characters_is_refused_before_it_is_read() -> None:
    with pytest.raises(FilterError, match="a filter is at most 10,000 characters, this one 10,001"):
        parse("x" * 10_001)
    assert parse(" or ".join(["hp:a=1"] * 200)) is not None and parse("not " * 50 + "hp:a=1") is not None


def test_values_compare_with_their_own_kind_and_a_missing_value_matches_nothing_but_not() -> None:
    r = run(hparams={"lr": 0.001, "opt": "adam", "seed": "42", "flag": True, "tag": None, "betas": [0.9, 0.99],
                     "cfg": {"beta": 0.9, "name": "Adam W"}, "a.b": 1, "a": {"c": 2}, "empty": {}})  # fmt: skip
    holds = {
        "hp:lr < 0.01": True, "hp:lr = 1e-3": True, "hp:lr != 0.1": True, "hp:lr > abc": False,
        "hp:opt = adam": True, "hp:opt = Adam": False, "hp:opt ~ AD": True, "hp:opt < b": True, 'hp:opt = "adam"': True,
        "hp:seed = 42": False, 'hp:seed = "42"': True, "hp:seed != 42": True, "hp:flag = true": True,
        "hp:flag = 1": False, "hp:tag = null": True, "hp:tag != null": False, "hp:betas = 0.9": False,
        "hp:betas != 0.9": True, "hp:cfg.beta >= 0.9": True, "hp:cfg.name ~ w": True, 'hp:cfg.name = "Adam W"': True,
        "hp:a.b = 1": True, "hp:a.c = 2": True, "hp:cfg = 1": False, "hp:cfg != 1": False, "hp:empty != 1": False,
        "hp:nope != 1": False, "not hp:nope = 1": True, "hp:nope not in (1)": False, "hp:opt in (sgd, adam)": True,
        "hp:opt not in (sgd, adam)": False, "hp:lr ~ 0.0": False,
    }  # fmt: skip
    found = {text: matches(parse(text), r) for text in holds}
    assert found == holds


def test_a_metric_is_read_by_last_best_min_or_max_and_nan_matches_nothing() -> None:
    acc = run(val_acc=(0.7, 0.5, 0.9), train_loss=(math.nan, 0.1, math.inf), train_nans=(math.nan, None, None))
    holds = {
        "m:val/acc > 0.8": False, "m:val/acc.best > 0.8": True, "m:val/acc.min = 0.5": True,
        "m:val/acc.max in (0.9, 1)": True, "m:train/loss < 10": False, "m:train/loss != 1": False,
        "not m:train/loss = 1": True, "m:train/loss.best = 0.1": True, "m:train/loss.max > 1e300": True,
        "m:train/nans.min < 1": False, "m:val/nope > 0": False,
    }  # fmt: skip
    assert {text: matches(parse(text), acc) for text in holds} == holds
    recorded = RunFacts(
        "r", "Complete", (), None, {}, {"val/acc": query.metric_facts("val/acc", 0.7, 0.5, 0.9, {"val/acc": "min"})}
    )
    assert matches(parse("m:val/acc.best = 0.5"), recorded)  # a recorded mode comes first


def test_status_labels_names_and_start_times() -> None:
    r = run(name="ResNet-50 b", status="Crashed", labels=("base", "Long-Run"), start="2026-11-01T01:30:00+02:00")
    holds = {
        "status = crashed": True, "status != Running": True, "status in (Failed, Crashed)": True,
        "label = base": True, "label != base": False, "label = Base": False, "label ~ LONG": True,
        "label not in (x, y)": True, "name ~ resnet": True, "name = 'ResNet-50 b'": True, "name < S": True,
        "start < 2026-11-01": True, "start >= 2026-10-31T23:30:00Z": True, "start > 2026-10-31T23:30:00Z": False,
        "start >= '2026-10-31 23:30'": True, "start > 1d ago": False,
    }  # fmt: skip
    assert {text: matches(parse(text), r) for text in holds} == holds
    assert not matches(parse("start < 2100-01-01"), run(start="yesterday"))  # an unreadable start: no time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1970-01-01", 0), ("1970-01-02T01:00:00.9+01:00", 86400), ("2000-03-01T00:00Z", 951868800),
     ("2026-02-30", 1772409600), ("2026-11-26 14:08:32", 1795702112), ("1969-12-31T23:59:59", -1),
     ("2026-01-01T10:00:00-14:59", 1767315540), ("2026-01-01T10:00:00+15:00", None),
     ("2026-11-26T14:08:32+0200", None), ("2026-13-01", None), ("2026-01-01T24:00", None), ("2026-01-01+02:00", None),
     ("٢٠٢٦-01-01", None), ("now", None), (None, None)],
)  # fmt: skip
def test_start_seconds_reads_iso_times_as_sqlite_does(text: Any, seconds: int | None) -> None:
    """The same numbers as SQLite's ``unixepoch()`` where both read the time (2026-02-30 is 2026-03-02)."""
    assert query.start_seconds(text) == seconds


def test_key_paths_read_the_flattened_key_most_nested_first() -> None:
    assert query.key_paths("a.b.c") == [("a", "b", "c"), ("a", "b.c"), ("a.b", "c"), ("a.b.c",)]
    assert len(query.key_paths("a.b.c.d.e")) == 16 and query.key_paths("a.b.c.d.e.f") == [
        tuple("abcdef"),
        ("a.b.c.d.e.f",),
    ]
    assert query.lookup({"a.b": 1, "a": {"b": 2}}, "a.b") == (True, 2) and query.lookup({"a": {"b": {}}}, "a.b") == (
        False,
        None,
    )


def test_why_nothing_matched_blames_only_what_must_hold_and_counts_the_rest() -> None:
    counts = {"hp:opt = adam": Evidence(30, 20, ['"adam"', '"sgd"']), "hp:lr > 0.01": Evidence(30, 25)}
    why = query.explain_empty(parse("hp:opt = adam and hp:lr > 0.01"), lambda c: counts[str(c)])
    assert why == ["each condition alone matches runs here (hp:opt = adam: 20; hp:lr > 0.01: 25), "
                   "but no run matches the whole filter"]  # fmt: skip
    why = query.explain_empty(
        parse("hp:opt = Adam and not hp:lrr = 1"), lambda c: Evidence(0 if "lrr" in str(c) else 3, 0, ['"adam"'])
    )
    assert why == ['no run matches hp:opt = Adam: opt here is one of "adam"']  # nothing blamed on the negated hp:lrr
    why = query.explain_empty(parse("m:val/acc > 2"), lambda c: Evidence(4, 0, span=(0.25, 0.75)))
    assert why == ["no run matches m:val/acc > 2: m:val/acc here runs from 0.25 to 0.75"]


def _trees() -> st.SearchStrategy[str]:
    atoms = st.sampled_from(["hp:lr < 0.01", "hp:opt = adam", "hp:cfg.beta >= 0.9", "m:val/acc.best > 0.8",
                             "m:train/loss < 0.5", "status = Failed", "label = base", "name ~ b",
                             "hp:x != 1"])  # fmt: skip
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["and", "or", ";"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
            inner.map(lambda t: f"not ({t})"),
        ),
        max_leaves=6,
    )


RUNS = [
    run(f"r{i}", ("Complete", "Failed")[i % 2], ("base",) * (i % 3 == 0), None,
        {"lr": (0.1, 0.001, "auto")[i % 3], **({"opt": "adam"} if i % 4 else {}), "cfg": {"beta": 0.8 + i / 100}},
        val_acc=(i / 20, 0.0, 0.5 + i / 40), train_loss=(math.nan if i == 5 else 1 / (i + 1), 0, 1))
    for i in range(20)
]  # fmt: skip


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(a=_trees(), b=_trees())
def test_and_is_the_intersection_or_the_union_not_the_complement(a: str, b: str) -> None:
    def kept(text: str) -> set[str]:
        return {r.name for r in RUNS if matches(parse(text), r)}

    every = {r.name for r in RUNS}
    assert kept(f"({a}) and ({b})") == kept(a) & kept(b)
    assert kept(f"({a}) or ({b})") == kept(a) | kept(b)
    assert kept(f"not ({a})") == every - kept(a)
    assert parse(render(parse(a) or parse("hp:x=1"))) == (parse(a) or parse("hp:x=1"))  # type: ignore[arg-type]


def test_runs_ls_filter_keeps_the_matching_runs_and_says_why_when_none_does(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, (lr, opt) in enumerate([(0.1, "adam"), (0.001, "adam"), (0.0001, "sgd")]):
        r = track.create_run(name=f"sweep-{i}", hparams={"lr": lr, "optim": {"name": opt}}, labels=["sweep"])
        for step in range(3):
            r.log("val", {"acc": 0.5 + i * 0.2 + step * 0.01}, step=step)
        r.finish()
    assert ember("runs", "ls", "--filter", "m:val/acc > 0.8 and hp:lr < 0.01") == 0  # both conditions hold
    assert [line.split()[0].split("_")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["sweep-2"]
    assert ember("runs", "ls", "--filter", "hp:optim.name = adam", "--filter", "hp:lr > 0.01") == 0
    assert [line.split()[0].split("_")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["sweep-0"]
    assert ember("runs", "ls", "--filter", "hp:optim.name = adam and hp:lr < 0.0005") == 0
    out = capsys.readouterr().out
    assert (
        "no run in" in out
        and "each condition alone matches runs here (hp:optim.name = adam: 2; hp:lr < 0.0005: 1)" in out
    )
    assert ember("runs", "ls", "--filter", "hp:optim.name = Adam") == 0
    assert 'no run matches hp:optim.name = Adam: optim.name here is one of "adam", "sgd"' in capsys.readouterr().out
    with pytest.raises(
        TrackingError, match=r"(?s)--filter filter not understood at column 11: .*\n  m:val/acc>abc\n {12}\^"
    ):
        ember("runs", "ls", "--filter", "m:val/acc>abc")


def test_runs_ls_filter_says_which_runs_it_could_not_check(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = track.create_run(name="torn", hparams={"lr": 0.1})
    r.log("val", {"acc": 0.9}, step=0)
    r.log("val", {"acc": 0.95}, step=1)
    r.finish()
    path = r.path / "metrics" / "val.jsonl"  # type: ignore[operator]
    path.write_text(path.read_text().replace('"step":0', '"step":"x"', 1))  # a damaged line, not the last
    assert ember("runs", "ls", "--filter", "m:val/acc.max > 0.5 or hp:lr = 0.1") == 0
    captured = capsys.readouterr()
    assert (
        "torn_" in captured.out and f"not checked against the filter's metrics (damaged): {r.path.name}" in captured.err
    )  # type: ignore[union-attr]


def test_runs_ls_sorts_by_a_metrics_last_best_min_or_max_as_the_filter_reads_them(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33, item 8: ``ember runs ls`` had no --sort; a metric sorts by any of the values a filter reads."""
    curves = {"a": [0.2, 0.9, 0.5], "b": [0.6, 0.7], "c": [0.1, 0.3, 0.8], "d": []}  # d: no val/acc
    for name, values in curves.items():
        r = track.create_run(name=name, hparams={"opt": {"lr": len(values) * 0.1}})
        for step, v in enumerate(values):
            r.log("val", {"acc": v}, step=step)
        r.finish()

    def order(*argv: str) -> list[str]:
        assert ember("runs", "ls", *argv) == 0
        return [line.split()[0].split("_")[0] for line in capsys.readouterr().out.splitlines()[1:]]

    assert order("--sort=-m:val/acc.best") == ["a", "c", "b", "d"]  # 0.9 0.8 0.7, the missing last
    assert order("--sort", "m:val/acc") == ["a", "b", "c", "d"]  # the last values: 0.5 0.7 0.8
    assert order("--sort=-m:val/acc.last") == ["c", "b", "a", "d"]
    assert order("--sort", "m:val/acc.min") == ["c", "a", "b", "d"]  # 0.1 0.2 0.6
    assert order("--sort=-hp:opt.lr", "--filter", "m:val/acc.max > 0.75") == ["a", "c"]  # both lr 0.3: start order
    assert order("--sort=-name") == ["d", "c", "b", "a"]
    with pytest.raises(TrackingError, match=r"--sort 'best': use one of name, status, start"):
        ember("runs", "ls", "--sort", "best")
