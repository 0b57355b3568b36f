"""Bare model weights: gathered from any parallel layout, written as ``.pt`` or ``.safetensors``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ember.checkpoint.io import atomic_path, crc32_kept
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from ember.engine import Engine


def has_safetensors() -> bool:
    """True when the ``safetensors`` package can be imported."""
    return importlib.util.find_spec("safetensors") is not None


def full_model_state(engine: Engine) -> dict[str, Any]:
    """The model's unsharded weights (unwrapped keys); a collective under FSDP2/tensor parallelism,
    expert parallelism (every rank's experts, on rank 0; ``{}`` elsewhere) and sharded master weights."""
    from ember.parallel.moe_policy import ExpertParallelPolicy
    from ember.parallel.policy import ShardedPolicy

    if isinstance(engine.parallel, ShardedPolicy):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(engine.model, options=options)
    with engine.precision.full_precision():  # master weights: the fp32 masters are the weights
        if isinstance(engine.parallel, ExpertParallelPolicy):
            return engine.parallel.state_dicts(engine.model, engine.optimizer)[0]
        return engine.model.state_dict()


def write_weights(weights: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``weights`` atomically: safetensors for a ``.safetensors`` path, else ``torch.save``.

    The folder must exist (nothing is created here).

    Raises:
        CheckpointError: ``.safetensors`` without the package installed, weights it cannot hold,
            or a write the disk refuses.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        if not has_safetensors():
            raise CheckpointError(
                f"cannot write {str(path)!r}: the safetensors package is not installed "
                "(pip install safetensors), or choose a .pt file"
            )
        from safetensors.torch import save_file as save_safetensors

        tensors = {
            k: v.detach().to("cpu", copy=True).contiguous() for k, v in weights.items() if isinstance(v, torch.Tensor)
        }
        others = sorted(set(weights) - set(tensors))
        if others:
            raise CheckpointError(f"cannot write {str(path)!r}: safetensors holds tensors only, not {others}")
        with atomic_path(path) as tmp:
            save_safetensors(tensors, str(tmp))
    else:
        with atomic_path(path) as tmp, crc32_kept():  # zip-reading model scanners check CRCs
            torch.save({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}, tmp)
    return path
