"""Tiny models, data and loops shared by the parallel tests and their torchrun scripts.

Every multi-process check compares the Engine loop on N ranks with a one-process reference on
the same global batch: ``reference`` runs plain PyTorch, ``run_engine`` runs the Engine and
returns per-update losses averaged over the data-parallel ranks and micro-steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ember


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v projections; heads come from the tensors'
    shapes (``view(B, T, -1, head_dim)``), so tensor parallelism can split them."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln2, self.mlp = nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Two GPT-style blocks over (batch, 4 tokens, 8 features), mean-pooled into 4 classes."""

    def __init__(self, dim: int = 8, heads: int = 2, layers: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


class MeanPool(nn.Module):
    """Average over the token dimension (as a module, so a pipeline split can place it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class StackGPT(nn.Module):
    """A GPT-style stack whose forward is its children in order, as pipeline parallelism needs:
    ``embed``, ``blocks.0`` … ``blocks.3``, ``pool``, ``head``."""

    def __init__(self, dim: int = 8, heads: int = 2, layers: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.pool, self.head = MeanPool(), nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(x))


def stack_gpt(seed: int = 0, layers: int = 4) -> StackGPT:
    torch.manual_seed(seed)
    return StackGPT(layers=layers)


def tiny_gpt(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT()


def mlp(seed: int = 0) -> nn.Sequential:
    """The 8 -> 16 -> 4 MLP of tests.models, as Sequential(Linear, Tanh, Linear)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def dataset(n: int, tokens: int = 0, seed: int = 1) -> TensorDataset:
    """``n`` samples of 8 features (``tokens`` > 0: ``tokens`` x 8), labels 0-3 from a rule."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, tokens, 8, generator=g) if tokens else torch.randn(n, 8, generator=g)
    flat = x.mean(dim=1) if tokens else x
    return TensorDataset(x, (flat[:, 0] > 0).long() * 2 + (flat[:, 1] > 0).long())


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def adamw_groups(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with two param groups (weights, and biases with their own lr and no decay)."""
    named = list(model.named_parameters())
    weights = [p for n, p in named if not n.endswith("bias")]
    biases = [p for n, p in named if n.endswith("bias")]
    return torch.optim.AdamW([{"params": weights}, {"params": biases, "lr": 0.005, "weight_decay": 0.0}], lr=0.01)


def reference(
    model: nn.Module, make_opt: Callable[[nn.Module], torch.optim.Optimizer], ds: TensorDataset, batch: int,
    steps: int, clip: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One process, plain PyTorch: ``steps`` updates on batches of ``batch``."""
    opt = make_opt(model)
    losses, norms = [], []
    for i, (x, y) in enumerate(DataLoader(ds, batch_size=batch)):
        if i == steps:
            break
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            norms.append(nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        opt.step()
        losses.append(loss.item())
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "losses": losses, "norms": norms}


def run_engine(engine: ember.Engine, loader: DataLoader, steps: int, scheduler: Any = None) -> dict[str, Any]:
    """The Engine loop until ``steps`` updates (stepping ``scheduler`` after each); losses are the
    global-batch means of each update."""
    losses, norms, cycle = [], [], []
    for x, y in loader:
        engine.zero_grad()
        loss = engine.criterion(engine(x), y)
        engine.backward(loss)
        cycle.append(loss.detach())
        if engine.step():
            if scheduler is not None:
                scheduler.step()
            losses.append(global_mean(torch.stack(cycle).mean()))
            if engine.last_grad_norm is not None:
                norms.append(float(engine.last_grad_norm))
            cycle = []
        if len(losses) == steps:
            break
    return {"losses": losses, "norms": norms}


def global_mean(value: torch.Tensor) -> float:
    """Mean over every rank (tensor-parallel ranks hold equal values, so this is the mean over
    the data-parallel ranks, i.e. the loss of the global batch)."""
    t = value.detach().float().clone()
    if dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    assert list(a) == list(b), (list(a), list(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def optimizer_state_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest difference between the tensors of two optimizer state dicts (same format)."""
    assert sorted(a["state"]) == sorted(b["state"]), (sorted(a["state"]), sorted(b["state"]))
    diffs = [
        (va.float() - b["state"][k][name].float()).abs().max().item()
        for k, entry in a["state"].items()
        for name, va in entry.items()
        if isinstance(va, torch.Tensor) and va.dim() > 0
    ]
    return max(diffs)
