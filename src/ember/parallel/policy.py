"""Parallel policies: what the Engine's one step does differently per kind of parallelism.

The Engine calls the same few things whatever runs underneath:

* :meth:`ParallelPolicy.gradient_sync` around ``backward`` (DDP's ``no_sync`` / FSDP2's
  ``set_requires_gradient_sync(False)`` on the non-boundary micro-steps of accumulation);
* :meth:`ParallelPolicy.clip_grad_norm_` (a global norm, also over sharded gradients);
* :meth:`ParallelPolicy.state_dicts` / :meth:`ParallelPolicy.load` (full, unsharded model and
  optimizer state; collectives under ZeRO and FSDP2/TP, so every rank calls them). ``load``
  takes the full state on every rank, or on rank 0 only with ``{}`` in its place elsewhere;
* :meth:`ParallelPolicy.sharded_state_dicts` (``torch.distributed.checkpoint``'s format: each
  rank's own shards, for sharded checkpoints), which ``load`` takes back when the state says
  ``"sharded": True``. Not under ZeRO-1 or pipeline parallelism (``sharded_state = False``).
  A policy's own way of loading the full state is its :meth:`ParallelPolicy.load_full`.

===================  ============================  ===========================================
policy               built for                     state_dict on rank 0 / on other ranks
===================  ============================  ===========================================
ParallelPolicy       one process                   full / –
DataParallelPolicy   DDP (world > 1)               full / full
ZeroPolicy           DDP + ZeroRedundancyOptimizer full model and optimizer / full model, ``{}``
ShardedPolicy        FSDP2 and/or tensor parallel  full model and optimizer / ``{}``, ``{}``
===================  ============================  ===========================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.errors import EngineError
from ember.logging import get_dist_logger
from ember.parallel.ddp import LateParameters, reduced_parameters, rewrap_data_parallel


class ParallelPolicy:
    """One process, or a model that needs no gradient synchronisation: plain PyTorch."""

    name = "none"
    """What was built, e.g. ``"ddp"`` or ``"tensor parallel ×2 + FSDP2 zero stage 3 ×2"``."""
    keeps_partial_grads = True
    """Whether ``engine.state_dict()`` can carry the gradients of an open accumulation cycle."""
    batch_schedule: Any = None
    """How a training batch runs under this parallelism when forward, loss and backward in turn
    cannot: the pipeline's :class:`~ember.parallel.pipeline_schedule.PipelineSchedule` (a
    Trainer schedule), else None. ``engine.schedule`` reads it."""
    sharded_state = True
    """Whether it saves and loads ``torch.distributed.checkpoint``'s sharded state (not under
    ZeRO-1 or pipeline parallelism: :meth:`sharded_state_dicts` and a sharded :meth:`load`
    raise :func:`refuse_sharded`'s error)."""

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """The context ``backward`` runs in; ``enabled`` is False on non-boundary micro-steps."""
        yield

    def forward_without_sync(self) -> contextlib.AbstractContextManager[None] | None:
        """The context a training forward runs in when its backward must not synchronise.

        None when the synchronisation is decided at backward time (the default). DDP decides it
        in the forward pass: see :class:`DataParallelPolicy`.
        """
        return None

    def sync_gradients_now(self, params: list[nn.Parameter]) -> None:
        """Average the gradients over the replicas by hand: for a cycle closed at a backward
        whose forward ran under :meth:`forward_without_sync`."""

    trainable_changed = False
    """True when the training module must be rebuilt before the next forward, because the set
    of trainable parameters changed (DDP): the Engine then calls :meth:`follow_trainable`."""

    def follow_trainable(self) -> nn.Module:
        """Rebuild what the training forward runs through for the current trainable parameters
        and return it; called only when :attr:`trainable_changed`."""
        raise NotImplementedError(f"{self.name} follows its trainable parameters by itself")

    def finish_backward(self, boundary: bool, forward_unsynced: bool, params: list[nn.Parameter]) -> None:
        """Called after every ``backward``: ``boundary`` when it closed the accumulation cycle,
        ``forward_unsynced`` when its forward ran under :meth:`forward_without_sync` (then the
        gradients are averaged here, by :meth:`sync_gradients_now`)."""
        if boundary and forward_unsynced:
            self.sync_gradients_now(params)

    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """Clip the gradients in place to a global 2-norm of ``max_norm``; return the norm before."""
        return nn.utils.clip_grad_norm_(params, max_norm)

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's and the optimizer's state, unsharded (model keys without wrapper prefixes)."""
        return model.state_dict(), optimizer.state_dict()

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        """Load ``state["model"]`` and ``state["optimizer"]``: full, as :meth:`state_dicts` gives
        them (:meth:`load_full`), or sharded when ``state["sharded"]`` (refused without
        :attr:`sharded_state`).

        Returns:
            The state whose other entries (scaler, counters) the Engine restores: ``state``
            itself, or rank 0's when the tensors came from rank 0.
        """
        if state.get("sharded"):
            if not self.sharded_state:
                raise refuse_sharded(self)
            _set_sharded(model, optimizer, state, strict)
            return state
        return self.load_full(model, optimizer, state, strict)

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        """:meth:`load` of the full (unsharded) state; returns what :meth:`load` returns."""
        model.load_state_dict(state["model"], strict=strict)
        optimizer.load_state_dict(state["optimizer"])
        return state

    def sharded_state_dicts(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's and the optimizer's state as ``torch.distributed.checkpoint`` saves and loads it.

        Keyed by parameter name (the optimizer's too); under FSDP2/tensor parallelism each rank
        holds its own shards (DTensors), otherwise whole tensors. ``dcp.save`` writes it;
        ``dcp.load`` fills it in place, resharding into this layout, and :meth:`load` with
        ``{"model": ..., "optimizer": ..., "sharded": True}`` applies it. A collective under
        FSDP2/TP; fresh optimizers get their state initialised so that there is a slot to load into.
        Refused without :attr:`sharded_state`.
        """
        if not self.sharded_state:
            raise refuse_sharded(self)
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(model, optimizer)


