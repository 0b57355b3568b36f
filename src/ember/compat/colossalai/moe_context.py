"""Colossal-AI's ``MOE_CONTEXT`` (``colossalai.context.MOE_CONTEXT``), read from ember's launched layout.

In Colossal-AI, ``MOE_CONTEXT.setup(seed)`` made the expert-parallel groups from the config's
``max_ep_size`` (default: the whole world) and seeded expert initialisation per rank. In ember
the groups exist from the launch (the config's ``max_ep_size``, ``parallel=dict(moe=dict(size=E))``
or ``parallel.expert``, default 1), so ``setup`` checks the launch, records the seed that
:class:`~ember.compat.colossalai.nn.layer.moe.Experts` initialise their parameters from (a stream
of its own per rank, as Colossal-AI's ``seed(ParallelMode.TENSOR)``), and says once when the
experts are not split at all. The auxiliary-loss box (``reset_loss``/``add_loss``/``get_loss``)
is Colossal-AI's, for ``MoeLoss``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

import ember
from ember import context as _context
from ember.errors import ConfigError, ContextError

__all__ = ["MOE_CONTEXT", "MoeContext", "MoeParallelInfo"]


@dataclass(frozen=True)
class MoeParallelInfo:
    """Colossal-AI's expert-parallel information of one expert count.

    Attributes:
        ep_size: the ranks the experts are split over (``parallel.expert``).
        dp_size: the replicas of each expert (the ``expert_data`` group's size).
        ep_group: the process group that exchanges tokens (None with one rank).
        dp_group: the group that reduces an expert's gradients (None with one replica).
    """

    ep_size: int
    dp_size: int
    ep_group: Any
    dp_group: Any


class MoeContext:
    """Colossal-AI's MoE context: ``setup``, the expert-parallel sizes, and the aux-loss box.

    Example:
        >>> colossalai.launch_from_torch(config="config.py")     # config.py: max_ep_size = 2
        >>> MOE_CONTEXT.setup(42)
        >>> MOE_CONTEXT.max_ep_size
        2
    """

    def __init__(self) -> None:
        self.aux_loss: Any = None
        self.use_kernel_optim = True
        self.seed: int | None = None
        self._launch: _context.Context | None = None
        self._rng: dict[str, Any] = {}
        self._info: dict[int, MoeParallelInfo] = {}

    @property
    def is_initialized(self) -> bool:
        """Whether :meth:`setup` ran in this launch."""
        return self._launch is not None and _context.is_launched() and self._launch is _context.get_context()

    @property
    def has_setup(self) -> bool:
        """Colossal-AI's name of :attr:`is_initialized`."""
        return self.is_initialized

    @property
    def world_size(self) -> int:
        """The job's processes."""
        return _context.get_context(default=True).world_size

    @property
    def max_ep_size(self) -> int:
        """The expert-parallel size (``parallel.expert``)."""
        return _context.get_context(default=True).layout.expert

    @property
    def min_dp_size(self) -> int:
        """The replicas of each expert: the world over :attr:`max_ep_size`."""
        return self.world_size // self.max_ep_size

    @property
    def parallel_info_dict(self) -> dict[int, MoeParallelInfo]:
        """``{ep_size: MoeParallelInfo}`` of the expert counts :meth:`get_info` was asked about."""
        return self._info

    def setup(self, seed: int, use_kernel_optim: bool = True) -> None:
        """Check the launch and record ``seed`` for the experts' initialisation.

        Args:
            seed: each rank's experts initialise from ``seed + rank``.
            use_kernel_optim: kept (ember has no MoE CUDA kernel; routing runs in torch ops).

        Raises:
            ContextError: called before a launch, or twice in one launch.
            ConfigError: the layout has tensor or pipeline parallelism (as in Colossal-AI).
        """
        if not _context.is_launched():
            raise ContextError("MOE_CONTEXT.setup(...) needs a launch first: call colossalai.launch_from_torch(...)")
        if self.is_initialized:
            raise ContextError("MOE_CONTEXT.setup(...) was called twice in this launch: call it once")
        ctx = _context.get_context()
        if ctx.layout.tensor > 1 or ctx.layout.pipeline > 1:
            raise ConfigError(
                f"MoE does not run with tensor or pipeline parallelism ({ctx.layout}): use data parallelism with "
                "max_ep_size (parallel.expert) in the config"
            )
        self._launch, self.seed, self.use_kernel_optim, self._info = ctx, int(seed), use_kernel_optim, {}
        self._rng = {"cpu": torch.Generator().manual_seed(self.seed + ctx.rank).get_state()}
        if ctx.device.type == "cuda":
            self._rng["cuda"] = torch.Generator(device=ctx.device).manual_seed(self.seed + ctx.rank).get_state()
        if ctx.world_size > 1 and ctx.layout.expert == 1:
            ember.get_dist_logger().info(
                "MOE_CONTEXT: every rank holds every expert (expert-parallel size 1); set max_ep_size = N (or "
                "parallel.expert) in the config to split them over N ranks (Colossal-AI's default was the whole "
                "world)",
                ranks=[0],
            )

    def get_info(self, num_experts: int) -> tuple[int, MoeParallelInfo]:
        """``(experts on this rank, MoeParallelInfo)`` for ``num_experts`` experts.

        Raises:
            ConfigError: ``num_experts`` is not a multiple of :attr:`max_ep_size` (Colossal-AI
                replicated fewer experts than ranks; ember needs every rank to hold its own).
        """
        size = self.max_ep_size
        if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts < 1:
            raise ConfigError(f"MOE_CONTEXT.get_info(num_experts={num_experts!r}): the number of experts, an int >= 1")
        if num_experts % size:
            raise ConfigError(
                f"{num_experts} experts cannot be split over max_ep_size={size} ranks: ember needs a multiple of "
                f"{size} (Colossal-AI replicated fewer experts than ranks; ember does not)"
            )
        if size not in self._info:
            groups = {n: _context.get_group(n) if size > 1 else None for n in ("expert", "expert_data")}
            self._info[size] = MoeParallelInfo(size, self.min_dp_size, groups["expert"], groups["expert_data"])
        return num_experts // size, self._info[size]

    @contextlib.contextmanager
    def expert_rng(self) -> Iterator[None]:
        """The random stream experts initialise from after :meth:`setup` (this rank's own, carried on)."""
        if not self.is_initialized:
            yield
            return
        devices = [torch.cuda.current_device()] if "cuda" in self._rng else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self._rng["cpu"])
            if devices:
                torch.cuda.set_rng_state(self._rng["cuda"])
            yield
            self._rng["cpu"] = torch.get_rng_state()
            if devices:
                self._rng["cuda"] = torch.cuda.get_rng_state()

    def set_kernel_not_use(self) -> None:
        """Colossal-AI's switch for its CUDA kernel; ember has none."""
        self.use_kernel_optim = False

    def reset_loss(self) -> None:
        """Start a forward pass's auxiliary loss at 0."""
        self.aux_loss = 0

    def add_loss(self, loss: Any) -> None:
        """Add a MoE layer's auxiliary loss (what ``MoeLayer`` returned beside its output)."""
        self.aux_loss = loss if self.aux_loss is None else self.aux_loss + loss

    def get_loss(self) -> Any:
        """The auxiliary loss added since :meth:`reset_loss`; ``MoeLoss`` adds it to the task loss."""
        return self.aux_loss if self.aux_loss is not None else 0


MOE_CONTEXT = MoeContext()
"""The one MoE context: ``from ember.compat.colossalai.context import MOE_CONTEXT``."""
