"""detectron2's ``model_zoo``: not provided; each of its names says what to use instead."""

from __future__ import annotations

from ember.compat._not_provided import module_getattr

_WAY = "the model zoo's configs and weights are not provided: build the model yourself and load weights with torch"

__getattr__ = module_getattr(__name__, "detectron2.model_zoo", {
    name: _WAY for name in ("get", "get_config", "get_config_file", "get_checkpoint_url")
})  # fmt: skip
