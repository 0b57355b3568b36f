"""pytorch-accelerated's ``run_config`` module: the settings of the current training run."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["TrainerRunConfig"]


@dataclass(frozen=True)
class TrainerRunConfig:
    """The numbers of the current run, as ``trainer.run_config``; built by ``train``/``evaluate``.

    Attributes:
        num_epochs: epochs in this training run.
        train_per_device_batch_size: batch size per process while training.
        train_dl_kwargs: the arguments the training dataloader was built with.
        eval_per_device_batch_size: batch size per process while evaluating.
        eval_dl_kwargs: the arguments the evaluation dataloader was built with.
        gradient_accumulation_steps: micro-batches per optimizer update.
        gradient_clip_value: the value gradients are clamped to, or None.
        train_total_batch_size: samples per optimizer update over all processes.
        eval_total_batch_size: samples per evaluation step over all processes.
        num_update_steps_per_epoch: optimizer updates per epoch, all processes together
            (pytorch-accelerated 0.1.61: local updates × processes).
        num_local_update_steps_per_epoch: optimizer updates per epoch on each process.
        max_num_train_steps: the optimizer updates this run makes at most.
        is_local_process_zero: whether this is the first process on its machine.
        is_world_process_zero: whether this is the first process of the job.
        is_distributed: whether the job has several processes.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        num_processes: the processes of the job.
    """

    num_epochs: int
    train_per_device_batch_size: int | None
    train_dl_kwargs: dict[str, Any] | None
    eval_per_device_batch_size: int | None
    eval_dl_kwargs: dict[str, Any] | None
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    train_total_batch_size: int | None
    eval_total_batch_size: int | None
    num_update_steps_per_epoch: int
    num_local_update_steps_per_epoch: int
    max_num_train_steps: int | None
    is_local_process_zero: bool
    is_world_process_zero: bool
    is_distributed: bool
    mixed_precision: str
    num_processes: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (the dataloader arguments copied, a custom ``sampler`` in
        them kept as it is: samplers holding a generator cannot be deep-copied)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("train_dl_kwargs", "eval_dl_kwargs"):
            if out[key] is not None:
                out[key] = dict(out[key])
        return out
