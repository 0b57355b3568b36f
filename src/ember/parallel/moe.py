"""Mixture of experts: top-1/top-2 routing with a capacity, experts placed on ranks, tokens moved all-to-all.

A :class:`MoE` layer stands where a transformer block's feed-forward network would::

    self.ffn = MoE(d_model=64, num_experts=8, expert=lambda: FeedForward(64, 256), router=Router(k=2))

Each token's gate scores pick ``k`` experts (Switch Transformer: top-1; GShard: top-2). Every
expert takes at most ``capacity = max(min_capacity, ceil(k · capacity_factor · tokens / experts))``
tokens of a batch; a choice past that is *dropped* (the token gets nothing from that expert, the
model's residual connection carries it), counted and reported. The load-balancing loss
``E · Σ_e f_e · P_e`` (``f_e`` the fraction of tokens whose first choice is expert ``e``, ``P_e``
its mean gate probability) is added to the training loss by the Engine, weighted by
``aux_loss_weight`` (see :class:`MoEStats`).

Under expert parallelism (config ``parallel.expert = P``) the ``num_experts`` experts are split
over the P ranks of the ``expert`` group, ``num_experts / P`` on each; each rank routes its own
tokens, sends every expert its tokens with one all-to-all and gets the results back with a second.
Expert parameters carry the global index in their names (``ffn.experts.5.fc1.weight``), so a full
state dict is the one-process model's. The layer reads the launched layout when it is built (as
Colossal-AI's do): build the model after ``ember.launch``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ember import context as _context
from ember.errors import ConfigError, EngineError
from ember.layout import ParallelLayout

__all__ = ["EXPERT_TAG", "Experts", "MoE", "MoEStats", "Router", "is_expert"]

EXPERT_TAG = "ember_expert"
"""The attribute set (True) on every expert parameter: it is reduced over its own group, not the data group."""

NOISE = ("jitter", "gaussian")
MAX_PENDING = 1024
"""Training forwards whose balance losses a layer keeps for the next backward before it refuses more."""


def is_expert(param: torch.Tensor) -> bool:
    """Whether ``param`` belongs to an expert (see :data:`EXPERT_TAG`)."""
    return bool(getattr(param, EXPERT_TAG, False))


class Router(nn.Module):
    """How tokens choose experts: top-``k`` of the gate's softmax, each expert holding ``capacity`` tokens.

    It has no parameters (the gate's weight is the :class:`MoE` layer's), so one router may
    serve several layers, as in Colossal-AI.

    Args:
        k: experts per token, 1 (Switch Transformer) or 2 (GShard).
        capacity_factor: slack over an even split while training (``capacity`` above).
        eval_capacity_factor: the same in evaluation.
        min_capacity: the smallest capacity.
        noise: ``None``, ``"jitter"`` (multiply the logits by U(1-ε, 1+ε), Switch Transformer),
            ``"gaussian"`` (add N(0, 1/E²), Colossal-AI's ``NormalNoiseGenerator``), or a callable
            from logits to noisy logits; training only.
        noise_eps: ε of the jitter.
        normalize: scale a token's ``k`` gate weights to sum to 1 (GShard); default: for k=2.
        drop_tokens: in evaluation, False gives every expert room for all its tokens (no drops).

    Example:
        >>> router = Router(k=2, capacity_factor=1.0)
        >>> router.capacity(tokens=64, experts=8)
        16
    """

    def __init__(
        self,
        k: int = 1,
        capacity_factor: float = 1.25,
        eval_capacity_factor: float = 2.0,
        min_capacity: int = 4,
        noise: str | Callable[[torch.Tensor], torch.Tensor] | None = None,
        noise_eps: float = 1e-2,
        normalize: bool | None = None,
        drop_tokens: bool = True,
    ) -> None:
        super().__init__()
        if k not in (1, 2):
            raise ConfigError(f"Router(k={k!r}): ember routes each token to 1 (Switch) or 2 (GShard) experts")
        for name, value in (("capacity_factor", capacity_factor), ("eval_capacity_factor", eval_capacity_factor)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"Router({name}={value!r}) must be a number > 0 (1.0: room for an even split)")
        if not isinstance(min_capacity, int) or isinstance(min_capacity, bool) or min_capacity < 1:
            raise ConfigError(f"Router(min_capacity={min_capacity!r}) must be an int >= 1")
        if not (isinstance(noise_eps, (int, float)) and 0 <= noise_eps < 1):
            raise ConfigError(f"Router(noise_eps={noise_eps!r}) must be a number from 0 to 1 (excluded)")
        if noise is not None and not callable(noise) and noise not in NOISE:
            raise ConfigError(f"Router(noise={noise!r}): use None, 'jitter', 'gaussian' or a callable on the logits")
        self.k = k
        self.capacity_factor, self.eval_capacity_factor = float(capacity_factor), float(eval_capacity_factor)
        self.min_capacity, self.noise, self.noise_eps = min_capacity, noise, noise_eps
        self.normalize = k > 1 if normalize is None else normalize
        self.drop_tokens = drop_tokens

    def capacity(self, tokens: int, experts: int, counts: torch.Tensor | None = None) -> int:
        """Tokens each expert takes: ``max(min_capacity, ceil(k · factor · tokens / experts))``; in
        evaluation without ``drop_tokens``, the largest number of tokens any expert was chosen by
        (``counts``, per expert)."""
        if not self.training and not self.drop_tokens and counts is not None:
            return max(int(counts.max()), 1)
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return max(self.min_capacity, math.ceil(self.k * factor * tokens / experts))

    def choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(probabilities [S, E], choices [S, k], load-balancing loss)`` for fp32 gate ``logits``."""
        if self.training and callable(self.noise):
            logits = self.noise(logits)
        elif self.training and self.noise == "jitter":
            logits = logits * torch.empty_like(logits).uniform_(1 - self.noise_eps, 1 + self.noise_eps)
        elif self.training and self.noise == "gaussian":
            logits = logits + torch.randn_like(logits) / logits.shape[-1] ** 2
        probs = torch.softmax(logits, dim=-1)
        choices = torch.topk(probs, self.k, dim=-1, sorted=True).indices
        return probs, choices, self.balance_loss(probs, choices)

    def balance_loss(self, probs: torch.Tensor, choices: torch.Tensor) -> torch.Tensor:
        """Switch Transformer's ``E · Σ_e f_e · P_e`` over the first choices."""
        experts = probs.shape[-1]
        first = F.one_hot(choices[:, 0], experts).to(probs.dtype)
        return experts * torch.sum(first.mean(0) * probs.mean(0))

    def extra_repr(self) -> str:
        return f"k={self.k}, capacity_factor={self.capacity_factor}, noise={self.noise}"


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with equal splits; its gradient is the same exchange backwards."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def _layout(layout: ParallelLayout | None) -> ParallelLayout:
    return layout if layout is not None else _context.get_context(default=True).layout


class Experts(nn.ModuleDict):
    """The experts this rank holds, keyed by their global index, and the exchange of tokens with the others.

    Args:
        expert: builds one expert (a module from ``[tokens, d_model]`` to ``[tokens, d_model]``).
        num_experts: experts in all, over every rank of the ``expert`` group.
        layout: the layout whose ``expert`` group splits them (default: the launched one).

    Raises:
        ConfigError: ``num_experts`` is not a multiple of the expert-parallel size.

    Example:
        >>> experts = Experts(lambda: nn.Linear(8, 8), num_experts=4)   # parallel.expert = 2: two per rank
        >>> sorted(experts)                                             # on the second rank
        ['2', '3']
    """

    def __init__(self, expert: Callable[[], nn.Module], num_experts: int, layout: ParallelLayout | None = None) -> None:
        if not callable(expert):
            raise ConfigError(f"Experts(expert={expert!r}) must build an expert: a callable returning an nn.Module")
        if layout is not None and not isinstance(layout, ParallelLayout):
            raise ConfigError(f"Experts(layout={layout!r}) must be an ember.layout.ParallelLayout or None")
        layout = _layout(layout)
        size = layout.expert
        if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1 or num_experts % size:
            fits = [n for n in range(size, 4 * size + 1, size)]
            raise ConfigError(
                f"{num_experts!r} experts cannot be split evenly over parallel.expert={size} ranks: use a multiple "
                f"of {size} experts ({', '.join(map(str, fits))}, ...), or a parallel.expert that divides {num_experts}"
            )
        local = num_experts // size
        rank = _context.get_context(default=True).rank
        index = layout.coords(rank)["expert"] if layout.world_size > 1 and size > 1 else 0
        built = {str(index * local + j): expert() for j in range(local)}
        wrong = next((m for m in built.values() if not isinstance(m, nn.Module)), None)
        if wrong is not None:
            raise ConfigError(f"Experts(expert=...) built a {type(wrong).__name__}, not an nn.Module")
        super().__init__(built)
        for param in self.parameters():
            setattr(param, EXPERT_TAG, True)
        self.layout, self.num_experts, self.num_local, self.index = layout, num_experts, local, index
        self.group = _context.get_group("expert", layout) if size > 1 and layout.world_size > 1 else None

    @property
    def first(self) -> int:
        """The global index of this rank's first expert."""
        return self.index * self.num_local

    def forward(self, dispatched: torch.Tensor) -> torch.Tensor:
        """Run every expert on its tokens: ``[experts, capacity, d]`` in, the same shape out.

        The input holds this rank's tokens for all experts; under expert parallelism each rank's
        experts get their tokens from every rank of the group and send the results back.
        """
        if self.group is None:
            return torch.stack([module(dispatched[i]) for i, module in enumerate(self.values())])
        size, local, capacity = self.layout.expert, self.num_local, dispatched.shape[1]
        received = _AllToAll.apply(dispatched, self.group)  # [rank it came from, local expert, capacity, d]
        mine = received.view(size, local, capacity, -1).transpose(0, 1).reshape(local, size * capacity, -1)
        out = torch.stack([module(mine[i]) for i, module in enumerate(self.values())])
        out = out.view(local, size, capacity, -1).transpose(0, 1).reshape(size * local, capacity, -1)
        return _AllToAll.apply(out.contiguous(), self.group)


@dataclass
class Assignment:
    """Where one forward pass sent its tokens (kept for inspection: ``layer.last_assignment``).

    Attributes:
        choices: ``[tokens, k]`` the experts each token chose, best first.
        kept: ``[tokens, k]`` whether the choice fitted in the expert's capacity.
        capacity: tokens per expert.
    """

    choices: torch.Tensor
    kept: torch.Tensor
    capacity: int


class MoE(nn.Module):
    """A mixture-of-experts layer: a gate, a :class:`Router` and :class:`Experts`; ``[..., d_model]`` in and out.

    Args:
        d_model: the width of a token.
        num_experts: experts in all (a multiple of ``parallel.expert``).
        expert: builds one expert, e.g. ``lambda: nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))``;
            or the :class:`Experts` themselves, built already.
        router: the routing rule (default: ``Router(k=1)``).
        aux_loss_weight: the weight of the load-balancing loss the Engine adds to the training
            loss (0: add none; the loss is still computed for :attr:`aux_loss`).
        layout: the layout whose ``expert`` group holds the experts (default: the launched one).
        check_finite: raise on a non-finite gate logit (one small reduction per forward pass
            across the data-parallel ranks, so that every rank raises, none waits).

    Example:
        >>> layer = MoE(16, 4, lambda: nn.Linear(16, 16), Router(k=2, capacity_factor=1.0))
        >>> layer(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """

    def __init__(
        self,
        d_model: int,
        num_experts: int,
        expert: Callable[[], nn.Module] | Experts,
        router: Router | None = None,
        *,
        aux_loss_weight: float = 0.01,
        layout: ParallelLayout | None = None,
        check_finite: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("num_experts", num_experts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"MoE({name}={value!r}) must be an int >= 1")
        if router is not None and not isinstance(router, Router):
            raise ConfigError(f"MoE(router={router!r}) must be an ember.parallel.moe.Router (Router(k=1) or k=2)")
        if not (isinstance(aux_loss_weight, (int, float)) and math.isfinite(aux_loss_weight) and aux_loss_weight >= 0):
            raise ConfigError(f"MoE(aux_loss_weight={aux_loss_weight!r}) must be a finite number >= 0")
        self.d_model, self.num_experts = d_model, num_experts
        self.gate = nn.Linear(d_model, num_experts, bias=False)
        self.router = router if router is not None else Router()
        self.experts = expert if isinstance(expert, Experts) else Experts(expert, num_experts, layout)
        if self.experts.num_experts != num_experts:
            raise ConfigError(f"MoE(num_experts={num_experts}) was given Experts of {self.experts.num_experts}")
        self.aux_loss_weight, self.check_finite = float(aux_loss_weight), check_finite
        layout = self.experts.layout
        self._agree_group = _context.get_group("data", layout) if layout.world_size > 1 and layout.data > 1 else None
        self.aux_loss: torch.Tensor | None = None
        """The last forward's load-balancing loss (unweighted)."""
        self.last_assignment: Assignment | None = None
        """Where the last forward pass sent its tokens."""
        self._pending: list[tuple[torch.Tensor | None, torch.Tensor, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route, dispatch, run the experts, combine: the output has ``x``'s shape."""
        if x.dim() == 0 or x.shape[-1] != self.d_model or not x.is_floating_point():
            raise EngineError(
                f"MoE(d_model={self.d_model}) takes floating-point tokens [..., {self.d_model}], got a {x.dtype} "
                f"tensor of shape {tuple(x.shape)}"
            )
        tokens = x.reshape(-1, self.d_model)
        with torch.autocast(x.device.type, enabled=False):  # routing decisions in fp32, whatever the AMP
            logits = F.linear(tokens.float(), self.gate.weight.float())
        experts, k = self.num_experts, self.router.k
        probs, choices, aux = self.router.choose(logits)
        counts = torch.bincount(choices.reshape(-1), minlength=experts)
        capacity = self._agree(self.router.capacity(tokens.shape[0], experts, counts), logits)
        # Slots: each expert's tokens in token order, first choices before second choices (GShard).
        masks = F.one_hot(choices.t(), experts)  # [k, S, E]
        slots = torch.cumsum(masks.reshape(-1, experts), dim=0).view(k, -1, experts) - 1
        slot = (slots * masks).sum(-1)  # [k, S]
        kept = slot < capacity
        weights = probs.gather(1, choices)  # [S, k]
        if self.router.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        token = torch.arange(tokens.shape[0], device=x.device).repeat(k)[kept.reshape(-1)]
        place = (choices.t() * capacity + slot).reshape(-1)[kept.reshape(-1)]
        dispatched = tokens.new_zeros(experts * capacity, self.d_model).index_copy(0, place, tokens[token])
        out = self.experts(dispatched.view(experts, capacity, self.d_model)).view(experts * capacity, -1)
        weight = weights.t().reshape(-1)[kept.reshape(-1)].to(out.dtype)
        combined = out.new_zeros(tokens.shape[0], out.shape[-1]).index_add(0, token, out[place] * weight[:, None])
        self.last_assignment = Assignment(choices.detach(), kept.t().detach(), capacity)
        self.aux_loss = aux
        if self.training and torch.is_grad_enabled():
            self._remember(aux * self.aux_loss_weight if self.aux_loss_weight else None, (~kept).sum(), kept.numel())
        return combined.view(*x.shape[:-1], out.shape[-1])

    def _agree(self, capacity: int, logits: torch.Tensor) -> int:
        """The capacity every rank uses (the largest), after checking every rank's logits are finite."""
        bad = bool(self.check_finite) and not bool(torch.isfinite(logits).all())
        if self._agree_group is not None:
            both = torch.tensor([int(bad), capacity], dtype=torch.int64)
            if dist.get_backend(self._agree_group) == "nccl":
                both = both.to(logits.device)
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self._agree_group)
            bad, capacity = bool(both[0]), int(both[1])
        if bad:
            raise EngineError(
                f"a MoE layer's gate produced non-finite logits (NaN or inf) on at least one rank, for "
                f"{logits.shape[0]} tokens here: its input or the gate weight is not finite (look for a diverging "
                "loss or a bad input batch; lower the learning rate or clip gradients)"
            )
        return capacity

    def _remember(self, weighted: torch.Tensor | None, dropped: torch.Tensor, choices: int) -> None:
        """Keep a training forward's weighted loss and counts until the next backward collects them."""
        if len(self._pending) >= MAX_PENDING:
            if any(w is not None for w, _, _ in self._pending):
                raise EngineError(
                    f"a MoE layer's load-balancing losses of {MAX_PENDING} training forwards were never collected "
                    "(each holds its forward's graph): back-propagate with engine.backward(loss), collect them with "
                    "ember.parallel.moe.MoEStats.of(model).pop(), or build the layer with aux_loss_weight=0"
                )
            del self._pending[0]  # counts alone, for the log: the oldest go
        self._pending.append((weighted, dropped, choices))

    def pop_auxiliary(self) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, int]]]:
        """The weighted load-balancing losses and ``(dropped, choices)`` counts since the last pop."""
        pending, self._pending = self._pending, []
        return [w for w, _, _ in pending if w is not None], [(d, n) for _, d, n in pending]

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_experts={self.num_experts}, aux_loss_weight={self.aux_loss_weight}"


