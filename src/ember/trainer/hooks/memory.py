"""Log the process's memory once per epoch: resident set size, and CUDA memory when used."""

from __future__ import annotations

import os
import resource
import sys

import torch

from ember._format import format_bytes
from ember.trainer.hooks._epoch_log import EpochLogHook

__all__ = ["LogMemoryByEpochHook", "memory_usage"]

_MiB = 1024 * 1024


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # not Linux: only the peak is known


def memory_usage(device: torch.device | None = None) -> dict[str, float]:
    """This process's memory in MiB (2**20 bytes): ``rss``, ``rss_peak``, and ``cuda``/``cuda_peak`` on CUDA.

    The numbers go into tracking as metrics of these names (``TrackingHook``), in MiB.

    Example:
        >>> memory_usage(torch.device("cuda", 0))
        {'rss': 1834.2, 'rss_peak': 1901.0, 'cuda': 2210.5, 'cuda_peak': 5120.0}
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024
    out: dict[str, float] = {"rss_peak": peak_bytes / _MiB}
    rss = _rss_bytes()
    if rss is not None:
        out["rss"] = rss / _MiB
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        out["cuda"] = torch.cuda.memory_allocated(device) / _MiB
        out["cuda_peak"] = torch.cuda.max_memory_allocated(device) / _MiB
    return out


class LogMemoryByEpochHook(EpochLogHook):
    """Logs process memory (RSS) and, on CUDA, allocated and peak device memory each epoch.

    The CUDA peak is reset at each epoch's start, so it is the epoch's own peak.

    Args:
        logger: an ember ``DistributedLogger`` (default: the Trainer's).
        ranks: ranks that log (default rank 0; None: every rank, each its own numbers).
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Attributes:
        last: the numbers logged last (:func:`memory_usage`: MiB).

    Example:
        >>> hooks.LogMemoryByEpochHook()
        # epoch 1 memory | rss 512.0 MiB (peak 540.0 MiB)
    """

    def before_train_epoch(self) -> None:
        """Reset the CUDA peak."""
        device = self.trainer.engine.device
        if device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats(device)

    def after_train_epoch(self) -> None:
        """Log the epoch's memory."""
        self.last = usage = memory_usage(self.trainer.engine.device)
        parts = [f"epoch {self.trainer.cur_epoch + 1} memory"]
        rss = f"rss {_size(usage['rss'])} " if "rss" in usage else "rss "
        parts.append(f"{rss}(peak {_size(usage['rss_peak'])})")
        if "cuda" in usage:
            parts.append(f"cuda {_size(usage['cuda'])} (epoch peak {_size(usage['cuda_peak'])})")
        self._log_line(parts)


def _size(mib: float) -> str:
    """``mib`` (a :func:`memory_usage` number) in ember's binary units: ``512.0 MiB``, ``1.8 GiB``."""
    return format_bytes(mib * _MiB)
