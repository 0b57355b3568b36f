"""Colossal-AI's ``colossalai.engine``: the ``Engine`` (ember's) and ``engine.schedule``.

``colossalai.initialize`` returns ember's :class:`ember.Engine` (``engine(x)``, ``criterion``,
``zero_grad``, ``backward``, ``step``, ``train``/``eval``, ``model``, ``optimizer``); the
schedules of :mod:`.schedule` are adapters onto ember's (give one to the compat ``Trainer``).
"""

from __future__ import annotations

from ember.compat._not_provided import module_getattr
from ember.engine import Engine

from . import schedule

__all__ = ["Engine", "schedule"]

__getattr__ = module_getattr(__name__, "colossalai.engine", {
    "gradient_handler": "gradient handlers are callables in the config's gradient_handler=[...] list",
    "ophooks": "ember has no op hooks: initialize(ophooks=...) must be empty; use ember.trainer hooks",
    "paramhooks": "ember has no parameter hooks: register torch hooks on the parameters yourself",
})  # fmt: skip
