"""A training state as one checkpoint dict, and back.

The checkpoint knows no Trainer: what it saves is handed to it as named stateful objects
(:class:`Checkpointables`, as fvcore's ``Checkpointer(model, **checkpointables)``), each with
``state_dict()``/``load_state_dict()``. Anything with a ``logger`` and a ``checkpointables()``
method returning them is a :class:`TrainingState`: the Trainer is one, so
``checkpoint.save(path, trainer)`` works.

:func:`capture` is a collective (every rank calls it): the Engine's state (itself a collective
under ZeRO, FSDP2 and tensor parallelism), and each rank's own pieces — its random number
generators, the gradients of an open accumulation cycle under DDP, and the state of hooks whose
state differs per rank (metric running sums) — gathered to rank 0, which gets the dict. The
other ranks get None. :func:`restore` gives each rank what it needs from such a dict.

The dict (see ``docs/checkpoint.md``)::

    format, version      "ember.checkpoint", 1
    meta                 time, epoch, step, metrics, world size, versions, sizes (cheap to inspect)
    engine               Engine.state_dict() without partial_grads (model, optimizer, scaler, counters)
    trainer              the counters' state_dict() (counters, the fit in progress, history)
    hooks                {hook name: state} for hooks whose state is the same on every rank
    sampler              epoch, position in it, batch size, data-parallel size, seed
    ranks                [per rank: rng, hooks (per-rank ones), partial_grads (mid-cycle)]
    shards               only in a sharded checkpoint (:mod:`ember.checkpoint.sharded`): where
                         the model and optimizer are, in ``torch.distributed.checkpoint`` files;
                         ``engine`` then holds the precision state and counters alone
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from ember import distributed
from ember._version import __version__
from ember.checkpoint.state import StagingBuffers, only_scalars, rng_state, to_cpu
from ember.checkpoint.validate import FORMAT, VERSION, check_format
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from ember.engine import Engine
    from ember.logging import DistributedLogger


class Stateful(Protocol):
    """An object a checkpoint saves: its state as plain data and tensors, and back."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class HookStates(Protocol):
    """The hooks' states by hook name: the ``hooks`` section, and the per-rank ones in ``ranks``."""

    def per_rank(self) -> frozenset[str]:
        """Names of the hooks whose state differs per rank (each rank's is kept)."""
        ...

    def state_dict(self, per_rank_only: bool = False) -> Mapping[str, Mapping[str, Any]]:
        """``{name: state}`` of the hooks that keep state (only the per-rank ones if asked)."""
        ...

    def load_state_dict(self, state: Mapping[str, Mapping[str, Any]], strict: bool = True) -> None:
        """Give each hook its state; ``strict``: refuse a state whose hook is unknown."""
        ...


@dataclass(frozen=True)
class Checkpointables:
    """The named stateful objects one checkpoint saves, each under its own section.

    Attributes:
        engine: the Engine (model, optimizer, precision, accumulation): ``engine``.
        counters: the loop's counters, the fit in progress and the history: ``trainer``. Its
            state has ``cur_epoch``, ``epoch_iter``, ``cur_step``, ``micro_step``,
            ``samples_seen``, ``fit`` and ``history`` (the metadata is read from them).
        hooks: the hooks' states by name: ``hooks`` (and ``ranks`` for per-rank ones).
        sampler: the position in the training data: ``sampler`` (its ``load_state_dict``
            resumes the epoch at the sample the saved ranks had reached).
    """

    engine: Engine
    counters: Stateful
    hooks: HookStates
    sampler: Stateful


class TrainingState(Protocol):
    """What checkpoint functions save and restore: a :class:`~ember.trainer.Trainer` is one."""

    @property
    def logger(self) -> DistributedLogger:
        """Where warnings about a loaded checkpoint go."""
        ...

    def checkpointables(self) -> Checkpointables:
        """The objects to save, by section."""
        ...


SECTIONS = ("engine", "trainer", "hooks", "sampler", "ranks")


