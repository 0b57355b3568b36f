"""Durations, byte counts and times for people: one convention for the command line, the logs and the console.

Byte counts are binary and say so: 1 KiB = 1024 B, shown as ``B``, ``KiB``, ``MiB``, ``GiB``,
``TiB`` (the IEC names, so that no size is labelled MB while counted in 1024s; ``1.5 GiB`` is
1.5 × 2**30 bytes). Durations: ``4.2s`` under a minute, then ``4m05s``, ``1h02m03s``, and from a
day on ``2d03h04m`` (the web console shows two units, spaced: ``1h 02m``). Times (ISO 8601) keep
their time zone: ``2026-01-02 10:00:00 UTC+02:00``, so that no page shows a bare clock time that
a reader in another zone misreads. What is unknown (None) is ``-``.

A low-level utility: it imports nothing of ember's.
"""

from __future__ import annotations

from datetime import datetime

__all__ = ["format_bytes", "format_duration", "format_time"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(size: float | None) -> str:
    """A byte count in binary units: ``512 B``, ``1.5 KiB``, ``20.0 MiB``; ``-`` when None.

    Example:
        >>> format_bytes(3 * 2**20 // 2)
        '1.5 MiB'
    """
    if size is None:
        return "-"
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float | None, parts: int = 3, sep: str = "") -> str:
    """Seconds as ``4.2s``, ``4m05s``, ``1h02m03s`` or ``2d03h04m``; ``-`` when None (a negative time is 0).

    From a minute on: the ``parts`` units from the largest that is not zero (days, hours, minutes,
    seconds), the later ones two digits wide, joined by ``sep``.

    Example:
        >>> format_duration(3723)
        '1h02m03s'
        >>> format_duration(3723, parts=2, sep=" ")  # the web console's
        '1h 02m'
    """
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (value, _) in enumerate(units) if value)
    shown = units[first : first + parts]
    return sep.join(f"{value}{unit}" if i == 0 else f"{value:02d}{unit}" for i, (value, unit) in enumerate(shown))


def format_time(value: str | None) -> str:
    """An ISO 8601 time as ``YYYY-MM-DD HH:MM:SS`` and its zone; ``-`` when None or empty.

    The zone is ``UTC``, or its offset from UTC (``UTC+02:00``), or ``(no time zone recorded)``
    for a time written without one. Text that is not an ISO time is returned as it is.

    Example:
        >>> format_time("2026-01-02T10:00:00+02:00")
        '2026-01-02 10:00:00 UTC+02:00'
        >>> format_time("2026-01-02T08:00:00+00:00")
        '2026-01-02 08:00:00 UTC'
    """
    if not value:
        return "-"
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return value
    offset = when.strftime("%z")  # +0200, or empty without a zone
    if not offset:
        zone = "(no time zone recorded)"
    elif offset in ("+0000", "-0000"):
        zone = "UTC"
    else:
        zone = f"UTC{offset[:3]}:{offset[3:5]}" + (f":{offset[5:7]}" if offset[5:7] else "")
    return when.strftime("%Y-%m-%d %H:%M:%S ") + zone
