"""Colossal-AI's mode-dispatching layers: ``Linear``, ``Classifier``, ``Embedding``,
``PatchEmbedding``, ``LayerNorm``, ``Dropout`` and ``partition_batch``.

Each reads ``parallel.tensor.mode`` of the launched config when it is built and returns that
mode's layer (:data:`ember.parallel.layers.MODE_CLASSES`): without a mode the one-process
layers (torch's, ``VanillaPatchEmbedding``, ``VanillaClassifier``), with ``"1d"``, ``"2d"``,
``"2.5d"`` or ``"3d"`` :mod:`ember.parallel.tensor1d` … :mod:`~ember.parallel.tensor3d`'s.
``Classifier`` and ``Embedding`` turn vocabulary-parallel above ``vocab_parallel_limit``
classes (then ``CrossEntropyLoss`` picks the vocabulary-parallel loss, as Colossal-AI's does).

Unlike Colossal-AI's, the object built *is* the mode's layer (``type(colossalai.nn.Linear(8, 8))``
is ``Linear2D`` under 2-D), not a wrapper holding it as ``.module``: its methods, state-dict
keys and ``isinstance`` checks are the layer's own. Built before a launch, each raises a
``ConfigError`` (Colossal-AI silently builds the one-process layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember import context as _context
from ember.errors import ConfigError
from ember.parallel.layers import MODE_CLASSES
from ember.parallel.tensor2d import split_batch_2d
from ember.parallel.tensor2p5d import split_batch_2p5d
from ember.parallel.tensor3d import split_batch_3d

__all__ = ["Classifier", "Dropout", "Embedding", "LayerNorm", "Linear", "PatchEmbedding", "partition_batch"]

_VOCAB_PARALLEL: dict[str, Any] = {"launch": None}
"""The launch under which a vocabulary-parallel layer was built (Colossal-AI's ``env.vocab_parallel``,
for the life of that launch)."""


def tensor_mode(who: str) -> str | None:
    """The launched config's ``parallel.tensor.mode`` (None: not set).

    Raises:
        ConfigError: nothing was launched.
    """
    if not _context.is_launched():
        raise ConfigError(
            f"colossalai.nn.{who} was built before colossalai.launch: launch first (the layer reads "
            "parallel.tensor.mode from the config), e.g. colossalai.launch_from_torch(config='config.py')"
        )
    config = _context.get_context().config
    tensor = config.parallel.tensor if config is not None else None
    return tensor.mode if tensor is not None else None


def vocab_parallel_built() -> bool:
    """Whether a vocabulary-parallel ``Embedding``/``Classifier`` was built since the launch."""
    return _context.is_launched() and _VOCAB_PARALLEL["launch"] is _context.get_context()


def _layer(name: str, mode: str | None) -> Any:
    return MODE_CLASSES[mode][name]


def _fill(tensor: torch.Tensor, init: Any, fan_in: int, fan_out: int) -> None:
    with torch.no_grad():
        init(tensor, fan_in=fan_in, fan_out=fan_out)


class Linear(nn.Module):
    """``Linear(in_features, out_features, bias=True, dtype=None, weight_initializer=None,
    bias_initializer=None, **kwargs)``: the launched mode's Linear (``nn.Linear`` without a mode).

    ``kwargs`` go to the mode's layer (``gather_output`` under 1-D, ``skip_bias_add``).

    Example:
        >>> fc = colossalai.nn.Linear(16, 64)   # Linear2D under parallel.tensor.mode='2d'
    """

    def __new__(  # type: ignore[misc]
        cls, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
        weight_initializer: Any = None, bias_initializer: Any = None, **kwargs: Any,
    ) -> nn.Module:  # fmt: skip
        mode = tensor_mode("Linear")
        if mode is None:
            layer = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=_device())
            if weight_initializer is not None:
                _fill(layer.weight, weight_initializer, in_features, out_features)
            if bias_initializer is not None and layer.bias is not None:
                _fill(layer.bias, bias_initializer, in_features, out_features)
            return layer
        if mode != "1d":
            kwargs.pop("gather_output", None)
        return _layer("Linear", mode)(in_features, out_features, bias=bias, dtype=dtype,
                                      weight_initializer=weight_initializer, bias_initializer=bias_initializer,
                                      **kwargs)  # fmt: skip


class Classifier(nn.Module):
    """``Classifier(in_features, num_classes, weight=None, bias=True, dtype=None, weight_initializer=None,
    bias_initializer=None, vocab_parallel_limit=2048)``: the mode's classifier, vocabulary-parallel
    above ``vocab_parallel_limit`` classes.
    """

    def __new__(  # type: ignore[misc]
        cls, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Any = None, bias_initializer: Any = None,
        vocab_parallel_limit: int = 2048,
    ) -> nn.Module:  # fmt: skip
        mode = tensor_mode("Classifier")
        name = "Classifier"
        if mode is not None and num_classes > vocab_parallel_limit:
            name = "VocabParallelClassifier"
            _VOCAB_PARALLEL["launch"] = _context.get_context()
        return _layer(name, mode)(in_features, num_classes, weight=weight, bias=bias, dtype=dtype,
                                  weight_initializer=weight_initializer, bias_initializer=bias_initializer)  # fmt: skip


class Embedding(nn.Module):
    """``Embedding(num_embeddings, embedding_dim, padding_idx=None, dtype=None, weight_initializer=None,
    vocab_parallel_limit=2048, *args, **kwargs)``: the mode's embedding, vocabulary-parallel above
    ``vocab_parallel_limit`` entries.
    """

    def __new__(  # type: ignore[misc]
        cls, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Any = None, vocab_parallel_limit: int = 2048,
        *args: Any, **kwargs: Any,
    ) -> nn.Module:  # fmt: skip
        mode = tensor_mode("Embedding")
        if mode is None:
            options = dict(zip(("max_norm", "norm_type", "scale_grad_by_freq", "sparse"), args, strict=False))
            layer = nn.Embedding(num_embeddings, embedding_dim, padding_idx, dtype=dtype, device=_device(),
                                 **options, **kwargs)  # fmt: skip
            if weight_initializer is not None:
                _fill(layer.weight, weight_initializer, num_embeddings, embedding_dim)
            return layer
        name = "Embedding"
        if num_embeddings > vocab_parallel_limit:
            name = "VocabParallelEmbedding"
            _VOCAB_PARALLEL["launch"] = _context.get_context()
        return _layer(name, mode)(num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, *args,
                                  **kwargs)  # fmt: skip


class PatchEmbedding(nn.Module):
    """``PatchEmbedding(img_size, patch_size, in_chans, embed_size, dtype=None, flatten=True,
    weight_initializer=None, bias_initializer=None, position_embed_initializer=None)``: the mode's."""

    def __new__(  # type: ignore[misc]
        cls, img_size: int, patch_size: int, in_chans: int, embed_size: int, dtype: torch.dtype | None = None,
        flatten: bool = True, weight_initializer: Any = None, bias_initializer: Any = None,
        position_embed_initializer: Any = None,
    ) -> nn.Module:  # fmt: skip
        layer = _layer("PatchEmbedding", tensor_mode("PatchEmbedding"))
        return layer(img_size, patch_size, in_chans, embed_size, flatten=flatten, dtype=dtype,
                     weight_initializer=weight_initializer, bias_initializer=bias_initializer,
                     position_embed_initializer=position_embed_initializer)  # fmt: skip


