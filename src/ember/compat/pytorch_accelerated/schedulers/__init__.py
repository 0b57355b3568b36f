"""pytorch-accelerated's ``schedulers``: ``CosineLrScheduler`` and the scheduler base classes.

They are stepped after every optimizer update (the Trainer's ``scheduler_step``), and work in
any hand-written loop too.
"""

from __future__ import annotations

from .cosine_scheduler import CosineLrScheduler
from .scheduler_base import SchedulerBase, StatefulSchedulerBase
from .wsd_scheduler import WSDLrScheduler

__all__ = ["CosineLrScheduler", "SchedulerBase", "StatefulSchedulerBase", "WSDLrScheduler"]
