"""Data parallelism with :class:`torch.nn.parallel.DistributedDataParallel`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wrap_data_parallel(
    module: nn.Module, device: torch.device, options: Mapping[str, Any], process_group: Any = None
) -> DistributedDataParallel:
    """Wrap ``module`` (already on ``device``, compiled if wanted) in DDP.

    Args:
        module: the module to replicate; compile it *before* wrapping (the other order runs eager).
        device: this rank's device.
        options: DDP keyword arguments from the config's ``ddp`` section.
        process_group: the data-parallel group (the mesh's ``"data"`` dim); None for the world.
    """
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, process_group=process_group, **dict(options))
