"""Expert parallelism's policy: gradients reduced over two groups, clipping over experts once, full state gathered.

Under ``parallel.expert = P`` (a split of the ``D`` data-parallel replicas into ``D / P`` replicas
of P ranks that hold different experts, see :mod:`ember.layout`), DDP cannot run the model: it
would average every gradient over all D ranks, experts included, and torch keeps its list of
parameters to skip private. The :class:`ExpertParallelPolicy` reduces by hand instead, once per
accumulation cycle, at the end of the backward that closes it:

* every other parameter: summed over the ``data`` group, divided by D;
* an expert's parameters: already summed over the tokens of its P-rank group by the backward
  all-to-all, summed over the ``expert_data`` group (the replicas of the same expert), divided by D.

Both equal what one process computes on the whole batch. Gradients a rank lacks (an unused
parameter) count as zeros, and a parameter no rank has a gradient for keeps none. The reductions
do not overlap the backward pass as DDP's buckets do: that costs time, measured in
``benchmarks/moe_traffic.py`` (docs/parallel.md). Buffers (BatchNorm statistics) are not synchronised.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import context as _context
from ember import distributed
from ember.amp import source_parameter
from ember.errors import ConfigError, EngineError
from ember.layout import ParallelLayout
from ember.parallel.moe import Experts, experts_modules, is_expert
from ember.parallel.policy import ParallelPolicy

_BUCKET_BYTES = 32 * 2**20


class ExpertParallelPolicy(ParallelPolicy):
    """The Engine's policy under expert parallelism (``parallel.expert > 1``).

    ``engine.state_dict()`` is a collective: rank 0 gets the full model and optimizer state in
    the one-process format (every expert, by its global index), the other ranks ``{}``.

    Args:
        model: the model, its MoE layers built for ``layout``.
        layout: the Engine's layout.
    """

    sharded_state = False
    keeps_partial_grads = False  # each rank's open cycle differs (its own experts and tokens): save at a boundary

    def __init__(self, model: nn.Module, layout: ParallelLayout) -> None:
        self.model, self.layout = model, layout
        self.name = f"expert parallel ×{layout.expert} × {layout.data // layout.expert} expert-data replicas"
        self.data_group = _context.get_group("data", layout)
        self.expert_group = _context.get_group("expert", layout)
        self.expert_data_group = _context.get_group("expert_data", layout)
        self.experts = dict(experts_modules(model))
        coords = layout.coords(_context.get_context(default=True).rank)
        self.gathers = coords["expert_data"] == 0  # this rank's expert group is rank 0's: it gathers state

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        yield
        if enabled:
            self.sync_gradients()

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Reduce the accumulated gradients: every parameter over its group, divided by the replicas."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        dense = [p for p in params if not is_expert(p)]
        expert = [p for p in params if is_expert(p)]
        _reduce(dense, self.data_group, self.layout.data)
        _reduce(expert, self.expert_data_group, self.layout.data)

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """The norm of every gradient counted once: the replicated ones here, the experts summed over the group."""
        dense = [p.grad for p in params if p.grad is not None and not is_expert(p)]
        expert = [p.grad for p in params if p.grad is not None and is_expert(p)]
        squares = squared_norm(expert)
        if self.expert_group is not None:
            dist.all_reduce(squares, group=self.expert_group)
        total = (squares + squared_norm(dense).to(squares.device)).sqrt()
        nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        local_model = model.state_dict()
        names = _names(model, optimizer)
        local_optim = optimizer.state_dict()
        named_state = {names[i]: v for i, v in local_optim["state"].items()}
        named_groups = [[names[i] for i in g["params"]] for g in local_optim["param_groups"]]
        if not self.gathers:
            return {}, {}
        parts: list[Any] = [None] * self.layout.expert
        dist.gather_object(
            (local_model, named_state), parts if distributed.rank() == 0 else None, dst=0, group=self.expert_group
        )
        if distributed.rank() != 0:
            return {}, {}
        full_model: dict[str, Any] = {}
        for name in self._global_order(list(local_model)):
            full_model[name] = next(part[0][name] for part in parts if name in part[0])
        full_state = {name: s for _, state in parts for name, s in state.items()}
        order = [self._global_order(group) for group in named_groups]
        index = {name: i for i, name in enumerate(n for group in order for n in group)}
        param_groups = []
        for group, names_in_group in zip(local_optim["param_groups"], order, strict=True):
            param_groups.append({**group, "params": [index[n] for n in names_in_group]})
        return full_model, {"state": {index[n]: s for n, s in full_state.items()}, "param_groups": param_groups}

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        if distributed.any_true(not state["model"]):  # rank 0's state, sent to all
            state = distributed.broadcast_object(state if distributed.rank() == 0 else None)
        local_keys = set(model.state_dict())
        theirs = [k for k in state["model"] if k not in local_keys and not self._expert_key(k)]
        if strict and theirs:
            raise EngineError(f"the model state has keys this model does not have: {', '.join(theirs[:5])}")
        model.load_state_dict({k: v for k, v in state["model"].items() if k in local_keys}, strict=strict)
        names = _names(model, optimizer)
        local = optimizer.state_dict()
        groups = [[names[i] for i in g["params"]] for g in local["param_groups"]]
        order = [n for group in groups for n in self._global_order(group)]
        if len(order) != sum(len(g["params"]) for g in state["optimizer"]["param_groups"]):
            raise EngineError(
                f"the optimizer state holds {sum(len(g['params']) for g in state['optimizer']['param_groups'])} "
                f"parameters, this model under expert parallelism {len(order)} in all: load the state of the same "
                "model and optimizer"
            )
        by_name = {order[int(i)]: s for i, s in state["optimizer"]["state"].items()}
        position = {name: i for i, name in enumerate(n for g in groups for n in g)}
        mine = {position[n]: s for n, s in by_name.items() if n in position}
        param_groups = [
            {**saved, "params": g["params"]}
            for saved, g in zip(state["optimizer"]["param_groups"], local["param_groups"], strict=True)
        ]
        optimizer.load_state_dict({"state": mine, "param_groups": param_groups})
        return state

    def _expert_key(self, key: str) -> tuple[str, int, str] | None:
        """``(experts module, global index, rest)`` of an expert's state key, else None."""
        for prefix in self.experts:
            match = re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.(.+)", key)
            if match:
                return prefix, int(match[1]), match[2]
        return None

    def _global_order(self, names: list[str]) -> list[str]:
        """``names`` (this rank's, in order) with each experts module's block widened to every
        rank's experts in global order: the one-process model's order."""
        out: list[str] = []
        done: set[str] = set()
        for name in names:
            key = self._expert_key(name)
            if key is None:
                out.append(name)
                continue
            prefix = key[0]
            if prefix in done:
                continue
            done.add(prefix)
            experts: Experts = self.experts[prefix]
            block = [k for k in map(self._expert_key, names) if k is not None and k[0] == prefix]
            for rank in range(self.layout.expert):
                shift = (rank - experts.index) * experts.num_local
                out += [f"{prefix}.{index + shift}.{rest}" for _, index, rest in block]
        return out


