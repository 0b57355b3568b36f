"""Colossal-AI's ``colossalai.global_variables``: ``tensor_parallel_env``, the tensor-parallel settings.

Colossal-AI's layers read the tensor-parallel mode and its sizes from this one object, set when
the job is launched. Here :meth:`TensorParallelEnv.load_from_config` reads them from the
launched config (``parallel.tensor``), and :meth:`TensorParallelEnv.load` sets them, as in
Colossal-AI; until then the mode is None.
"""

from __future__ import annotations

from typing import Any

from ember import context as _context
from ember.errors import ConfigError

__all__ = ["TensorParallelEnv", "tensor_parallel_env"]

_FIELDS = ("mode", "vocab_parallel", "parallel_input_1d", "summa_dim", "tesseract_dim", "tesseract_dep",
           "depth_3d", "input_group_3d", "weight_group_3d", "output_group_3d", "input_x_weight_group_3d",
           "output_x_weight_group_3d")  # fmt: skip


class TensorParallelEnv:
    """The tensor-parallel mode (``None``, ``"1d"``, ``"2d"``, ``"2.5d"``, ``"3d"``, ``"sequence"``)
    and its settings, as Colossal-AI's layers read them.

    Attributes:
        mode: the mode of the launched config's ``parallel.tensor`` (None without one).
        vocab_parallel: whether embeddings and the classifier split the vocabulary.
        parallel_input_1d: whether 1-D layers take split inputs.
        summa_dim: the 2-D grid side; ``tesseract_dim``, ``tesseract_dep``: the 2.5-D ones;
            ``depth_3d``: the 3-D cube side (None where the mode has none).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.mode: str | None = None
        self.vocab_parallel = False
        self.parallel_input_1d = False
        self.summa_dim: int | None = None
        self.tesseract_dim: int | None = None
        self.tesseract_dep: int | None = None
        self.depth_3d: int | None = None
        self.input_group_3d: Any = None
        self.weight_group_3d: Any = None
        self.output_group_3d: Any = None
        self.input_x_weight_group_3d: Any = None
        self.output_x_weight_group_3d: Any = None
        self.load(**kwargs)

    def load(self, **kwargs: Any) -> None:
        """Set the settings given (Colossal-AI's names).

        Raises:
            ConfigError: a name that is not one of them.
        """
        unknown = sorted(set(kwargs) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"tensor_parallel_env.load got {unknown}; the settings are {', '.join(_FIELDS)}")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def load_from_config(self) -> None:
        """Read the mode and sizes of the launched config's ``parallel.tensor`` (nothing when not launched)."""
        if not _context.is_launched():
            return
        config: Any = _context.get_context().config
        parallel = config.get("parallel") if config is not None else None
        tensor = parallel.get("tensor") if isinstance(parallel, dict) else None
        if not isinstance(tensor, dict) or int(tensor.get("size", 1) or 1) <= 1:
            return
        mode, size = tensor.get("mode", "1d"), int(tensor["size"])
        self.mode = mode
        if mode == "2d":
            self.summa_dim = round(size**0.5)
        elif mode == "2.5d":
            depth = int(tensor.get("depth", 1))
            self.tesseract_dep, self.tesseract_dim = depth, round((size // depth) ** 0.5)
        elif mode == "3d":
            self.depth_3d = round(size ** (1 / 3))

    def save(self) -> dict[str, Any]:
        """The settings as a dict."""
        return {key: getattr(self, key) for key in _FIELDS}


tensor_parallel_env = TensorParallelEnv()
"""The one instance, as ``from colossalai.global_variables import tensor_parallel_env``."""
