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

    Each setting is the launched config's (``parallel.tensor``), read when asked, so it follows a
    launch and a ``gpc.destroy()`` as Colossal-AI's, which its launch filled in; a setting given
    by :meth:`load` (or assigned) is kept instead.

    Attributes:
        mode: the mode of the launched config's ``parallel.tensor`` (None without one).
        vocab_parallel: whether embeddings and the classifier split the vocabulary.
        parallel_input_1d: whether 1-D layers take split inputs.
        summa_dim: the 2-D grid side; ``tesseract_dim``, ``tesseract_dep``: the 2.5-D ones;
            ``depth_3d``: the 3-D cube side (None where the mode has none).

    Example:
        >>> colossalai.launch_from_torch(config=dict(parallel=dict(tensor=dict(size=4, mode="2d"))))
        >>> tensor_parallel_env.mode, tensor_parallel_env.summa_dim
        ('2d', 2)
    """

    mode: str | None
    vocab_parallel: bool
    parallel_input_1d: bool
    summa_dim: int | None
    tesseract_dim: int | None
    tesseract_dep: int | None
    depth_3d: int | None
    input_group_3d: Any
    weight_group_3d: Any
    output_group_3d: Any
    input_x_weight_group_3d: Any
    output_x_weight_group_3d: Any

    def __init__(self, **kwargs: Any) -> None:
        self._given: dict[str, Any] = {}
        self.load(**kwargs)

    def __getattr__(self, name: str) -> Any:
        if name not in _FIELDS:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        given: dict[str, Any] = object.__getattribute__(self, "_given")
        return given[name] if name in given else _launched().get(name, _DEFAULTS.get(name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_given":
            object.__setattr__(self, name, value)
        else:
            self.load(**{name: value})

    def load(self, **kwargs: Any) -> None:
        """Set the settings given (Colossal-AI's names); they override the launched config's.

        Raises:
            ConfigError: a name that is not one of them.
        """
        unknown = sorted(set(kwargs) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"tensor_parallel_env.load got {unknown}; the settings are {', '.join(_FIELDS)}")
        self._given.update(kwargs)

    def load_from_config(self) -> None:
        """Forget the settings given by :meth:`load`: read them all from the launched config again."""
        self._given.clear()

    def save(self) -> dict[str, Any]:
        """The settings as a dict."""
        return {key: getattr(self, key) for key in _FIELDS}


_DEFAULTS: dict[str, Any] = {"vocab_parallel": False, "parallel_input_1d": False}


def _launched() -> dict[str, Any]:
    """The settings the launched config's ``parallel.tensor`` implies (none when not launched)."""
    if not _context.is_launched():
        return {}
    config: Any = _context.get_context().config
    parallel = config.get("parallel") if config is not None else None
    tensor = parallel.get("tensor") if isinstance(parallel, dict) else None
    if not isinstance(tensor, dict) or int(tensor.get("size", 1) or 1) <= 1:
        return {}
    mode, size = tensor.get("mode", "1d"), int(tensor["size"])
    if mode == "2d":
        return {"mode": mode, "summa_dim": round(size**0.5)}
    if mode == "2.5d":
        depth = int(tensor.get("depth", 1))
        return {"mode": mode, "tesseract_dep": depth, "tesseract_dim": round((size // depth) ** 0.5)}
    if mode == "3d":
        return {"mode": mode, "depth_3d": round(size ** (1 / 3))}
    return {"mode": mode}


tensor_parallel_env = TensorParallelEnv()
"""The one instance, as ``from colossalai.global_variables import tensor_parallel_env``."""
