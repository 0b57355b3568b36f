"""One-process versions of the grid layers that torch has no module for: a ViT's patch
embedding and a classification head (Colossal-AI's ``VanillaPatchEmbedding`` and
``VanillaClassifier``).

Their parameters have the names and shapes of the whole tensors of the grid layers
(``weight``, ``bias``, ``cls_token``, ``pos_embed``), so a state dict moves between them and
:class:`~ember.parallel.tensor2d.PatchEmbedding2D` & co. in both directions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.parallel.grid_layers import Initializer, check_image, default_linear_init, patch_shapes

__all__ = ["Accuracy", "VanillaClassifier", "VanillaPatchEmbedding"]


def _fill(tensor: torch.Tensor, custom: Initializer | None, fan_in: int, fan_out: int, default: Any) -> None:
    with torch.no_grad():
        if custom is None:
            default(tensor)
        else:
            custom(tensor, fan_in=fan_in, fan_out=fan_out)


class VanillaPatchEmbedding(nn.Module):
    """A ViT's patch embedding in one process: ``[batch, patches + 1, embed]`` out.

    Args: as :class:`~ember.parallel.tensor2d.PatchEmbedding2D`, without ``grid``.

    Example:
        >>> embed = VanillaPatchEmbedding(8, 4, 3, 16)   # 4 patches + the class token
    """

    def __init__(
        self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int, embed_size: int,
        flatten: bool = True, dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, position_embed_initializer: Initializer | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.img_size, self.patch_size, self.num_patches = patch_shapes(
            type(self).__name__, img_size, patch_size, flatten
        )
        self.embed_size = embed_size
        fan_in = in_chans * self.patch_size[0] * self.patch_size[1]
        self.weight = nn.Parameter(torch.empty(embed_size, in_chans, *self.patch_size, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(embed_size, dtype=dtype))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_size, dtype=dtype))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_patches + 1, embed_size, dtype=dtype))
        _fill(self.weight, weight_initializer, fan_in, embed_size, lambda t: default_linear_init(t, fan_in))
        _fill(self.bias, bias_initializer, fan_in, embed_size, lambda t: default_linear_init(t, fan_in))
        _fill(self.pos_embed, position_embed_initializer, fan_in, embed_size, nn.init.zeros_)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed ``images [batch, channels, height, width]``: class token first, plus positions."""
        check_image(type(self).__name__, images, self.img_size)
        out = F.conv2d(images, self.weight, self.bias, stride=self.patch_size).flatten(2).transpose(1, 2)
        return torch.cat((self.cls_token.expand(out.shape[0], -1, -1), out), dim=1) + self.pos_embed


class Accuracy(nn.Module):
    """The number of rows of ``logits [N, classes]`` whose largest logit is at ``targets [N]``:
    an ``AccuracyHook(accuracy_func=...)`` for logits every rank holds whole (one process, 1-D).

    Example:
        >>> Accuracy()(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(1)
    """

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's count of correct predictions."""
        return (logits.argmax(dim=-1) == targets).sum()


class VanillaClassifier(nn.Module):
    """A classification head in one process (``x @ weight.T + bias``), optionally sharing a weight.

    Args: as :class:`~ember.parallel.tensor2d.Classifier2D`, without ``grid``.
    """

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_features, self.num_classes = in_features, num_classes
        if weight is not None:
            self.weight = weight
        else:
            self.weight = nn.Parameter(torch.empty(num_classes, in_features, dtype=dtype))
            _fill(
                self.weight, weight_initializer, in_features, num_classes, lambda t: default_linear_init(t, in_features)
            )
        if bias:
            self.bias = nn.Parameter(torch.empty(num_classes, dtype=dtype))
            _fill(self.bias, bias_initializer, in_features, num_classes, lambda t: default_linear_init(t, in_features))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of ``x [..., in_features]``."""
        return F.linear(x, self.weight, self.bias)
