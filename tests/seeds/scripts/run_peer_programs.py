"""Run the vendored example programs one after another in this process (or this torchrun job).

``python run_peer_programs.py PROGRAM...`` runs each program's ``main()`` as its ``__main__`` does
(``runpy``), and reports, per program, the lines it printed that carry metrics.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

from tests.dist import report

PROGRAMS = Path(__file__).parents[1] / "programs"


def run(name: str) -> list[str]:
    """Run ``programs/<name>.py`` as ``__main__``; the lines it printed with a ``:`` (metric lines)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(PROGRAMS / f"{name}.py"), run_name="__main__")
    return [line for line in out.getvalue().splitlines() if ": " in line]


if __name__ == "__main__":
    report({name: run(name) for name in sys.argv[1:]})