def capture(
    owner: TrainingState, reason: str = "manual", copy: bool | StagingBuffers = False,
    shards: Mapping[str, Any] | None = None, defer: Callable[[torch.Tensor], bool] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """Collect ``owner``'s full state; a collective. Rank 0 gets the dict, other ranks None.

    Args:
        owner: the Trainer, or anything else that hands over :class:`Checkpointables`.
        reason: why it is taken (``"epoch"``, ``"step"``, ``"preempt"``, ``"final"``, ``"manual"``),
            kept in the metadata.
        copy: copy every tensor to CPU memory now (for writing in the background while
            training changes the live tensors); a :class:`StagingBuffers` to copy into its
            reused memory (the previous write from it must have finished).
        defer: with a :class:`StagingBuffers`, the CPU tensors to copy later, by the
            :class:`~ember.checkpoint.state.DeferredCopy` that ``copy.take_deferred()`` returns.
        shards: for a sharded checkpoint, the description of its ``torch.distributed.checkpoint``
            part, kept as the ``shards`` section: the model and optimizer are then left out of
            ``engine`` (the caller saves them with DCP) and nothing is gathered.
        extra: the caller's own entries, kept as ``meta["extra"]`` (checked to load safely).
    """
    parts = owner.checkpointables()
    engine = parts.engine
    # A collective under ZeRO / FSDP2 / TP: every rank calls it. Sharded: the caller saves the
    # model and optimizer with DCP.
    engine_state = engine.state_dict(weights=shards is None)
    partial = engine_state.pop("partial_grads", None)
    per_rank = parts.hooks.per_rank()
    rank = distributed.rank()
    hook_states = parts.hooks.state_dict(per_rank_only=rank != 0)
    mine: dict[str, Any] = {"rng": rng_state(), "hooks": {n: s for n, s in hook_states.items() if n in per_rank}}
    if partial is not None:
        mine["partial_grads"] = partial
    ranks = gather_to_rank0(to_cpu(mine))
    if rank != 0:
        return None
    trainer_state = dict(parts.counters.state_dict())
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "meta": _meta(engine, trainer_state, engine_state, reason),
        "engine": engine_state,
        "trainer": trainer_state,
        "hooks": {n: s for n, s in hook_states.items() if n not in per_rank},
        "sampler": dict(parts.sampler.state_dict()),
        "ranks": ranks,
    }
    if shards is not None:
        state["shards"] = dict(shards)
        state["meta"]["sharded"] = True
    if extra is not None:
        state["meta"]["extra"] = dict(extra)
        check_loadable(state["meta"]["extra"], "extra")
    check_loadable(state["hooks"], "hooks")
    check_loadable(ranks, "ranks")
    if copy is not False:
        state = to_cpu(state, copy, defer) if isinstance(copy, StagingBuffers) else to_cpu(state)
    state["meta"]["sizes"] = {k: tensor_bytes(state[k]) for k in SECTIONS}
    return state


def restore(
    state: Mapping[str, Any],
    owner: TrainingState,
    strict: bool = True,
    where: str = "checkpoint",
    shards: Mapping[str, Any] | None = None,
) -> Any:
    """Load ``state`` (from :func:`capture`) into ``owner`` on this rank; return this rank's RNG state.

    A collective. For a sharded checkpoint, ``shards`` is the model's and optimizer's state
    read from its ``torch.distributed.checkpoint`` files, resharded into this run's layout
    (:func:`ember.checkpoint.sharded.load_shards`; :func:`ember.checkpoint.checkpointer.restore_from`
    reads them).

    The caller applies the returned RNG state (:func:`ember.checkpoint.state.set_rng_state`)
    as late as it can: right before the next batch. Saved by a different number of ranks,
    rank ``r`` takes saved rank ``r % saved_world``'s generators and per-rank hook state, the
    gradients of an open accumulation cycle are averaged over the saved ranks, and the position
    in the epoch is mapped through the number of samples all ranks had consumed.
    """
    check_format(state, where)
    parts = owner.checkpointables()
    meta, ranks = state["meta"], state["ranks"]
    world, rank = distributed.world_size(), distributed.rank()
    saved_world = int(meta["world_size"])
    mine = ranks[rank % saved_world]
    engine_state = dict(state["engine"])
    if int(engine_state.get("micro_step", 0)) > 0:
        engine_state["partial_grads"] = mine["partial_grads"] if saved_world == world else _mean_grads(ranks)
    if "shards" in state:
        if shards is None:
            raise CheckpointError(f"{where} is sharded: pass its model and optimizer state to restore(..., shards=...)")
        engine_state.update(shards)
    try:
        parts.engine.load_state_dict(engine_state)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # torch's "size mismatch for ..."
        raise CheckpointError(
            f"{where} does not fit this model and optimizer: {str(exc)[:2000]} "
            "(was it saved from another model, or with another optimizer?)"
        ) from exc
    parts.counters.load_state_dict(state["trainer"])
    _load_position(state["sampler"], parts, owner.logger, where)
    parts.hooks.load_state_dict({**state["hooks"], **mine["hooks"]}, strict=strict)
    if saved_world != world:
        owner.logger.warning(
            f"{where} was saved by {saved_world} process(es) and is loaded by {world}: training continues "
            f"from it, but not bit-identically (rank r takes saved rank r % {saved_world}'s random generators "
            "and metric sums; the gradients of an open accumulation cycle are averaged)",
            ranks=[0],
        )
    return mine["rng"]


