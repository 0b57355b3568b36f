"""ember: train PyTorch models with an Engine or a hook-driven Trainer.

Public names::

    ember.launch / launch_from_torch / launch_from_slurm / launch_from_openmpi
    ember.context            rank, local_rank, world_size, device, is_main_process (after launch)
    ember.config             the launched config, attribute access (after launch)
    ember.initialize         -> (engine, train_dl, test_dl, lr_scheduler)
    ember.get_dataloader     a resumable, distributed-aware DataLoader
    ember.get_dist_logger    logger.info("msg", ranks=[0])
    ember.Trainer, ember.hooks (from ember.trainer), ember.track (experiment tracking)

Names load on first use, so ``import ember`` (and the ``ember`` command) stays quick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember._lazy import lazy_getattr

if TYPE_CHECKING:
    from ember import checkpoint, config, context, distributed, errors, track, trainer
    from ember.config import Config, load_config
    from ember.data import get_dataloader
    from ember.engine import Engine
    from ember.initializer import initialize
    from ember.launcher import launch, launch_from_openmpi, launch_from_slurm, launch_from_torch, seed_everything
    from ember.logging import get_dist_logger
    from ember.trainer import Trainer, hooks

from ember._version import __version__

_ATTRS = {
    "Config": "ember.config",
    "load_config": "ember.config",
    "get_dataloader": "ember.data",
    "Engine": "ember.engine",
    "initialize": "ember.initializer",
    "launch": "ember.launcher",
    "launch_from_torch": "ember.launcher",
    "launch_from_slurm": "ember.launcher",
    "launch_from_openmpi": "ember.launcher",
    "seed_everything": "ember.launcher",
    "get_dist_logger": "ember.logging",
    "Trainer": "ember.trainer",
    "hooks": "ember.trainer",
}
_MODULES = ("checkpoint", "config", "context", "distributed", "errors", "track", "trainer")

__all__ = [
    "Config",
    "Engine",
    "Trainer",
    "__version__",
    "checkpoint",
    "config",
    "context",
    "distributed",
    "errors",
    "get_dataloader",
    "get_dist_logger",
    "hooks",
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


__getattr__ = lazy_getattr(__name__, _ATTRS, _MODULES)
