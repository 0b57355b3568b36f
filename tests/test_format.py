"""ember._format: one convention for durations, byte counts and times, and what shows them uses it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ember._format import format_bytes, format_duration, format_time


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (20 * 2**20, "20.0 MiB"),
     (3 * 2**29, "1.5 GiB"), (2**40, "1.0 TiB"), (2**50, "1024.0 TiB")],
)  # fmt: skip
def test_byte_counts_are_binary_and_labelled_so(size: int | None, text: str) -> None:
    assert format_bytes(size) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-1.0, "0.0s"), (4.25, "4.2s"), (59.9, "59.9s"), (60, "1m00s"), (245, "4m05s"),
     (3723, "1h02m03s"), (86400 + 3 * 3600 + 4 * 60 + 5, "1d03h04m"), (math.pi * 1e6, "36d08h39m")],
)  # fmt: skip
def test_durations_read_from_seconds_to_days(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_checkpoint_inspect_prints_sizes_in_binary_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ember.checkpoint import cli
    from ember.cli import main

    path = tmp_path / "ckpt-e0000-s000000001.ckpt"
    path.write_bytes(b"x" * 3 * 2**19)
    meta = {"epoch": 0, "epoch_iter": 0, "step": 1, "world_size": 1, "sizes": {"model": 1536}}
    monkeypatch.setattr(cli, "_read_meta", lambda path: meta)  # the sizes, not the checkpoint's format
    assert main(["checkpoint", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(1.5 MiB)" in out and "1.5 KiB" in out, out


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (4.25, "4.2s"), (245, "4m 05s"), (5400, "1h 30m"), (86400 + 3 * 3600 + 4 * 60 + 5, "1d 03h")],
)  # fmt: skip
def test_the_console_shows_two_units_of_the_same_durations(seconds: float | None, text: str) -> None:
    pytest.importorskip("fastapi")
    from ember.server.console.views import fmt_duration

    assert fmt_duration(seconds) == text


@pytest.mark.parametrize(("size", "text"), [(None, "—"), (1536, "1.5 KiB"), (3 * 2**29, "1.5 GiB"), (2**41, "2.0 TiB")])
def test_the_console_shows_the_same_byte_counts(size: int | None, text: str) -> None:
    pytest.importorskip("fastapi")
    from ember.server.console.views import fmt_size

    assert fmt_size(size) == text


@pytest.mark.parametrize(
    ("iso", "text"),
    [(None, "-"), ("", "-"), ("2026-01-02T10:00:00+02:00", "2026-01-02 10:00:00 UTC+02:00"),
     ("2026-01-02T08:00:00.123+00:00", "2026-01-02 08:00:00 UTC"), ("2026-01-02T08:00:00Z", "2026-01-02 08:00:00 UTC"),
     ("2026-01-02T03:00:00-05:30", "2026-01-02 03:00:00 UTC-05:30"),
     ("2026-01-02T08:00:00", "2026-01-02 08:00:00 (no time zone recorded)"), ("yesterday", "yesterday")],
)  # fmt: skip
def test_times_keep_their_zone(iso: str | None, text: str) -> None:
    assert format_time(iso) == text


def test_the_console_shows_every_time_with_its_zone_in_a_time_element() -> None:
    """Issue 19: the runs table's Start and the artifact page's Created dropped the zone the run page shows."""
    pytest.importorskip("fastapi")
    from ember.server.console.views import fmt_time

    shown = fmt_time("2026-01-02T10:00:00+02:00")
    assert shown == '<time datetime="2026-01-02T10:00:00+02:00">2026-01-02 10:00:00 UTC+02:00</time>'
    assert fmt_time(None) == "—" and fmt_time("<b>") == '<time datetime="&lt;b&gt;">&lt;b&gt;</time>'  # escaped


def test_ember_runs_writes_times_in_the_machines_zone_with_the_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ember runs ls/show` (track/_report.fmt_time) names the zone of the local time it prints."""
    import time

    from ember.track._report import fmt_time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        assert fmt_time("2026-11-26T13:08:32+00:00") == "2026-11-26 14:08:32 UTC+01:00"
        assert fmt_time(None) == "-"
    finally:
        monkeypatch.undo()
        time.tzset()
