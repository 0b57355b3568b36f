"""The peers' own example programs (tests/seeds/programs), imports rewritten, run on ember.

pytorch-accelerated's ``examples/core`` and ColossalAI-Examples' ``features/gradient_accumulation``
and ``features/amp`` (its engine loop in fp32, its Trainer with torch AMP): each on one process,
then all in one 2-process torchrun. ``PT_ACC_LIMIT_BATCHES`` (pytorch-accelerated's own switch)
keeps every epoch to a few batches; the Colossal-AI programs read a small CIFAR-10 stand-in from
``$DATA`` (a ``SIZE`` file there), as they would read a downloaded one.

ColossalAI-Examples' ``features/gradient_clipping`` does not run: its config sets
``gradient_clipping = 2.0``, a key Colossal-AI ignores (its key is ``clip_grad_norm``: the example
never clips), which ember's config check refuses with a did-you-mean (see
``test_the_gradient_clipping_example_is_stopped_at_its_misspelt_key``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ember.errors import ConfigError
from tests.dist import free_port, torchrun
from tests.seeds.scripts import run_peer_programs
from tests.seeds.scripts.run_peer_programs import run

RUNNER = run_peer_programs.__file__

PTA = ["train_mnist", "custom_callback_event", "train_with_metrics_in_callback", "train_with_metrics_in_loop"]
PTA_PROGRAMS = [f"pytorch_accelerated/{name}.py" for name in PTA]
CAI_PROGRAMS = ["colossalai/gradient_accumulation/train.py", "colossalai/amp/train.py --config config/config_fp32.py",
                "colossalai/amp/train.py --config config/config_AMP_torch.py --use_trainer"]  # fmt: skip


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


def _check(name: str, lines: list[str], world: int = 1) -> None:
    if name.startswith("colossalai/gradient_accumulation"):
        values = [float(line.rsplit(": ", 1)[1]) for line in lines if line.startswith("iteration ")]
        # Colossal-AI's promise, on ember's Engine: the parameter moves only at the 4th (last) micro-batch
        assert len(values) == 4 and values[0] == values[1] == values[2] != values[3], lines
        assert "The parameter is only updated in the last iteration" in lines
        return
    if name.startswith("colossalai/amp"):
        if "--use_trainer" in name:  # LogMetricByEpochHook's and LogTimingByEpochHook's lines
            assert sum(line.startswith("epoch ") and "train/loss" in line for line in lines) == 2, lines
            assert sum("timing" in line for line in lines) == 2, lines
        else:
            assert sum(line.startswith("epoch: ") and "avg step time" in line for line in lines) == 2, lines
        return
    metrics = _metrics(lines)
    epochs = 8 if "custom_callback_event" in name else 2
    assert len(metrics["train_loss_epoch"]) == epochs and len(metrics["eval_loss_epoch"]) == epochs, metrics
    assert all(math.isfinite(v) for values in metrics.values() for v in values)
    if "in_callback" in name or "in_loop" in name:  # torchmetrics through the run history
        assert 0.0 <= metrics["accuracy"][-1] <= 1.0 and "recall" in metrics and "precision" in metrics
    if "train_mnist" in name or "in_loop" in name:  # then trainer.evaluate on the test split
        assert len(metrics["evaluation_loss"]) == 1


def _data(tmp_path: Path, size: int) -> str:
    (tmp_path / "SIZE").write_text(str(size))
    return str(tmp_path)


@pytest.mark.parametrize("program", PTA_PROGRAMS)
def test_the_pytorch_accelerated_program_runs_as_written(program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", "3")
    _check(program, run(program))


@pytest.mark.parametrize("program", CAI_PROGRAMS)
def test_the_colossalai_program_runs_as_written(program: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # launch_from_torch reads torchrun's variables: one process, as `torchrun --nproc_per_node 1` sets them
    size = 512 if "accumulation" in program else 4  # 4 batches of the config's 128; one small batch
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "DATA": _data(tmp_path, size)}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _check(program, run(program))


def test_the_gradient_clipping_example_is_stopped_at_its_misspelt_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"'gradient_clipping' is DeepSpeed's name.*did you mean 'clip_grad_norm'"):
        run("colossalai/gradient_clipping/train.py")


@pytest.mark.multiprocess
def test_the_programs_run_as_written_on_two_processes(tmp_path: Path) -> None:
    programs = [*PTA_PROGRAMS, *CAI_PROGRAMS]
    env = {"PT_ACC_LIMIT_BATCHES": "3", "DATA": _data(tmp_path, 1024)}  # 4 batches of 128 per rank
    job = torchrun(RUNNER, nproc=2, args=programs, env=env, timeout=400)
    first, second = job.results[0], job.results[1]
    for program in programs:
        _check(program, first[program], world=2)  # rank 0 prints and logs
    assert all(not second[p] for p in PTA_PROGRAMS)  # pytorch-accelerated prints on the main process only