class LayerNorm(nn.Module):
    """``LayerNorm(normalized_shape, eps=1e-05, bias=True, dtype=None)``: the mode's (``nn.LayerNorm`` without one)."""

    def __new__(  # type: ignore[misc]
        cls, normalized_shape: int, eps: float = 1e-05, bias: bool = True, dtype: torch.dtype | None = None
    ) -> nn.Module:
        mode = tensor_mode("LayerNorm")
        if mode is None:
            return nn.LayerNorm(normalized_shape, eps=eps, bias=bias, dtype=dtype, device=_device())
        return _layer("LayerNorm", mode)(normalized_shape, eps=eps, bias=bias, dtype=dtype)


class Dropout(nn.Module):
    """``Dropout(p=0.5, inplace=False)``: ``Dropout1D`` under 1-D (one mask for a replicated
    activation), else ``nn.Dropout`` (each rank drops from its own block with its own generator)."""

    def __new__(cls, p: float = 0.5, inplace: bool = False) -> nn.Module:  # type: ignore[misc]
        return _layer("Dropout", tensor_mode("Dropout"))(p, inplace)


def partition_batch(input_: Any) -> Any:
    """This rank's rows of a batch (a tensor, or a dict of them) under 2-D/2.5-D/3-D; the batch
    itself otherwise."""
    mode = tensor_mode("partition_batch")
    split = {"2d": split_batch_2d, "2.5d": split_batch_2p5d, "3d": split_batch_3d}.get(mode or "")
    if split is None:
        return input_
    if isinstance(input_, dict):
        return {k: split(v) for k, v in input_.items()}
    return split(input_)


def _device() -> torch.device:
    return _context.get_context(default=True).device