class MoEStats:
    """The MoE layers of a model and what their training forwards left: the Engine's view of them.

    ``engine.backward(loss)`` adds :meth:`pop`'s loss (every layer's weighted load-balancing
    loss since the last backward) to ``loss`` and publishes ``moe/aux_loss`` (that sum) and
    ``moe/dropped_fraction`` (choices past an expert's capacity, over all choices, on this rank)
    in ``engine.step_scalars``, which the Trainer puts in its step storage. A loop without the
    Engine calls :meth:`pop` itself (a layer refuses to keep more than ``MAX_PENDING``
    uncollected weighted losses, each holding its forward's graph).

    Example:
        >>> stats = MoEStats.of(model)
        >>> loss = criterion(model(x), y)
        >>> extra, scalars = stats.pop(); (loss + extra).backward()
    """

    def __init__(self, layers: list[MoE]) -> None:
        self.layers = layers

    @classmethod
    def of(cls, model: nn.Module) -> MoEStats | None:
        """The stats of ``model``'s MoE layers, or None when it has none."""
        layers = [m for m in model.modules() if isinstance(m, MoE)]
        return cls(layers) if layers else None

    def pop(self) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """``(weighted aux loss or None, scalars)`` of the forwards since the last pop."""
        losses: list[torch.Tensor] = []
        dropped: list[torch.Tensor] = []
        choices = 0
        for layer in self.layers:
            weighted, counts = layer.pop_auxiliary()
            losses += weighted
            dropped += [d for d, _ in counts]
            choices += sum(n for _, n in counts)
        scalars: dict[str, torch.Tensor] = {}
        total = torch.stack(losses).sum() if losses else None
        if total is not None:
            scalars["moe/aux_loss"] = total.detach()
        if choices:
            scalars["moe/dropped_fraction"] = torch.stack(dropped).sum().float() / choices
        return total, scalars

    def clear(self) -> None:
        """Forget what forwards left (``engine.reset_accumulation()`` drops an open cycle)."""
        for layer in self.layers:
            layer.pop_auxiliary()


def experts_modules(model: nn.Module) -> Iterator[tuple[str, Experts]]:
    """``(name, module)`` of every :class:`Experts` in ``model``."""
    for name, module in model.named_modules():
        if isinstance(module, Experts):
            yield name, module
