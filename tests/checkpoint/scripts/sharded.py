"""Sharded (torch.distributed.checkpoint) checkpoints under torchrun, see ``tests/checkpoint/test_sharded.py``.

``sharded.py save OUT`` (2 processes, FSDP2 zero stage 3): the uninterrupted run (``OUT/reference.*``);
a run stopped after update 9 with a CheckpointHook (every 4 updates and every epoch, keep_last=3)
into ``OUT/ckpt``; and a continuation of its update-8 checkpoint on the same 2 processes.

``sharded.py resume OUT`` (4 processes, FSDP2 zero stage 3): continue ``OUT/ckpt``'s update-8
checkpoint (mid-epoch) to the end, saving the final state (4 ranks' shards) into ``OUT/four`` and
its full weights to ``OUT/four-final.pt``; then continue the same checkpoint with a per-Engine
2 × 2 FSDP × tensor parallel layout (2 data-parallel replicas, not the launched 4), into ``OUT/2x2``
and ``OUT/2x2-final.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tests.checkpoint.sharded_job import FSDP_TP, ZERO3, fit, load_reference, loss_diff, max_diff, save_reference
from tests.dist import report

import ember
from ember.trainer import hooks

torch.set_num_threads(1)
RESUME_FROM = "ckpt-e0001-s000000008.ckpt"  # 2 updates into epoch 1


def save(out: Path) -> None:
    rank = ember.distributed.rank()
    _, ref_weights, ref_losses = fit(ZERO3)
    if rank == 0:
        save_reference(out, ref_weights, ref_losses)  # type: ignore[arg-type]
    ckpt = hooks.CheckpointHook(out / "ckpt", every_n_steps=4, every_n_epochs=1, keep_last=3)
    stopped, _, _ = fit(ZERO3, ckpt, max_steps=9)
    ember.distributed.barrier()  # rank 0 wrote the reference
    again = hooks.CheckpointHook(out / "again", every_n_steps=None, every_n_epochs=None, save_last=False)
    _, weights, losses = fit(ZERO3, again, resume=out / "ckpt" / RESUME_FROM)
    result = {"policy": stopped.engine.parallel.name, "last_path": str(ckpt.last_path), "loss_diff": 0.0}
    ref_weights, ref_losses = load_reference(out)
    result["loss_diff"] = loss_diff(losses, ref_losses)
    result["resumed_steps"] = sorted(losses)
    if rank == 0:
        result["param_diff"] = max_diff(weights, ref_weights)  # type: ignore[arg-type]
    report(result)


def resume(out: Path) -> None:
    ckpt = hooks.CheckpointHook(out / "four", every_n_steps=None, every_n_epochs=None, save_last=True)
    trainer, weights, losses = fit(ZERO3, ckpt, resume=out / "ckpt" / RESUME_FROM)
    ref_weights, ref_losses = load_reference(out)
    result = {"policy": trainer.engine.parallel.name, "loss_diff": loss_diff(losses, ref_losses)}
    result["resumed_steps"] = sorted(losses)
    result["counters"] = [trainer.cur_epoch, trainer.cur_step]
    if weights is not None:
        result["param_diff"] = max_diff(weights, ref_weights)
        torch.save(weights, out / "four-final.pt")
    two_d = hooks.CheckpointHook(out / "2x2", every_n_steps=None, every_n_epochs=None, save_last=True)
    trainer, weights, losses = fit(FSDP_TP, two_d, resume=out / "ckpt" / RESUME_FROM)
    result.update({"2x2.policy": trainer.engine.parallel.name, "2x2.loss_diff": loss_diff(losses, ref_losses)})
    result["2x2.resumed_steps"] = sorted(losses)
    if weights is not None:
        result["2x2.param_diff"] = max_diff(weights, ref_weights)
        torch.save(weights, out / "2x2-final.pt")
    report(result)


if __name__ == "__main__":
    mode, target = sys.argv[1], Path(sys.argv[2])
    ember.launch_from_torch(config={"seed": 0, **ZERO3}, verbose=False)
    save(target) if mode == "save" else resume(target)
