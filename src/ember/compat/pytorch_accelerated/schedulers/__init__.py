"""pytorch-accelerated's ``schedulers``: ``CosineLrScheduler`` and the scheduler base classes.

They are stepped after every optimizer update (the Trainer's ``scheduler_step``), and work in
any hand-written loop too. ``WSDLrScheduler`` is not provided (see ``docs/migrating.md``).
"""

from __future__ import annotations

from ember.compat._not_provided import module_getattr

from .cosine_scheduler import CosineLrScheduler
from .scheduler_base import SchedulerBase, StatefulSchedulerBase

__all__ = ["CosineLrScheduler", "SchedulerBase", "StatefulSchedulerBase"]

__getattr__ = module_getattr(__name__, "pytorch_accelerated.schedulers", {
    "WSDLrScheduler": "use CosineLrScheduler, or torch's LambdaLR over a schedule of your own",
    "wsd_scheduler": "use CosineLrScheduler, or torch's LambdaLR over a schedule of your own",
})  # fmt: skip
