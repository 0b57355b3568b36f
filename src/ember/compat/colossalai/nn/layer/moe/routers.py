"""Colossal-AI's MoE routers and noise generators, as :class:`ember.parallel.moe.Router` subclasses.

What Colossal-AI did its own way and these keep: the capacity ``floor(k · factor · tokens /
experts)``, rounded up to even, at least ``min_capacity``; gate weights that are the softmax
probabilities themselves (not renormalised over the two choices); Top-2's auxiliary loss over
both choices, halved. Routing itself (first choices before second ones, token order within an
expert) is the same in both.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.errors import ConfigError
from ember.parallel.moe import Router

__all__ = ["MoeRouter", "NormalNoiseGenerator", "Top1Router", "Top2Router", "UniformNoiseGenerator"]


class MoeRouter(Router):
    """Colossal-AI's router base: ``k_value`` experts per token with its capacity rule.

    Args:
        k_value: experts per token (1 or 2).
        capacity_factor_train: the capacity factor while training.
        capacity_factor_eval: the capacity factor in evaluation.
        min_capacity: the smallest capacity.
        noisy_func: noise on the logits while training (a noise generator below), or None.
        drop_tks: in evaluation, False gives every expert room for all its tokens.
    """

    def __init__(
        self,
        k_value: int,
        capacity_factor_train: float,
        capacity_factor_eval: float,
        min_capacity: int,
        noisy_func: Callable[[torch.Tensor], torch.Tensor] | None = None,
        drop_tks: bool = True,
    ) -> None:
        super().__init__(
            k=k_value, capacity_factor=capacity_factor_train, eval_capacity_factor=capacity_factor_eval,
            min_capacity=min_capacity, noise=noisy_func, normalize=False, drop_tokens=drop_tks,
        )  # fmt: skip

    @property
    def k_value(self) -> int:
        """Experts per token."""
        return self.k

    def capacity(self, tokens: int, experts: int, counts: torch.Tensor | None = None) -> int:
        if not self.training and not self.drop_tokens and counts is not None:
            return super().capacity(tokens, experts, counts)
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        capacity = math.floor(self.k * factor * tokens / experts)
        return max(capacity + capacity % 2, self.min_capacity)


class Top1Router(MoeRouter):
    """Switch Transformer routing (one expert per token).

    Example:
        >>> router = Top1Router(capacity_factor_train=1.25, noisy_func=UniformNoiseGenerator())
    """

    def __init__(
        self,
        capacity_factor_train: float = 1.25,
        capacity_factor_eval: float = 2.0,
        min_capacity: int = 4,
        select_policy: str = "first",
        noisy_func: Callable[[torch.Tensor], torch.Tensor] | None = None,
        drop_tks: bool = True,
    ) -> None:
        if select_policy != "first":
            raise ConfigError(
                f"Top1Router(select_policy={select_policy!r}): ember fills each expert in token order "
                "(select_policy='first'); Colossal-AI's 'random' priority is not provided"
            )
        super().__init__(1, capacity_factor_train, capacity_factor_eval, min_capacity, noisy_func, drop_tks)
        self.select_policy = select_policy


class Top2Router(MoeRouter):
    """GShard routing (two experts per token); the auxiliary loss counts both choices, halved.

    Example:
        >>> router = Top2Router(capacity_factor_train=1.2, noisy_func=NormalNoiseGenerator(4))
    """

    def __init__(
        self,
        capacity_factor_train: float = 1.25,
        capacity_factor_eval: float = 2.0,
        min_capacity: int = 4,
        noisy_func: Callable[[torch.Tensor], torch.Tensor] | None = None,
        drop_tks: bool = True,
    ) -> None:
        super().__init__(2, capacity_factor_train, capacity_factor_eval, min_capacity, noisy_func, drop_tks)

    def balance_loss(self, probs: torch.Tensor, choices: torch.Tensor) -> torch.Tensor:
        experts = probs.shape[-1]
        chosen = F.one_hot(choices, experts).sum(1).to(probs.dtype)  # both choices
        return experts * torch.sum(chosen.mean(0) * probs.mean(0)) / 2


class UniformNoiseGenerator:
    """Multiplies logits by U(1 - eps, 1 + eps) (Switch Transformer's jitter).

    Example:
        >>> noisy = UniformNoiseGenerator(eps=1e-2)(torch.ones(2, 4))
    """

    def __init__(self, eps: float = 1e-2) -> None:
        if not (isinstance(eps, (int, float)) and 0 <= eps < 1):
            raise ConfigError(f"UniformNoiseGenerator(eps={eps!r}) must be a number from 0 to 1 (excluded)")
        self.eps = eps

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs * torch.empty_like(inputs).uniform_(1 - self.eps, 1 + self.eps)


class NormalNoiseGenerator:
    """Adds N(0, (1 / E²)²) to the logits of ``num_experts`` experts (Colossal-AI's spread).

    Example:
        >>> noisy = NormalNoiseGenerator(num_experts=4)(torch.ones(2, 4))
    """

    def __init__(self, num_experts: int) -> None:
        if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
            raise ConfigError(f"NormalNoiseGenerator(num_experts={num_experts!r}) must be an int >= 1")
        self.std = 1.0 / num_experts**2

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs + torch.randn_like(inputs) * self.std