def check_expert_parallel(model: nn.Module, layout: ParallelLayout, zero_stage: int) -> None:
    """Raise ConfigError for what expert parallelism does not run with, or experts built for another layout.

    Called by :func:`~ember.parallel.strategy.check_parallel` before any collective.
    """
    clash = {
        "parallel.tensor.size": layout.tensor,
        "parallel.pipeline.size": layout.pipeline,
        "parallel.context": layout.context,
        "zero.stage": zero_stage,
    }
    with_it = [f"{key}={value}" for key, value in clash.items() if value > (0 if key == "zero.stage" else 1)]
    if layout.expert > 1 and with_it:
        raise ConfigError(
            f"config parallel.expert={layout.expert} cannot be combined with {', '.join(with_it)} in this ember "
            "version: expert parallelism runs over data parallelism only (parallel.data, split into expert groups), "
            "with master_weights and any amp"
        )
    found = list(experts_modules(model))
    if layout.expert > 1 and not found:
        raise ConfigError(
            f"config parallel.expert={layout.expert} but the model has no ember MoE layer "
            "(ember.parallel.moe.MoE, or Colossal-AI's MoeLayer through the compat): add one, or remove parallel.expert"
        )
    for name, experts in found:
        if experts.layout.expert != layout.expert or (layout.expert > 1 and experts.layout != layout):
            raise ConfigError(
                f"the MoE layer {name or 'model'} was built for parallel.expert={experts.layout.expert}, but this "
                f"Engine's config has parallel.expert={layout.expert}: build the model after ember.launch with the "
                "same config (MoE layers read the launched layout), or pass MoE(..., layout=...)"
            )


@torch.no_grad()
def sync_replicas(model: nn.Module, layout: ParallelLayout) -> None:
    """Make replicas equal: every other tensor from data rank 0, each expert from its first replica."""
    experts = _context.get_group("expert_data", layout) if layout.expert > 1 else _context.get_group("data", layout)
    groups = {False: _context.get_group("data", layout), True: experts}
    names = dict.fromkeys(n for n, _ in experts_modules(model))
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        expert = is_expert(tensor) or any(name.startswith(f"{prefix}.") for prefix in names)
        group = groups[expert]
        if group is not None:
            dist.broadcast(tensor.data, src=dist.get_global_rank(group, 0), group=group)


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """The optimizer's state positions -> parameter names (an fp32 master named as its model
    parameter; a parameter outside the model, a criterion's, by its position)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: by_id.get(id(source_parameter(p)), f"<parameter {i}>") for i, p in enumerate(params)}


def _reduce(params: list[nn.Parameter], group: Any, divisor: int) -> None:
    """Sum the gradients over ``group`` (None: nothing to sum) and divide by ``divisor``, in buckets.

    A missing gradient counts as zeros; a count per parameter, reduced along, tells which ones
    no rank had (they stay None).
    """
    if group is None and divisor == 1:
        return
    for bucket in _buckets(params):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        had = torch.tensor([p.grad is not None for p in bucket], dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [had])
        if group is not None:
            dist.all_reduce(flat, group=group)
        flat[: -len(bucket)].div_(divisor)
        offset = 0
        for p, g, count in zip(bucket, grads, flat[-len(bucket) :].tolist(), strict=True):
            value = flat[offset : offset + g.numel()].view_as(g)
            offset += g.numel()
            p.grad = value if count else None  # a view of the bucket: no copy


def _buckets(params: list[nn.Parameter]) -> Iterator[list[nn.Parameter]]:
    """Consecutive runs of parameters of one dtype and device, up to 32 MiB each."""
    bucket: list[nn.Parameter] = []
    size = 0
    for p in params:
        if bucket and (p.dtype != bucket[0].dtype or p.device != bucket[0].device or size >= _BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel() * p.element_size()
    if bucket:
        yield bucket


def squared_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The squared 2-norm of ``grads`` together, in fp32, on the device collectives use (0 for none)."""
    if not grads:
        return torch.zeros((), dtype=torch.float32, device=distributed.collective_device())
    return nn.utils.get_total_norm(grads, norm_type=2.0).float().square().to(distributed.collective_device())
