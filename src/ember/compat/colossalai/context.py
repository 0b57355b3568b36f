"""Colossal-AI's ``colossalai.context``: ``Config``, ``ConfigException``, ``ParallelMode`` and ``MOE_CONTEXT``.

``Config`` is ember's :class:`ember.config.Config` (a dict with attribute access), with
Colossal-AI's ``Config.from_file``; ``ConfigException`` is ember's ``ConfigError``;
``MOE_CONTEXT`` is :mod:`ember.compat.colossalai.moe_context`'s.
"""

from __future__ import annotations

import enum
import os
from typing import Any

from ember.config import Config as _Config
from ember.config import load_config
from ember.errors import ConfigError

from .moe_context import MOE_CONTEXT

__all__ = ["MOE_CONTEXT", "Config", "ConfigException", "ParallelMode"]

ConfigException = ConfigError
"""Colossal-AI's name for a bad config: ember raises :class:`ember.errors.ConfigError`."""


class Config(_Config):
    """ember's :class:`~ember.config.Config`, built from a dict as Colossal-AI's is.

    Pass it to ``launch_from_torch(config=...)`` like a file path; upper-case keys are the
    program's own constants (``gpc.config.BATCH_SIZE``), lower-case ones ember's settings.

    Example:
        >>> cfg = Config({"BATCH_SIZE": 128, "fp16": {"mode": AMP_TYPE.TORCH}})
        >>> cfg.BATCH_SIZE
        128
    """

    __slots__ = ()

    @staticmethod
    def from_file(filename: str | os.PathLike[str]) -> Config:
        """Read a config file (``.py``, ``.yaml``, ``.json``) the way a launch does.

        Args:
            filename: the file.

        Returns:
            The checked config, ember's defaults filled in.

        Raises:
            ConfigError: the file is missing, unreadable or holds a bad ember key.

        Example:
            >>> Config.from_file("config.py").NUM_EPOCHS
        """
        return Config(load_config(filename))


class ParallelMode(enum.Enum):
    """The process groups Colossal-AI names; ember has those of its mesh.

    ``GLOBAL`` is the whole job, ``DATA``/``PIPELINE``/``TENSOR`` the dimensions of ember's
    ``("pipeline", "data", "tensor")`` mesh, ``MODEL`` a pipeline × tensor block and
    ``PARALLEL_1D`` the tensor dimension (ember's tensor parallelism is 1-D). ``SEQUENCE`` is
    ember's ``"context"`` group and ``SEQUENCE_DP`` its data × context group, under
    ``tensor=dict(size=N, mode="sequence")``. ember has no 2-D, 2.5-D or 3-D tensor
    parallelism: ``gpc`` reports them as not initialised.
    """

    GLOBAL = "global"
    DATA = "data"
    MODEL = "model"
    PIPELINE = "pipe"
    TENSOR = "tensor"
    SEQUENCE = "sequence"
    SEQUENCE_DP = "sequence_dp"
    PARALLEL_1D = "1d"
    PARALLEL_2D_ROW = "2d_row"
    PARALLEL_2D_COL = "2d_col"
    PARALLEL_3D_INPUT = "3d_input"
    PARALLEL_3D_WEIGHT = "3d_weight"
    PARALLEL_3D_OUTPUT = "3d_output"
    PARALLEL_2P5D_ROW = "2p5d_row"
    PARALLEL_2P5D_COL = "2p5d_col"
    PARALLEL_2P5D_DEP = "2p5d_dep"
    PARALLEL_2P5D_XZ = "2p5d_xz"

    @classmethod
    def of(cls, value: Any) -> ParallelMode:
        """``value`` as a ParallelMode: a member, or its value (``"data"``).

        Raises:
            ConfigError: anything else, naming the modes.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(f"ParallelMode.{m.name}" for m in cls)
            raise ConfigError(f"parallel_mode must be one of {names}; got {value!r}") from None
