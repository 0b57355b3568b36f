"""The Engine, Trainer and checkpoints on a CUDA device (run with ``pytest -m cuda tests/cuda``).

These need a GPU, so ``make test`` (CI has none) deselects them by their ``cuda`` marker; on a
machine with CUDA, ``.venv/bin/python -m pytest -m cuda tests/cuda`` runs them. What they pin:
the Engine loop equals a hand loop on the GPU bit for bit, bf16 and fp16 autocast train there,
an overflowed fp16 step is skipped by the real CUDA scaler, a resumed run (dropout drawn from
the CUDA generator) equals an uninterrupted one bit for bit, an async save copies GPU tensors
through pinned memory intact, and a launch picks NCCL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember import checkpoint, launcher
from ember.errors import LaunchError
from ember.trainer import Trainer, hooks
from ember.trainer.hooks.memory import memory_usage
from tests.checkpoint import common
from tests.models import params_of, tiny_dataset, tiny_mlp

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _need_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("tests/cuda need a CUDA device; run them on a GPU machine with `pytest -m cuda tests/cuda`")


def _batches(n: int = 50, bs: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ds = tiny_dataset(n * bs)
    x, y = ds[:]
    return [(x[i * bs : (i + 1) * bs].cuda(), y[i * bs : (i + 1) * bs].cuda()) for i in range(n)]


def test_engine_loop_on_cuda_is_bit_identical_to_hand_loop() -> None:
    batches = _batches()
    hand = tiny_mlp().cuda()
    opt = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(hand(x), y).backward()
        opt.step()

    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       nn.CrossEntropyLoss())  # fmt: skip
    assert next(model.parameters()).device.type == "cuda"
    for x, y in batches:
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x), y))
        engine.step()
    assert all(torch.equal(a, b) for a, b in zip(params_of(hand), params_of(model), strict=True))


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_on_cuda_trains(amp: str) -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(),
                                       config={"amp": amp})  # fmt: skip
    batches = _batches(8)
    assert engine(batches[0][0]).dtype == (torch.bfloat16 if amp == "bf16" else torch.float16)
    losses = []
    for _ in range(8):
        for x, y in batches:
            engine.zero_grad()
            loss = engine.criterion(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_overflow_on_cuda_is_skipped_and_reported() -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                                       config={"amp": "fp16"})  # fmt: skip
    x, y = _batches(1)[0]
    scaler = engine.precision.scaler  # type: ignore[attr-defined]
    scale = scaler.get_scale()
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")
    before = params_of(model)
    assert engine.step() is False and engine.last_step_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))
    assert scaler.get_scale() == scale / 2

    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    assert engine.step() is True and not engine.last_step_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))


def test_resume_on_cuda_matches_the_uninterrupted_run(tmp_path: Path) -> None:
    """Dropout draws from the CUDA generator, so this also pins its checkpointed state."""
    full = common.run(tmp_path / "full", deterministic=True)
    assert next(full.engine.model.parameters()).device.type == "cuda"
    with pytest.raises(RuntimeError, match="crashed"):  # at batch 15, before update 8's save
        common.run(tmp_path / "cut", deterministic=True, extra=[common.Crash(15)])
    resumed = common.run(tmp_path / "cut", deterministic=True)
    recorder = resumed.get_hook("Recorder")
    assert recorder.resumed_at == 11  # type: ignore[attr-defined]  # update 6: epoch 2, batch 2
    assert all(torch.equal(a, b) for a, b in zip(common.params(full), common.params(resumed), strict=True))
    full_losses = full.get_hook("Recorder").losses  # type: ignore[attr-defined]
    after = recorder.losses  # type: ignore[attr-defined]
    assert len(after) == 27 - 11 and all(after[k] == full_losses[k] for k in after)


def test_async_save_copies_cuda_state_through_pinned_memory(tmp_path: Path) -> None:
    trainer = common.run(tmp_path / "a", deterministic=True, max_steps=4, async_save=True)
    path = checkpoint.latest(tmp_path / "a")
    assert path is not None
    saved = checkpoint.model_state(path)
    live = trainer.engine.state_dict()["model"]
    assert saved.keys() == live.keys()
    assert all(torch.equal(saved[k], live[k].cpu()) for k in saved)


def test_memory_hook_reports_cuda_memory() -> None:
    usage = memory_usage(torch.device("cuda", 0))
    assert usage["cuda_peak"] >= usage["cuda"] >= 0


def test_the_default_backend_is_nccl_and_one_gpu_per_process_is_enforced() -> None:
    assert launcher._pick_backend(None) == "nccl"
    gpus = torch.cuda.device_count()
    with pytest.raises(LaunchError, match=f"local rank {gpus} needs CUDA device {gpus}.*backend='gloo'"):
        ember.launch(rank=1, world_size=2, local_rank=gpus, verbose=False)


_DDP_ON_ONE_GPU = """
import torch, ember
from torch import nn
from tests.models import tiny_dataset, tiny_mlp
ember.launch_from_torch(backend="gloo", config={"gradient_accumulation": 2}, verbose=False)
model = tiny_mlp()
engine, loader, _, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                                        ember.get_dataloader(tiny_dataset(64), batch_size=8, shuffle=True))
for x, y in loader:
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    engine.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
both = [torch.empty_like(flat) for _ in range(2)]
torch.distributed.all_gather(both, flat)
print("DEVICE", flat.device, "UPDATES", engine.num_updates, "SAME", torch.equal(both[0], both[1]), flush=True)
"""


def test_two_processes_share_one_gpu_over_gloo(tmp_path: Path) -> None:
    """DDP with CUDA tensors over gloo: both ranks on cuda:0, accumulation 2, identical weights."""
    script = tmp_path / "ddp_job.py"
    script.write_text(_DDP_ON_ONE_GPU)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("DEVICE cuda:0 UPDATES 2 SAME True") == 2, done.stdout


def test_trainer_moves_cpu_batches_to_cuda() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, loader, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(),
                                            DataLoader(tiny_dataset(64), batch_size=16))  # fmt: skip
    trainer = Trainer(engine)
    trainer.fit(loader, epochs=2, hooks=[hooks.LossHook(), hooks.LogMemoryByEpochHook()])
    assert trainer.cur_step == 8
