"""What the run-page benchmarks share: the browser, the data's shape and their arguments.

``console_pages.py`` (ember's console) and ``mlflow_pages.py`` (MLflow's UI, run in a venv of its
own) time the same page on the same data, so both take these; this module imports nothing of
ember's or MLflow's.
"""

from __future__ import annotations

import argparse
import math

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
NAMES = ("loss", "acc", "lr")
"""The metrics of each phase (train, val) of both runs."""


def value(step: int, k: int) -> float:
    """Metric ``NAMES[k]`` at ``step``: a slow sine, the same in every store."""
    return math.sin(step / 5000 + k) + 1.5


def arguments(description: str) -> argparse.Namespace:
    """``--points`` (train points per metric of the long run) and ``--repeat`` (warm views timed)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--points", type=int, default=1_000_000, help="train points per metric of the long run")
    parser.add_argument("--repeat", type=int, default=9, help="warm page views to time (median)")
    return parser.parse_args()
