"""pytorch-accelerated's ``finetuning``: :class:`ModelFreezer`, to freeze and unfreeze parts of a model.

A *layer group* is a direct child of the model (``model.children()``), a *layer* is a module
without children inside one; groups are indexed from the front (0, 1, ...) or the back (-1 is
the last). Frozen parameters have ``requires_grad=False``; batch-norm layers are left
trainable unless ``freeze_batch_norms=True``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import torch
from torch import nn

from ember.errors import TrainerError

__all__ = ["Layer", "LayerGroup", "ModelFreezer"]

BN_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class Layer(NamedTuple):
    """A module without children: ``layer_group_idx`` is ``(index, index - num_groups)``."""

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


class LayerGroup(NamedTuple):
    """A direct child of the model: ``layer_group_idx`` is ``(index, index - num_groups)``."""

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


def _module_is_batch_norm(module: nn.Module) -> bool:
    return isinstance(module, BN_MODULES)


def _leaves(module: nn.Module) -> list[nn.Module]:
    children = list(module.children())
    return [module] if not children else [leaf for child in children for leaf in _leaves(child)]


class ModelFreezer:
    """Freezes and unfreezes a model's layer groups, for transfer learning; every parameter is
    made trainable when the freezer is built.

    Args:
        model: the model.
        freeze_batch_norms: freeze batch-norm layers too (by default they stay trainable).

    Example:
        >>> freezer = ModelFreezer(model)
        >>> freezer.freeze()                          # all groups but the last
        >>> trainer.train(train_dataset=ds, num_epochs=2)
        >>> new_params = freezer.unfreeze()           # {group index: {"params": [...]}}
    """

    def __init__(self, model: nn.Module, freeze_batch_norms: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TrainerError(f"ModelFreezer needs an nn.Module, got {type(model).__name__}")
        self.model = model
        for p in model.parameters():
            p.requires_grad = True
        self._layer_groups = dict(enumerate(model.children()))
        self._layers = [(i, leaf) for i, group in self._layer_groups.items() for leaf in _leaves(group)]
        self.freeze_bn = freeze_batch_norms
        self.num_groups = len(self._layer_groups)

    def _index(self, i: int) -> tuple[int, int]:
        return (i, i - self.num_groups)

    def get_layer_groups(self) -> list[LayerGroup]:
        """The model's direct children; a group is frozen when any of its parameters is."""
        return [
            LayerGroup(self._index(i), m, any(not p.requires_grad for p in m.parameters()))
            for i, m in self._layer_groups.items()
        ]

    def get_layers(self) -> list[Layer]:
        """The model's leaf modules; one without parameters counts as frozen in eval mode.

        Raises:
            TrainerError: a layer has some parameters frozen and others not (changed by hand).
        """
        layers = []
        for i, module in self._layers:
            trainable = {p.requires_grad for p in module.parameters(recurse=False)}
            if len(trainable) > 1:
                raise TrainerError(f"layer {module!r} has frozen and trainable parameters: freeze it whole")
            frozen = (not trainable.pop()) if trainable else not module.training
            layers.append(Layer(self._index(i), module, frozen))
        return layers

    def get_trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters that are not frozen."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def freeze(self, from_index: int = 0, to_index: int = -2, set_modules_as_eval: bool = False) -> None:
        """Freeze the groups ``from_index`` to ``to_index`` (inclusive; by default all but the last).

        Args:
            from_index: the first group to freeze.
            to_index: the last group to freeze.
            set_modules_as_eval: also put the frozen layers in eval mode.
        """
        self._set(from_index, to_index, trainable=False, switch_mode=set_modules_as_eval)

    def unfreeze(
        self, from_index: int = -1, to_index: int = 0, set_modules_as_training: bool = True
    ) -> dict[int, dict[str, list[nn.Parameter]]]:
        """Unfreeze the groups ``from_index`` to ``to_index`` (inclusive; by default all).

        Args:
            from_index: one end of the range of groups.
            to_index: the other end.
            set_modules_as_training: also put the unfrozen layers in training mode.

        Returns:
            The parameters unfrozen, per group: ``{index: {"params": [...]}}``, ready for
            ``optimizer.add_param_group``.
        """
        return self._set(from_index, to_index, trainable=True, switch_mode=set_modules_as_training)

    def _convert_idxs(self, from_idx: int, to_idx: int) -> tuple[int, int]:
        """Both indexes counted from the front, in increasing order."""
        first, last = (i + self.num_groups if i < 0 else i for i in (from_idx, to_idx))
        return (first, last) if first <= last else (last, first)

    def _set(self, from_index: int, to_index: int, trainable: bool, switch_mode: bool) -> dict[int, Any]:
        first, last = self._convert_idxs(from_index, to_index)
        changed: defaultdict[int, list[nn.Parameter]] = defaultdict(list)
        for layer in self.get_layers():
            group = layer.layer_group_idx[0]
            if not first <= group <= last or layer.is_frozen is not trainable:
                continue
            if _module_is_batch_norm(layer.module) and not self.freeze_bn:
                continue
            params = list(layer.module.parameters())
            with torch.no_grad():
                for p in params:
                    p.requires_grad = trainable
            if switch_mode:
                layer.module.train(trainable)
            changed[group].extend(params)
        return {group: {"params": params} for group, params in changed.items() if params}
