"""The peers' own example programs (tests/seeds/programs), imports rewritten, run on ember.

pytorch-accelerated's ``examples/core``: each program's ``main()`` on one process, then all four
in one 2-process torchrun; ``PT_ACC_LIMIT_BATCHES`` (pytorch-accelerated's own switch, through
``utils.LimitBatches``' environment variable) keeps every epoch to a few batches.
"""

from __future__ import annotations

import math

import pytest

from tests.dist import torchrun
from tests.seeds.scripts import run_peer_programs
from tests.seeds.scripts.run_peer_programs import run

RUNNER = run_peer_programs.__file__

PTA = ["train_mnist", "custom_callback_event", "train_with_metrics_in_callback", "train_with_metrics_in_loop"]
PROGRAMS = [f"pytorch_accelerated/{name}" for name in PTA]


def _metrics(lines: list[str]) -> dict[str, list[float]]:
    """``name: value`` lines (LogMetricsCallback's) by name."""
    found: dict[str, list[float]] = {}
    for line in lines:
        name, _, value = line.rpartition(": ")
        try:
            found.setdefault(name.strip(), []).append(float(value))
        except ValueError:
            continue
    return found


def _check(name: str, lines: list[str]) -> None:
    metrics = _metrics(lines)
    epochs = {"custom_callback_event": 8}.get(name.split("/")[-1], 2)
    assert len(metrics["train_loss_epoch"]) == epochs and len(metrics["eval_loss_epoch"]) == epochs, metrics
    assert all(math.isfinite(v) for values in metrics.values() for v in values)
    if name.endswith("in_callback") or name.endswith("in_loop"):  # torchmetrics through the run history
        assert 0.0 <= metrics["accuracy"][-1] <= 1.0 and "recall" in metrics and "precision" in metrics
    if name.endswith("train_mnist") or name.endswith("in_loop"):  # then trainer.evaluate on the test split
        assert len(metrics["evaluation_loss"]) == 1


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_program_runs_as_written(program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", "3")
    _check(program, run(program))


@pytest.mark.multiprocess
def test_the_programs_run_as_written_on_two_processes() -> None:
    job = torchrun(RUNNER, nproc=2, args=PROGRAMS, env={"PT_ACC_LIMIT_BATCHES": "3"}, timeout=300)
    first = job.results[0]
    for program in PROGRAMS:
        _check(program, first[program])  # rank 0 prints; the other rank prints nothing
    assert all(not lines for program, lines in job.results[1].items() if program != "rank")