_SAFE_LEAVES = (torch.Tensor, str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)


def check_loadable(obj: Any, where: str) -> None:
    """Raise CheckpointError naming the entry that torch's safe loader (``weights_only``) would refuse.

    Hooks may keep any state, but a checkpoint must load without running pickled code, so the
    state holds tensors, numbers, strings, and dicts, lists, tuples and sets of them.
    """
    if isinstance(obj, _SAFE_LEAVES):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_loadable(k, f"{where} (a key)")
            check_loadable(v, f"{where}[{k!r}]")
    elif type(obj) in (list, tuple, set):
        if only_scalars(obj):
            return
        for i, v in enumerate(obj):
            check_loadable(v, f"{where}[{i}]")
    else:
        raise CheckpointError(
            f"checkpoint entry {where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a checkpoint "
            "cannot hold (it must load without running pickled code): use tensors, numbers, strings, and "
            "dicts/lists/tuples of them (e.g. str(path), an enum's .value)"
        )


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None elsewhere); a collective."""
    if not distributed.is_active():
        return [obj]
    out: list[Any] | None = [None] * distributed.world_size() if distributed.rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def tensor_bytes(obj: Any) -> int:
    """Bytes held by the tensors in a nested structure."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return 0 if only_scalars(obj) else sum(tensor_bytes(v) for v in obj)
    return 0


def _latest_saved_metrics(history_state: Mapping[str, Any]) -> dict[str, float]:
    """The last recorded value of every metric in a saved history (``History.state_dict()``)."""
    return {name: series[max(series)] for name, series in history_state["values"].items() if series}


def _meta(engine: Engine, ts: Mapping[str, Any], engine_state: Mapping[str, Any], reason: str) -> dict[str, Any]:
    return {
        "time": time.time(),
        "reason": reason,
        "epoch": ts["cur_epoch"],
        "epoch_iter": ts["epoch_iter"],
        "step": ts["cur_step"],
        "micro_step": ts["micro_step"],
        "samples_seen": ts["samples_seen"],
        "fit_active": bool(ts["fit"]["active"]),
        "accumulation_micro_step": int(engine_state.get("micro_step", 0)),
        "metrics": _latest_saved_metrics(ts["history"]),
        "world_size": distributed.world_size(),
        "data_parallel_size": engine.data_parallel_size,
        "parallel": getattr(engine.parallel, "name", "none"),
        "ember_version": __version__,
        "torch_version": str(torch.__version__),  # a str subclass the safe loader refuses
    }


def _load_position(sampler: Mapping[str, Any], parts: Checkpointables, logger: DistributedLogger, where: str) -> None:
    """Give the sampler section to its owner, which resumes the epoch at the saved sample, and
    say so when the saved data-parallel size differs (see :func:`samples_consumed`)."""
    parts.sampler.load_state_dict(sampler)
    consumed = samples_consumed(sampler)
    saved_dp = int(sampler["data_parallel_size"])
    if consumed is not None and saved_dp != parts.engine.data_parallel_size:
        logger.warning(
            f"{where}: the epoch resumes after the {consumed} samples that its {saved_dp} rank(s) had consumed",
            ranks=[0],
        )


def samples_consumed(sampler: Mapping[str, Any]) -> int | None:
    """How many samples of the epoch the saved ranks had consumed together (None: at its start,
    or the loader had no batch size).

    The ranks of a :class:`~ember.data.ResumableSampler` consume the epoch's order from its
    start, so ``batches × batch size × data-parallel size`` samples were consumed, whatever
    the number of ranks; a Trainer turns that into its own batches (rounded down, so no
    sample is skipped; a few may be seen twice when the split is uneven).
    """
    if not sampler["batches"] or sampler["batch_size"] is None:
        return None
    return int(sampler["batches"]) * int(sampler["batch_size"]) * int(sampler["data_parallel_size"])


def _mean_grads(ranks: list[Mapping[str, Any]]) -> list[torch.Tensor | None]:
    per_rank = [r["partial_grads"] for r in ranks]
    out: list[torch.Tensor | None] = []
    for grads in zip(*per_rank, strict=True):
        present = [g for g in grads if g is not None]
        out.append(torch.stack(present).mean(0) if present else None)
    return out


def agree_on_error(error: Exception | None, other: str) -> None:
    """Raise ``error`` here, and a CheckpointError saying ``other`` on the ranks without one; a collective.

    With one process this simply raises ``error`` when there is one.
    """
    if distributed.is_active() and distributed.any_true(error is not None) and error is None:
        raise CheckpointError(other)
    if error is not None:
        raise error