def _set_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool) -> None:
    """Apply what :meth:`ParallelPolicy.sharded_state_dicts` returned (after ``dcp.load`` filled it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=strict),
    )


def refuse_sharded(policy: ParallelPolicy) -> EngineError:
    """The error for a layout that cannot take ``torch.distributed.checkpoint``'s sharded state."""
    return EngineError(
        f"sharded (torch.distributed.checkpoint) state cannot be saved or loaded under {policy.name}: load it "
        "with one process, DDP, FSDP2 (zero stage 2/3) or tensor parallelism, or export the model weights "
        "with `ember checkpoint export`"
    )


class DataParallelPolicy(ParallelPolicy):
    """DDP: skip the gradient all-reduce with ``no_sync`` on non-boundary micro-steps.

    DDP averages only the parameters that required grad when it was built. A parameter unfrozen
    later is noticed when it first receives a gradient (a hook on each frozen parameter, silent
    while it stays frozen): that cycle's gradients of the late parameters are averaged by hand,
    and the DDP wrapper is rebuilt before the next forward (:attr:`trainable_changed`), so the
    later steps all-reduce them overlapped with the backward. A parameter frozen after DDP was
    built (with ``find_unused_parameters=False``) leaves DDP's reduction unfinished: the
    boundary backward raises :class:`~ember.errors.EngineError` before the update is applied.
    """

    name = "ddp"

    def __init__(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        self.ddp = ddp
        self.trainable_changed = False
        self._watch(ddp)

    def _watch(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        self._reduced = reduced_parameters(ddp)
        self._late = LateParameters(ddp)

    def follow_trainable(self) -> nn.Module:
        late = len(self._late.arrived)
        self._late.close()
        self.ddp = rewrap_data_parallel(self.ddp)
        self._watch(self.ddp)
        self.trainable_changed = False
        get_dist_logger().info(
            f"{late} parameter(s) made trainable after the DDP wrapper was built: DDP rebuilt over "
            f"{len(self._reduced)} trainable parameters",
            ranks=[0],
        )
        return self.ddp

    def finish_backward(self, boundary: bool, forward_unsynced: bool, params: list[nn.Parameter]) -> None:
        if boundary and forward_unsynced:  # every gradient by hand: DDP's and the late ones
            self.sync_gradients_now([p for _, p in self._reduced] + list(self._late.arrived.values()))
        elif boundary:
            self._require_reduced()
            if self._late.arrived:  # unfrozen in this cycle: DDP did not average them
                self.sync_gradients_now(list(self._late.arrived.values()))
        if self._late.arrived:
            self.trainable_changed = True

    def _require_reduced(self) -> None:
        """Raise before the update when DDP's reduction did not finish: a parameter it reduces got no gradient."""
        try:
            self.ddp._check_reducer_finalized()
        except RuntimeError as err:
            frozen = [n for n, p in self._reduced if not p.requires_grad]
            if frozen:
                raise EngineError(
                    f"parameters {_some(frozen)} were frozen (requires_grad=False) after the DDP wrapper was built, "
                    "so DDP could not average this update's gradients (the update is not applied): freeze them "
                    "before ember.initialize, or set ddp=dict(find_unused_parameters=True) in the config"
                ) from err
            unused = [n for n, p in self._reduced if p.grad is None]
            raise EngineError(
                f"parameters {_some(unused)} received no gradient in this backward, so DDP could not average "
                "this update's gradients (the update is not applied): set ddp=dict(find_unused_parameters=True) "
                "in the config when a forward pass leaves parameters unused"
            ) from err

    # DDP decides in the forward pass whether the backward all-reduces (the forward prepares
    # its reducer unless ``no_sync`` is on): the Engine runs a non-boundary micro-step's forward
    # under ``no_sync``, and backward needs no context of its own.
    def forward_without_sync(self) -> contextlib.AbstractContextManager[None] | None:
        return self.ddp.no_sync()

    def sync_gradients_now(self, params: list[nn.Parameter]) -> None:
        all_reduce_mean([p.grad for p in params if p.grad is not None], self.ddp.process_group)


class ZeroPolicy(DataParallelPolicy):
    """DDP with a :class:`~torch.distributed.optim.ZeroRedundancyOptimizer` (ZeRO stage 1).

    ``state_dicts`` consolidates the optimizer state on rank 0 (``consolidate_state_dict(to=0)``);
    the other ranks return ``{}`` for it. Loading takes the full optimizer state, from every rank
    or broadcast from rank 0 when the others pass ``{}``.
    """

    name = "zero1"
    sharded_state = False

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
        return model.state_dict(), optimizer.state_dict() if distributed.rank() == 0 else {}

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        state = with_full_optimizer_state(state)
        # ZeroRedundancyOptimizer.load_state_dict sets other ranks' entries to None in the dict
        # it is given: hand it copies of the containers, so the caller's state stays whole.
        model.load_state_dict(state["model"], strict=strict)
        optimizer.load_state_dict(_containers(state["optimizer"]))
        return state


class ShardedPolicy(ParallelPolicy):
    """Parameters are DTensors: FSDP2 (ZeRO stage 2/3) over the data dim, tensor parallel, or both.

    Args:
        fsdp_root: the root module that ``fully_shard`` was applied to, or None (TP only).
        description: what was built, for the log.
    """

    keeps_partial_grads = False

    def __init__(self, fsdp_root: nn.Module | None, description: str) -> None:
        self.fsdp_root = fsdp_root
        self.name = description

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        if self.fsdp_root is None:
            yield
            return
        self.fsdp_root.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        yield

    @torch.no_grad()
    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in params if p.grad is not None]
        total = global_grad_norm(grads)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        # Scale each rank's local shard: the same factor everywhere, whatever the placement, and
        # no DTensor op that would mix meshes (TP params) with plain tensors (unplanned params).
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coef.to(local.device, local.dtype))
        return total

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        return model_state, _indexed(optimizer_state) if optimizer_state else {}

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from_rank0 = distributed.any_true(not state["model"])
        if from_rank0:  # the small rest (scaler, counters) comes from rank 0 too
            rest = distributed.broadcast_object({k: v for k, v in state.items() if k not in ("model", "optimizer")})
            state = {**rest, "model": state["model"], "optimizer": state["optimizer"]}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=from_rank0, strict=strict)
        # Two calls, not set_state_dict: given an empty model dict (ranks != 0 under broadcast),
        # set_state_dict treats the call as optimizer-only and skips the model's broadcast.
        # Containers are copied because torch replaces their entries with this rank's shards.
        set_model_state_dict(model, dict(state["model"]), options=options)
        optimizer_state = _named(_containers(state["optimizer"]), model, optimizer) if state["optimizer"] else {}
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
        return state


