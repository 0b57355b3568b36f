"""Parallel wrappers built on torch.distributed (data parallel now; ZeRO/FSDP/TP/PP later)."""

from ember.parallel.ddp import wrap_data_parallel

__all__ = ["wrap_data_parallel"]
