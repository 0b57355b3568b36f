"""Colossal-AI's experts and MoE layers on :mod:`ember.parallel.moe`: ``(output, l_aux)`` out, as there."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember import context as _context
from ember.errors import ConfigError, EngineError
from ember.parallel import moe as _moe

from ....moe_context import MOE_CONTEXT
from .routers import NormalNoiseGenerator, Top1Router, Top2Router, UniformNoiseGenerator

__all__ = ["Experts", "FFNExperts", "MoeLayer", "MoeModule", "TPExperts", "build_ffn_experts"]


class Experts(_moe.Experts):
    """This rank's share of ``num_experts`` experts, each ``expert_cls(**expert_args)``.

    Initialised from ``MOE_CONTEXT``'s per-rank stream after ``MOE_CONTEXT.setup(seed)``; each
    parameter carries ``moe_info`` as in Colossal-AI.

    Args:
        expert_cls: the expert's class (Colossal-AI 0.1's ``expert=`` is accepted too).
        num_experts: experts in all, a multiple of ``max_ep_size``.
        expert_args: the class's arguments.

    Example:
        >>> experts = Experts(nn.Linear, 4, in_features=16, out_features=16)
    """

    comm_name = "all_to_all"

    def __init__(self, expert_cls: type[nn.Module] | None = None, num_experts: int = 1, **expert_args: Any) -> None:
        expert_cls = expert_cls if expert_cls is not None else expert_args.pop("expert", None)
        if not callable(expert_cls):
            raise EngineError(
                f"Experts(expert_cls={expert_cls!r}, num_experts, **args) needs the expert's class (nn.Linear...)"
            )
        self._build(lambda: expert_cls(**expert_args), num_experts)

    def _build(self, make: Callable[[], nn.Module], num_experts: int) -> None:
        _, info = MOE_CONTEXT.get_info(num_experts)
        with MOE_CONTEXT.expert_rng():
            super().__init__(make, num_experts)
        self.dist_info = info
        for param in self.parameters():
            param.moe_info = info  # type: ignore[attr-defined]

    @property
    def num_local_experts(self) -> int:
        """Experts on this rank."""
        return self.num_local


class _FFN(nn.Module):
    """One feed-forward expert with Colossal-AI's initialisation (truncated normal, std √(0.1/fan-in))."""

    def __init__(self, d_model: int, d_ff: int, activation: nn.Module | None, drop_rate: float) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        for layer, fan_in in ((self.fc1, d_model), (self.fc2, d_ff)):
            nn.init.trunc_normal_(layer.weight, std=math.sqrt(0.1 / fan_in))
            nn.init.trunc_normal_(layer.bias, std=math.sqrt(0.1 / fan_in))
        self.act = activation if activation is not None else nn.GELU()
        self.drop = nn.Dropout(drop_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class FFNExperts(Experts):
    """Feed-forward experts ``d_model -> d_ff -> d_model`` (Colossal-AI's batched ``FFNExperts``).

    Example:
        >>> experts = FFNExperts(num_experts=8, d_model=64, d_ff=256, drop_rate=0.1)
    """

    def __init__(
        self, num_experts: int, d_model: int, d_ff: int, activation: nn.Module | None = None, drop_rate: float = 0
    ) -> None:
        self._build(lambda: _FFN(d_model, d_ff, activation, drop_rate), num_experts)


class TPExperts(nn.Module):
    """Colossal-AI's tensor-parallel experts (fewer experts than ranks): not provided by ember."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise EngineError(
            "TPExperts (experts split by tensor parallelism, for expert counts that are not a multiple of the "
            "expert-parallel size) is not provided by ember: use Experts or FFNExperts with a multiple of "
            f"max_ep_size={MOE_CONTEXT.max_ep_size} experts"
        )


def build_ffn_experts(
    num_experts: int, d_model: int, d_ff: int, activation: nn.Module | None = None, drop_rate: float = 0
) -> FFNExperts:
    """``FFNExperts`` when ``num_experts`` is a multiple of ``max_ep_size``; otherwise a clear error
    (Colossal-AI fell back to ``TPExperts``, which ember does not provide).

    Example:
        >>> experts = build_ffn_experts(8, d_model=64, d_ff=256)
    """
    if num_experts % MOE_CONTEXT.max_ep_size:
        TPExperts()
    return FFNExperts(num_experts, d_model, d_ff, activation, drop_rate)


class MoeLayer(_moe.MoE):
    """Colossal-AI's MoE layer: gate, ``router``, ``experts``; returns ``(output, l_aux)``.

    The auxiliary loss is returned, not added by the Engine: Colossal-AI programs add it with
    ``MOE_CONTEXT.add_loss(l_aux)`` and ``MoeLoss``. Dropped tokens are still counted and logged
    (``moe/dropped_fraction``).

    Args:
        dim_model: the token width.
        num_experts: the experts in all.
        router: a ``Top1Router`` or ``Top2Router``.
        experts: the ``Experts``.

    Example:
        >>> layer = MoeLayer(16, 4, Top2Router(), Experts(nn.Linear, 4, in_features=16, out_features=16))
        >>> out, l_aux = layer(torch.randn(8, 16))
    """

    def __init__(self, dim_model: int, num_experts: int, router: _moe.Router, experts: _moe.Experts) -> None:
        super().__init__(dim_model, num_experts, experts, router, aux_loss_weight=0.0)
        nn.init.trunc_normal_(self.gate.weight, std=math.sqrt(0.1 / dim_model))
        self.ep_size, self.num_local_experts = experts.layout.expert, experts.num_local

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        out = super().forward(inputs)
        assert self.aux_loss is not None  # set by every forward
        return out, self.aux_loss


class MoeModule(nn.Module):
    """Colossal-AI's all-in-one MoE module (optionally a residual MoE); returns ``(output, l_aux)``.

    Args:
        dim_model: the token width.
        num_experts: the experts in all.
        top_k: 1 or 2.
        capacity_factor_train: the capacity factor while training.
        capacity_factor_eval: the capacity factor in evaluation.
        min_capacity: the smallest capacity.
        noisy_policy: None, ``"Jitter"`` or ``"Gaussian"``.
        drop_tks: in evaluation, False drops no token.
        use_residual: mix in a dense residual expert with a learnt coefficient (PR-MoE).
        residual_instance: the residual module (default: ``expert_cls(**expert_args)``).
        expert_instance: the ``Experts`` (default: built from ``expert_cls``).
        expert_cls: the expert's class.
        expert_args: its arguments.

    Example:
        >>> moe = MoeModule(16, 4, top_k=2, expert_cls=nn.Linear, in_features=16, out_features=16)
        >>> out, l_aux = moe(torch.randn(8, 16))
    """

    def __init__(
        self,
        dim_model: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor_train: float = 1.25,
        capacity_factor_eval: float = 2.0,
        min_capacity: int = 4,
        noisy_policy: str | None = None,
        drop_tks: bool = True,
        use_residual: bool = False,
        residual_instance: nn.Module | None = None,
        expert_instance: _moe.Experts | None = None,
        expert_cls: type[nn.Module] | None = None,
        **expert_args: Any,
    ) -> None:
        super().__init__()
        noises = {None: None, "Jitter": UniformNoiseGenerator, "Gaussian": lambda: NormalNoiseGenerator(num_experts)}
        if noisy_policy not in noises or top_k not in (1, 2):
            raise ConfigError(
                f"MoeModule(top_k={top_k!r}, noisy_policy={noisy_policy!r}): top_k is 1 or 2, noisy_policy None, "
                "'Jitter' or 'Gaussian'"
            )
        make_noise = noises[noisy_policy]
        router = (Top1Router if top_k == 1 else Top2Router)(
            capacity_factor_train=capacity_factor_train, capacity_factor_eval=capacity_factor_eval,
            min_capacity=min_capacity, noisy_func=make_noise() if make_noise else None, drop_tks=drop_tks,
        )  # fmt: skip
        if expert_instance is None and expert_cls is None:
            raise EngineError("MoeModule needs expert_instance=Experts(...) or expert_cls=... with its arguments")
        self.use_residual = use_residual
        if use_residual:
            if residual_instance is None and expert_cls is None:
                raise EngineError("MoeModule(use_residual=True) needs residual_instance= or expert_cls=")
            self.residual_module = residual_instance if residual_instance is not None else expert_cls(**expert_args)  # type: ignore[misc]
            self.residual_combine = nn.Linear(dim_model, 2, device=_context.get_context(default=True).device)
        self.experts = (
            expert_instance if expert_instance is not None else Experts(expert_cls, num_experts, **expert_args)
        )
        self.moe_layer = MoeLayer(dim_model, num_experts, router, self.experts)

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, l_aux = self.moe_layer(inputs)
        if self.use_residual:
            coef = F.softmax(self.residual_combine(inputs), dim=-1)
            out = out * coef[..., 0:1] + self.residual_module(inputs) * coef[..., 1:]
        return out, l_aux
