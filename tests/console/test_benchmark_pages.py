"""``benchmarks/console_pages.py`` (issue 19) runs at a tiny size: a server, Chromium, every chart drawn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.console.conftest import CHROMIUM, _missing


def test_the_console_pages_benchmark_runs_at_a_tiny_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        _missing("playwright is not installed")  # a failure under CI, as the browser tests
    if not Path(CHROMIUM).is_file():
        _missing(f"{CHROMIUM} is missing")
    from benchmarks import console_pages

    monkeypatch.setattr(sys, "argv", ["console_pages", "--points", "3000", "--repeat", "1"])
    assert console_pages.main() == 0
    out = capsys.readouterr().out
    assert "run page, 3 x 3,000 points: warm median" in out and "run page, 3 x 30 points" in out
    assert "2 series requests" in out  # the preloaded series are the ones run.js uses
