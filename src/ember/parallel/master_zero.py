"""ZeRO-1 with master weights: each data-parallel rank keeps the fp32 masters and optimizer state of its share.

With ``master_weights=True`` and ``zero=dict(stage=1)`` the parameters and gradients stay whole
(fp16/bf16, all-reduced by DDP), while :class:`~ember.amp.MasterWeights` keeps fp32 masters only
for the parameters this rank owns (:class:`~ember.amp.MasterShard`: the biggest first, each to the
least-loaded rank), steps them, and broadcasts the updated low-precision weights from their
owners. Per parameter that is 2 + 2 bytes of weights and gradients plus (4 + the optimizer's
state) / D, where ZeroRedundancyOptimizer over fp32 masters would keep all 4 bytes of masters on
every rank. What the Engine does differently is :class:`MasterShardPolicy`: the global gradient
norm sums the shards, and the full optimizer state is gathered on rank 0 (and split again on load).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.amp import MasterWeights, source_parameter
from ember.errors import EngineError
from ember.parallel.moe_policy import squared_norm
from ember.parallel.policy import DataParallelPolicy, with_full_optimizer_state


class MasterShardPolicy(DataParallelPolicy):
    """DDP with masters sharded over the data-parallel ranks (``zero=dict(stage=1)`` + ``master_weights``).

    ``state_dict`` gives the full model (fp32 masters) on every rank and the full optimizer
    state, in the one-process format, on rank 0 (``{}`` elsewhere); loading takes it on every
    rank or on rank 0 only.

    Args:
        ddp: the DDP wrapper.
        precision: the master-weights policy holding this rank's share.
    """

    name = "zero1 (sharded fp32 masters)"
    sharded_state = False

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, precision: MasterWeights) -> None:
        super().__init__(ddp)
        self.precision = precision
        self.group = ddp.process_group

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """Each rank holds the gradients of its masters: their squared norms are summed over the ranks."""
        squares = squared_norm([p.grad for p in params if p.grad is not None])
        dist.all_reduce(squares, group=self.group)
        total = squares.sqrt()
        nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        names = _model_names(model, self.precision)
        local = optimizer.state_dict()
        mine = [source_parameter(p) for group in optimizer.param_groups for p in group["params"]]
        named = {names[id(mine[int(i)])]: value for i, value in local["state"].items()}
        parts: list[Any] = [None] * dist.get_world_size(self.group)
        dist.gather_object(named, parts if distributed.rank() == 0 else None, dst=0, group=self.group)
        if distributed.rank() != 0:
            return model.state_dict(), {}
        index = {name: i for i, name in enumerate(self._full_order(names))}
        groups = [
            {**saved, "params": [index[names[id(p)]] for p in group]}
            for saved, group in zip(local["param_groups"], self.precision.group_params, strict=True)
        ]
        for group in groups:
            group.pop("param_names", None)
        state = {index[name]: value for part in parts for name, value in part.items()}
        return model.state_dict(), {"state": state, "param_groups": groups}

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        state = with_full_optimizer_state(state)
        model.load_state_dict(state["model"], strict=strict)
        names = _model_names(model, self.precision)
        order = self._full_order(names)
        full = state["optimizer"]
        if len(order) != sum(len(g["params"]) for g in full["param_groups"]):
            raise EngineError(
                f"the optimizer state holds {sum(len(g['params']) for g in full['param_groups'])} parameters, this "
                f"optimizer {len(order)}: load the state of the same model and optimizer"
            )
        local = optimizer.state_dict()
        mine = [names[id(source_parameter(p))] for group in optimizer.param_groups for p in group["params"]]
        position = {name: i for i, name in enumerate(mine)}
        states = {position[order[int(i)]]: v for i, v in full["state"].items() if order[int(i)] in position}
        groups = []
        for saved, group in zip(full["param_groups"], local["param_groups"], strict=True):
            mine_only = {k: group[k] for k in ("params", "param_names") if k in group}
            groups.append({**{k: v for k, v in saved.items() if k != "param_names"}, **mine_only})
        optimizer.load_state_dict({"state": states, "param_groups": groups})
        return state

    def _full_order(self, names: dict[int, str]) -> list[str]:
        """Every trained parameter's name, in the order of the optimizer before sharding."""
        return [names[id(p)] for group in self.precision.group_params for p in group]


def _model_names(model: nn.Module, precision: MasterWeights) -> dict[int, str]:
    """``id(parameter) -> name``; a trained parameter outside the model (a criterion's) by its position."""
    names = {id(p): name for name, p in model.named_parameters()}
    for i, p in enumerate(p for group in precision.group_params for p in group):
        names.setdefault(id(p), f"<parameter {i}>")
    return names
