"""Colossal-AI's ``colossalai.pipeline.pipelinable`` path: see :mod:`ember.compat.colossalai.pipeline`."""

from __future__ import annotations

from . import PipelinableContext, PipelinableModel

__all__ = ["PipelinableContext", "PipelinableModel"]
