"""ember: train PyTorch models with an Engine or a hook-driven Trainer.

Public names::

    ember.launch / launch_from_torch / launch_from_slurm / launch_from_openmpi
    ember.context            rank, local_rank, world_size, device, is_main_process (after launch)
    ember.config             the launched config, attribute access (after launch)
    ember.initialize         -> (engine, train_dl, test_dl, lr_scheduler)
    ember.get_dataloader     a resumable, distributed-aware DataLoader
    ember.get_dist_logger    logger.info("msg", ranks=[0])
    ember.Trainer, ember.hooks (from ember.trainer), ember.track (experiment tracking)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ember import context, errors
from ember.config import Config, load_config
from ember.data import get_dataloader
from ember.engine import Engine
from ember.initialize import initialize
from ember.launch import launch, launch_from_openmpi, launch_from_slurm, launch_from_torch, seed_everything
from ember.logging import get_dist_logger

if TYPE_CHECKING:
    from ember import track, trainer

__version__ = "0.1.0"

__all__ = [
    "Config",
    "Engine",
    "__version__",
    "context",
    "errors",
    "get_dataloader",
    "get_dist_logger",
    "initialize",
    "launch",
    "launch_from_openmpi",
    "launch_from_slurm",
    "launch_from_torch",
    "load_config",
    "seed_everything",
    "track",
    "trainer",
]


def __getattr__(name: str) -> Any:
    # Submodules that pull more imports load on first use, keeping `import ember` quick.
    if name in ("track", "trainer", "checkpoint"):
        import importlib

        return importlib.import_module(f"ember.{name}")
    if name in ("Trainer", "hooks"):
        from ember import trainer as _trainer

        return getattr(_trainer, name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