def with_full_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with rank 0's full optimizer state when any rank passed ``{}`` for it (only rank
    0 reads a consolidated checkpoint); a collective: every rank calls it."""
    if distributed.any_true(not state["optimizer"]):
        state = {**state, "optimizer": distributed.broadcast_object(state["optimizer"], src=0)}
    return state


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with its nested dicts and lists copied and ``fn`` applied to every tensor in them
    (a DTensor too); other leaves are shared."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [map_tensors(v, fn) for v in value]
    return value


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, a plain tensor itself."""
    from torch.distributed.tensor import DTensor  # only sharded modes pay for the import

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _containers(value: Any) -> Any:
    """A copy of the nested dicts and lists in ``value``; tensors and other leaves are shared."""
    return map_tensors(value, lambda t: t)


def _indexed(state: dict[str, Any]) -> dict[str, Any]:
    """DCP's optimizer state (keyed by parameter name) in ``Optimizer.state_dict()``'s format
    (keyed by position), so that it loads into the same optimizer in one process."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _named(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The reverse of :func:`_indexed` for this model and optimizer."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    if len(order) != sum(len(g["params"]) for g in state["param_groups"]):
        raise EngineError(
            f"the optimizer state holds {sum(len(g['params']) for g in state['param_groups'])} parameters, "
            f"this optimizer {len(order)}: load the state of the same model and optimizer"
        )
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {order[int(i)]: value for i, value in state["state"].items()}, "param_groups": groups}


@torch.no_grad()
def all_reduce_mean(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """Average ``tensors`` in place over ``group``: one all-reduce per dtype, of all of them flattened."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    size = dist.get_world_size(group)
    for same in by_dtype.values():
        flat = torch._utils._flatten_dense_tensors(same)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for t, synced in zip(same, torch._utils._unflatten_dense_tensors(flat, same), strict=True):
            t.copy_(synced)


def global_grad_norm(grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all gradients together, as a plain tensor equal on every rank.

    DTensor gradients are grouped by device mesh (under FSDP×TP, parameters outside the TP plan
    live on the data mesh only, the others on the 2-D mesh); each group's norm is reduced over
    its mesh with ``full_tensor()``, then the groups' norms are combined.
    """
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        key = g.device_mesh if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    norms = []
    for group in groups.values():
        norm = nn.utils.get_total_norm(group)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def _some(names: list[str]) -> str:
    """Up to five names, and how many more."""
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(repr(n) for n in names[:5]) + more


def require_boundary(policy: ParallelPolicy, micro_step: int) -> None:
    """Sharded gradients of an open accumulation cycle cannot be saved: say so, clearly."""
    if micro_step > 0 and not policy.keeps_partial_grads:
        raise EngineError(
            f"engine.state_dict() was called {micro_step} micro-step(s) into an accumulation cycle under "
            f"{policy.name}, whose partial gradients are sharded and cannot be saved: save after "
            "engine.step() has returned True (at an accumulation boundary)"
        )
