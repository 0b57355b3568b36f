"""detectron2's ``config``: not provided; each of its names says what to use instead.

ember has no yacs/LazyConfig system: a detectron2 program that builds its trainer from a config
(``get_cfg``, ``DefaultTrainer(cfg)``) builds a ``SimpleTrainer`` from its model, loader and
optimizer instead, and reads its settings from ember's config (``ember.config``) or its own.
"""

from __future__ import annotations

from ember.compat._not_provided import module_getattr

_WAY = "ember has no yacs/LazyConfig system: build a SimpleTrainer from your objects; settings in ember.config"

__getattr__ = module_getattr(__name__, "detectron2.config", {
    name: _WAY for name in ("get_cfg", "CfgNode", "LazyConfig", "LazyCall", "instantiate", "configurable",
                            "set_global_cfg", "global_cfg")
})  # fmt: skip
