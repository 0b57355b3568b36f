"""The cheapest of the ``examples/gpt_*.py`` parallel examples runs end to end under torchrun.

``gpt_pipeline.py`` (2 processes, 1F1B) is run for one epoch; the others share its model,
data and Trainer code (``examples/gpt.py``) and were checked by hand (docs/parallel.md).
"""

from __future__ import annotations

import re

import pytest

from tests.dist import ROOT, torchrun

pytestmark = pytest.mark.multiprocess


def test_gpt_pipeline_example_trains_and_its_loss_falls() -> None:
    run = torchrun(ROOT / "examples" / "gpt_pipeline.py", nproc=2, args=["--epochs", "1"], timeout=240)
    output = run.stdout + run.stderr
    assert "GPT, pipeline parallel 2: pipeline ×2 (1f1b, stage 0: embed…blocks.1)" in output
    found = re.search(r"train/loss ([\d.]+) -> ([\d.]+); test/loss ([\d.]+)", output)
    assert found is not None, output
    assert float(found.group(3)) < 1.0  # from ~3.5 (uniform over 32 tokens) after one epoch
