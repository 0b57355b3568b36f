"""Colossal-AI's ``colossalai.nn.optimizer``: ``FusedAdam``, ``FusedSGD``, ``Lamb``, ``FusedLAMB``.

``FusedAdam`` and ``FusedSGD`` are torch's ``Adam``/``AdamW`` and ``SGD`` with their fused
kernels on CUDA (``fused=True``) and the multi-tensor ones elsewhere (``foreach=True``): the same
updates as Colossal-AI's apex-style kernels, without building CUDA extensions. Options torch does
not have (Adam without bias correction, SGD's weight decay after momentum) are a
``ConfigError``, not silently different. torch has no LAMB: :class:`Lamb` (and ``FusedLAMB``,
the same class) is written here in plain tensor operations, one parameter at a time (not fused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ember.compat._not_provided import module_getattr
from ember.errors import ConfigError

__all__ = ["FusedAdam", "FusedLAMB", "FusedSGD", "Lamb"]


def _kernels(params: list[Any]) -> dict[str, bool]:
    """``fused=True`` when every parameter is on CUDA, else ``foreach=True``."""
    tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    on_cuda = bool(tensors) and all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)
    return {"fused": True} if on_cuda else {"foreach": True}


def _params(params: Iterable[Any], owner: str) -> list[Any]:
    if isinstance(params, torch.Tensor) or not isinstance(params, Iterable):
        raise ConfigError(f"{owner} needs the model's parameters (or parameter groups), got {type(params).__name__}")
    return list(params)


def _build(owner: str, cls: type[torch.optim.Optimizer], groups: list[Any], **kwargs: Any) -> torch.optim.Optimizer:
    """``cls(groups, **kwargs)``, torch's refusal of a value (a negative rate...) as a ConfigError."""
    try:
        return cls(groups, **kwargs)
    except ValueError as exc:
        raise ConfigError(f"{owner}: {exc}") from None


def FusedAdam(
    params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
    set_grad_none: bool = True,
) -> torch.optim.Optimizer:  # fmt: skip
    """Colossal-AI's ``FusedAdam``: torch's ``AdamW`` (``adam_w_mode=True``, decoupled weight
    decay) or ``Adam``, fused on CUDA, multi-tensor elsewhere.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        bias_correction: must stay True (torch's Adam always corrects the moments).
        betas: the moment coefficients.
        eps: added to the denominator.
        adam_w_mode: decoupled weight decay (AdamW); False: L2 added to the gradient (Adam).
        weight_decay: the decay.
        amsgrad: AMSGrad's maximum of the second moments.
        set_grad_none: accepted: ``zero_grad()`` sets gradients to None (torch's default).

    Returns:
        The torch optimizer.

    Raises:
        ConfigError: ``bias_correction=False``, or a value torch refuses (a negative rate...).

    Example:
        >>> optimizer = FusedAdam(model.parameters(), lr=3e-4, weight_decay=0.05)
    """
    if not bias_correction:
        raise ConfigError("FusedAdam(bias_correction=False) has no torch counterpart: torch's Adam corrects the bias")
    groups = _params(params, "FusedAdam")
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return _build("FusedAdam", cls, groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                  **_kernels(groups))  # fmt: skip


def FusedSGD(
    params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
    weight_decay: float = 0.0, nesterov: bool = False, wd_after_momentum: bool = False,
    materialize_master_grads: bool = True, set_grad_none: bool = False,
) -> torch.optim.Optimizer:  # fmt: skip
    """Colossal-AI's ``FusedSGD``: torch's ``SGD``, fused on CUDA, multi-tensor elsewhere.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        momentum: momentum factor.
        dampening: momentum dampening.
        weight_decay: L2 penalty, added to the gradient before the momentum.
        nesterov: Nesterov momentum.
        wd_after_momentum: must stay False (torch adds the decay before the momentum).
        materialize_master_grads: accepted (no fp16 master weights here: ember's AMP keeps fp32 weights).
        set_grad_none: accepted (``zero_grad()`` sets gradients to None).

    Returns:
        The torch optimizer.

    Raises:
        ConfigError: ``wd_after_momentum=True``, or a value torch refuses.
    """
    if wd_after_momentum:
        raise ConfigError("FusedSGD(wd_after_momentum=True) has no torch counterpart: torch's SGD decays first")
    groups = _params(params, "FusedSGD")
    return _build("FusedSGD", torch.optim.SGD, groups, lr=lr, momentum=momentum, dampening=dampening,
                  weight_decay=weight_decay, nesterov=nesterov, **_kernels(groups))  # fmt: skip


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning"), as Colossal-AI's ``Lamb``.

    Per parameter: Adam's moments (without bias correction, as the paper's v3), the step
    ``m / (sqrt(v) + eps) + weight_decay * p``, scaled by the trust ratio
    ``min(||p||, 10) / ||step||`` (1 when either norm is 0, or with ``adam=True``). Written with
    plain tensor operations: torch has no LAMB kernel, so it is not fused.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: the moment coefficients.
        eps: added to the denominator.
        weight_decay: decoupled weight decay, inside the trust ratio.
        adam: use a trust ratio of 1 (Adam without bias correction, for comparisons).

    Example:
        >>> optimizer = Lamb(model.parameters(), lr=2e-3, weight_decay=0.01)
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False) -> None:  # fmt: skip
        for name, value, ok in (("lr", lr, lr >= 0.0), ("eps", eps, eps >= 0.0),
                                ("betas[0]", betas[0], 0.0 <= betas[0] < 1.0),
                                ("betas[1]", betas[1], 0.0 <= betas[1] < 1.0),
                                ("weight_decay", weight_decay, weight_decay >= 0.0)):  # fmt: skip
            if not ok:
                raise ConfigError(f"Lamb({name}={value!r}) is out of range")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.adam = adam

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigError("Lamb does not take sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])
                weight_norm = p.norm().clamp(0, 10)
                update_norm = update.norm()
                trust = 1.0 if self.adam else torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                )  # fmt: skip
                p.sub_(update * (group["lr"] * trust))
        return loss


FusedLAMB = Lamb
"""Colossal-AI's fused LAMB: the same updates as :class:`Lamb` (not fused: torch has no LAMB kernel)."""

__getattr__ = module_getattr(__name__, "colossalai.nn.optimizer", {
    "CPUAdam": "ember offloads no optimizer to the CPU: use FusedAdam (torch's AdamW), or zero=dict(stage=3) "
               "in the config to shard the optimizer state",
    "HybridAdam": "use FusedAdam (torch's AdamW); ember's zero config shards the optimizer state",
    "Lars": "torch has no LARS: use Lamb, or torch.optim.SGD",
    "FusedLAMB_": "use Lamb",
})  # fmt: skip
