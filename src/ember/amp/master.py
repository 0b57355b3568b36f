"""Low-precision parameters with fp32 master copies (config ``master_weights=True``).

The model's parameters and gradients are kept in fp16 or bf16 (half the memory of fp32), the
optimizer updates fp32 copies of them, and fp16 losses are scaled by a dynamic
:class:`LossScale` (Megatron's and Colossal-AI's NAIVE AMP). :class:`MasterWeights` is one more
precision policy: the Engine's step is the same, the policy overrides the parts that differ.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.amp.policies import AutocastPrecision
from ember.errors import ConfigError, EngineError, NonFiniteLossError, short_repr


class LossScale:
    """A dynamic loss scale kept on the host: back off on overflow, grow after a clean run.

    Megatron's and Colossal-AI's NAIVE rules: an overflowed update is skipped; after
    ``hysteresis`` overflows since the scale last grew, each further overflow multiplies the
    scale by ``backoff_factor`` (never below ``min_scale``); ``growth_interval`` clean updates
    in a row multiply it by ``growth_factor`` (never above ``max_scale``) and re-arm the
    hysteresis. An overflow that would take the scale below ``min_scale`` means the gradients
    are not finite even barely scaled: that is an error, not a run that skips every update.

    Args:
        init_scale: the first scale.
        growth_factor: the factor a clean run grows the scale by (> 1).
        backoff_factor: the factor an overflow shrinks it by (between 0 and 1).
        growth_interval: clean updates in a row before the scale grows.
        hysteresis: overflows tolerated (skipped, scale kept) before the scale backs off.
        min_scale: the smallest scale; an overflow at it raises.
        max_scale: the largest scale.

    Example:
        >>> scale = LossScale(init_scale=2.0**16, hysteresis=2)
        >>> scale.update(overflow=True); scale.scale      # tolerated once
        65536.0
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 1,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
    ) -> None:
        if not (growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1 and hysteresis >= 1):
            raise ConfigError(
                f"loss scale settings need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1 and "
                f"hysteresis >= 1, got {growth_factor=}, {backoff_factor=}, {growth_interval=}, {hysteresis=}"
            )
        if not 0 < min_scale <= init_scale <= max_scale:
            raise ConfigError(
                f"loss scale settings need 0 < min_scale <= init_scale <= max_scale, got min_scale={min_scale:g}, "
                f"init_scale={init_scale:g}, max_scale={max_scale:g}"
            )
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.hysteresis = int(growth_interval), int(hysteresis)
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.clean_updates = 0
        """Updates without overflow since the scale last changed or overflowed."""
        self.overflows = 0
        """Overflows since the scale last grew (backing off starts at ``hysteresis``)."""

    def update(self, overflow: bool) -> None:
        """Account for one update's gradients (``overflow``: some were inf or NaN).

        Raises:
            NonFiniteLossError: an overflow with the scale already at ``min_scale``.
        """
        if not overflow:
            self.clean_updates += 1
            if self.clean_updates >= self.growth_interval:
                self.scale = min(self.scale * self.growth_factor, self.max_scale)
                self.clean_updates = self.overflows = 0
            return
        self.clean_updates = 0
        self.overflows += 1
        if self.overflows < self.hysteresis:
            return
        if self.scale <= self.min_scale:
            raise NonFiniteLossError(
                "the fp16 loss scale collapsed: the gradients overflowed (inf/NaN) at the "
                f"minimum loss scale {self.min_scale:g}, after {self.overflows} overflow(s) since it last grew, so "
                "every further update would be skipped. The model diverged or fp16 cannot hold its gradients: "
                "lower the learning rate, clip gradients (clip_grad_norm), or train with amp='bf16'"
            )
        self.scale = max(self.scale * self.backoff_factor, self.min_scale)

    def state_dict(self) -> dict[str, float | int]:
        """The scale and its two counters (the factors come from the config)."""
        return {"scale": self.scale, "clean_updates": self.clean_updates, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            EngineError: ``state`` is not one (a damaged checkpoint, another precision's state).
        """
        try:
            scale, clean, overflows = float(state["scale"]), int(state["clean_updates"]), int(state["overflows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(
                f"the saved loss scale {short_repr(state)} is not a LossScale state ({type(exc).__name__}: {exc}): "
                "load a checkpoint of a master_weights=True fp16 run"
            ) from None
        if not (math.isfinite(scale) and scale > 0 and clean >= 0 and overflows >= 0):
            raise EngineError(
                f"the saved loss scale {short_repr(state)} is out of range: load a checkpoint ember wrote"
            )
        self.scale, self.clean_updates, self.overflows = scale, clean, overflows


_SOURCE = "_ember_master_of"  # on a master: a weak reference to the model parameter it stands for


def source_parameter(param: torch.Tensor) -> torch.Tensor:
    """The model parameter an fp32 master copy stands for (``param`` itself when it is no master).

    Code that names an optimizer's parameters by the model's names (full optimizer state under
    expert parallelism) resolves masters through it.
    """
    source = getattr(param, _SOURCE, None)
    found = source() if source is not None else None
    return found if found is not None else param


@dataclass(frozen=True)
class MasterShard:
    """Which fp32 masters this rank keeps when they are sharded (ZeRO-1 with master weights).

    Attributes:
        rank: this rank's index in ``group``.
        size: the ranks that share the masters (the data-parallel replicas).
        group: their process group (None: the default group).
    """

    rank: int
    size: int
    group: Any = None

    def owners(self, params: list[nn.Parameter]) -> list[int]:
        """Each parameter's owner: the biggest first, each to the least-loaded rank (ties: the lowest)."""
        load = [0] * self.size
        owner = [0] * len(params)
        for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
            owner[i] = min(range(self.size), key=lambda r: (load[r], r))
            load[owner[i]] += params[i].numel()
        return owner

    def global_rank(self, index: int) -> int:
        """The global rank of the group's ``index``-th member."""
        return dist.get_global_rank(self.group, index) if self.group is not None else index


class MasterWeights(AutocastPrecision):
    """Parameters kept in fp16 or bf16, the optimizer stepping fp32 master copies of them.

    :meth:`prepare` casts the model's floating-point parameters and buffers to ``dtype`` (half
    the memory of weights and of gradients) and puts an fp32 copy of each trained parameter in
    the optimizer's place. Each update then runs as one step with a few overrides: the forward
    autocasts (fp32 inputs meet ``dtype`` weights); ``backward`` scales the loss (fp16);
    :meth:`unscale_` turns the low-precision gradients into fp32 gradients of the masters,
    divided by the scale, and finds an overflow on any rank; clipping and gradient handlers see
    the masters; :meth:`step` skips an overflowed update (backing the :class:`LossScale` off) or
    steps the masters and copies them back into the model. Under ZeRO-1 (``shard``) each rank
    keeps the masters (and optimizer state) of its share of the parameters only and sends the
    updated low-precision weights to the others.

    Checkpoints hold the fp32 masters as the model's weights (inside :meth:`full_precision`, where
    the Engine saves and loads), so a run resumes from exactly the masters it had, and a
    checkpoint loads into an fp32 model as it is.

    Args:
        device: the device.
        dtype: ``torch.float16`` (with a loss scale) or ``torch.bfloat16`` (none needed).
        loss_scale: the dynamic loss scale for fp16.

    Example:
        >>> engine, *_ = ember.initialize(model, opt, loss, config=dict(amp="fp16", master_weights=True))
        >>> engine.precision.loss_scale, next(engine.model.parameters()).dtype
        (65536.0, torch.float16)
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, loss_scale: LossScale | None = None) -> None:
        super().__init__(device, dtype)
        self.scaler = loss_scale if dtype == torch.float16 else None
        self.shard: MasterShard | None = None
        self.group_params: list[list[nn.Parameter]] = []
        self._params: list[nn.Parameter] = []  # every trained model parameter, in the optimizer's order
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (model parameter, its master) kept here
        self._owners: list[int] = []
        self._overflow = False
        self._active = False  # inside full_precision()
        self._lent: dict[int, torch.Tensor] = {}
        self._named: list[tuple[str, nn.Parameter]] = []
        self._named_by_id: dict[int, str] = {}

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, shard: MasterShard | None = None) -> None:
        """Cast ``model`` to the low precision and make ``optimizer`` step fp32 masters (in place).

        Call it once, before the first step, with replicas' weights already equal. The optimizer
        object stays the user's (schedulers built over it keep working); its param groups hold
        the masters this rank keeps.

        Raises:
            EngineError: the optimizer has stepped already (its state cannot follow).
        """
        if optimizer.state:
            raise EngineError(
                "master_weights needs an optimizer that has not stepped yet (its state would not follow the fp32 "
                "masters): call ember.initialize before the first step, and restore state with engine.load_state_dict"
            )
        self.shard = shard
        self.group_params = [list(group["params"]) for group in optimizer.param_groups]
        """The model parameters of each param group, as the optimizer held them before (all of them, sharded or not)."""
        self._params = [p for group in self.group_params for p in group]
        self._owners = shard.owners(self._params) if shard is not None else [0] * len(self._params)
        mine = 0 if shard is None else shard.rank
        masters: dict[int, nn.Parameter] = {}
        for p, owner in zip(self._params, self._owners, strict=True):
            if owner == mine and id(p) not in masters:
                master = nn.Parameter(p.detach().clone().to(torch.float32), requires_grad=p.requires_grad)
                master.__dict__.update(p.__dict__)  # tags such as the expert marker travel along
                setattr(master, _SOURCE, weakref.ref(p))
                masters[id(p)] = master
                self._pairs.append((p, master))
        for group in optimizer.param_groups:
            keep = [i for i, p in enumerate(group["params"]) if id(p) in masters]
            if "param_names" in group:
                group["param_names"] = [group["param_names"][i] for i in keep]
            group["params"] = [masters[id(group["params"][i])] for i in keep]
        model.to(self.dtype)
        self._named = list(model.named_parameters(remove_duplicate=False))
        self._named_by_id = {id(p): name for name, p in reversed(self._named)}  # a shared one: its first name
        model.register_state_dict_post_hook(functools.partial(MasterWeights._saved, self))  # torch tags the hook:
        model.register_load_state_dict_pre_hook(functools.partial(MasterWeights._loading, self))  # no bound method

    def gradient_params(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        if params and not self._params:
            raise EngineError(
                "MasterWeights was not prepared: ember.initialize(..., config=dict(master_weights=True)) builds it, "
                "or call precision.prepare(model, optimizer) before building the Engine"
            )
        return self._params

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)
        for p in self._params:
            p.grad = None

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scaler.scale if self.scaler is not None else loss

    @torch.no_grad()
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        inverse = 1.0 / self.loss_scale
        bad = []
        for p, master in self._pairs:
            if p.grad is None:
                master.grad = None
                continue
            master.grad = p.grad.to(torch.float32)
            if inverse != 1.0:
                master.grad.mul_(inverse)
            if self.scaler is not None:
                bad.append(~torch.isfinite(master.grad).all())
        for p in self._params:
            p.grad = None
        if self.scaler is not None:  # every rank skips, or none: expert and sharded gradients differ per rank
            flag = torch.stack(bad).any().to(torch.int32).reshape(1) if bad else torch.zeros(1, dtype=torch.int32)
            self._overflow = bool(distributed.all_reduce(flag.to(distributed.collective_device()), "max").item())

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self._overflow:
            self._overflow = False
            for _, master in self._pairs:
                master.grad = None
            self.scaler.update(True)  # type: ignore[union-attr]
            return False
        optimizer.step()
        for p, master in self._pairs:
            p.copy_(master)
            master.grad = None
        if self.shard is not None:
            self._share_updated_weights()
        if self.scaler is not None:
            self.scaler.update(False)
        return True

    def _share_updated_weights(self) -> None:
        """Every rank's updated low-precision weights, from their owners to all (one broadcast per owner)."""
        shard = self.shard
        assert shard is not None
        for owner in range(shard.size):
            params = [p for p, o in zip(self._params, self._owners, strict=True) if o == owner]
            if not params:
                continue
            flat = torch._utils._flatten_dense_tensors([p.data for p in params])
            dist.broadcast(flat, src=shard.global_rank(owner), group=shard.group)
            for p, value in zip(params, torch._utils._unflatten_dense_tensors(flat, params), strict=True):
                p.data.copy_(value)

    @contextlib.contextmanager
    def full_precision(self) -> Iterator[None]:
        """Inside, the model's state dict holds the fp32 masters, and loading one sets them (a
        collective when sharded: each master's owner lends it to the other ranks).

        The Engine saves and loads state inside it, so checkpoints carry the masters. It works
        through the model's state-dict hooks (:meth:`prepare` registers them), never by swapping
        the parameters' data, which would cut them off from DDP's gradient hooks.
        """
        self._lent = {}
        if self.shard is not None:
            kept = {id(p): master.data for p, master in self._pairs}
            for owner, p in zip(self._owners, self._params, strict=True):
                full = kept.get(id(p))
                full = full if full is not None else torch.empty(p.shape, dtype=torch.float32, device=p.device)
                dist.broadcast(full, src=self.shard.global_rank(owner), group=self.shard.group)
                self._lent[id(p)] = full
        self._active = True
        try:
            yield
        finally:
            self._active, self._lent = False, {}

    def _saved(self, module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any) -> None:
        """State-dict post-hook: the masters (or those lent by their owners) in place of the weights."""
        if not self._active:
            return
        masters = {id(p): master for p, master in self._pairs}
        for name, p in self._named:
            full = self._lent.get(id(p), masters.get(id(p)))
            if full is not None and prefix + name in state:
                state[prefix + name] = full.detach()

    def _loading(self, module: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        """Load-state-dict pre-hook: the loaded weights, in full precision, become this rank's masters."""
        if not self._active:
            return
        by_id = dict(self._named_by_id)
        for p, master in self._pairs:
            value = state.get(prefix + by_id.get(id(p), ""))
            if isinstance(value, torch.Tensor) and value.shape == master.shape:  # else load_state_dict says why
                with torch.no_grad():
                    master.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"loss_scale": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "loss_scale" in state:
            self.scaler.load_state_dict(state["loss_scale"])
