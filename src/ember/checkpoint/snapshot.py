"""A Trainer's whole state as one checkpoint dict, and back.

:func:`capture` is a collective (every rank calls it): the Engine's state (itself a collective
under ZeRO, FSDP2 and tensor parallelism), and each rank's own pieces — its random number
generators, the gradients of an open accumulation cycle under DDP, and the state of hooks whose
state differs per rank (metric running sums) — gathered to rank 0, which gets the dict. The
other ranks get None. :func:`restore` gives each rank what it needs from such a dict.

The dict (see ``docs/checkpoint.md``)::

    format, version      "ember.checkpoint", 1
    meta                 time, epoch, step, metrics, world size, versions, sizes (cheap to inspect)
    engine               Engine.state_dict() without partial_grads (model, optimizer, scaler, counters)
    trainer              Trainer.state_dict() (counters, the fit in progress, history)
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
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ember import distributed
from ember.checkpoint.state import StagingBuffers, only_scalars, rng_state, to_cpu
from ember.checkpoint.validate import FORMAT, VERSION, check_format
from ember.errors import CheckpointError
from ember.parallel.policy import require_boundary

if TYPE_CHECKING:
    from pathlib import Path

    from ember.trainer import Trainer

SECTIONS = ("engine", "trainer", "hooks", "sampler", "ranks")


def capture(
    trainer: Trainer, reason: str = "manual", copy: bool | StagingBuffers = False,
    shards: Mapping[str, Any] | None = None, defer: Callable[[torch.Tensor], bool] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """Collect ``trainer``'s full state; a collective. Rank 0 gets the dict, other ranks None.

    Args:
        trainer: the Trainer (its Engine, hooks, counters and dataloader).
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
    engine = trainer.engine
    if shards is None:
        engine_state = engine.state_dict()  # a collective under ZeRO / FSDP2 / TP: every rank calls it
    else:
        require_boundary(engine.parallel, engine.micro_step)
        engine_state = {
            "precision": engine.precision.state_dict(),
            "micro_step": engine.micro_step,
            "num_updates": engine.num_updates,
            "skipped_updates": engine.skipped_updates,
        }
    partial = engine_state.pop("partial_grads", None)
    per_rank = {h.name for h in trainer.hooks if getattr(h, "state_per_rank", False)}
    rank = distributed.rank()
    if rank == 0:
        hook_states = trainer.hook_states()
    else:
        hook_states = {h.name: s for h in trainer.hooks if h.name in per_rank and (s := h.state_dict())}
    mine: dict[str, Any] = {"rng": rng_state(), "hooks": {n: s for n, s in hook_states.items() if n in per_rank}}
    if partial is not None:
        mine["partial_grads"] = partial
    ranks = gather_to_rank0(to_cpu(mine))
    if rank != 0:
        return None
    trainer_state = trainer.state_dict()
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "meta": _meta(trainer, trainer_state, engine_state, reason),
        "engine": engine_state,
        "trainer": trainer_state,
        "hooks": {n: s for n, s in hook_states.items() if n not in per_rank},
        "sampler": _sampler_state(trainer, trainer_state),
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
    trainer: Trainer,
    strict: bool = True,
    where: str = "checkpoint",
    source: Path | None = None,
) -> Any:
    """Load ``state`` (from :func:`capture`) into ``trainer`` on this rank; return this rank's RNG state.

    A collective. For a sharded checkpoint, ``source`` is its directory: the model and
    optimizer are loaded from its ``torch.distributed.checkpoint`` files, resharded into this
    run's layout (see :mod:`ember.checkpoint.sharded`).

    The caller applies the returned RNG state (:func:`ember.checkpoint.state.set_rng_state`)
    as late as it can: right before the next batch. Saved by a different number of ranks,
    rank ``r`` takes saved rank ``r % saved_world``'s generators and per-rank hook state, the
    gradients of an open accumulation cycle are averaged over the saved ranks, and the position
    in the epoch is mapped through the number of samples all ranks had consumed.
    """
    check_format(state, where)
    meta, ranks = state["meta"], state["ranks"]
    world, rank = distributed.world_size(), distributed.rank()
    saved_world = int(meta["world_size"])
    mine = ranks[rank % saved_world]
    engine_state = dict(state["engine"])
    if int(engine_state.get("micro_step", 0)) > 0:
        engine_state["partial_grads"] = mine["partial_grads"] if saved_world == world else _mean_grads(ranks)
    if "shards" in state:
        from ember.checkpoint.sharded import load_shards

        if source is None:
            raise CheckpointError(f"{where} is sharded: pass its directory to restore(..., source=...)")
        engine_state.update(load_shards(source, trainer.engine))
    try:
        trainer.engine.load_state_dict(engine_state)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # torch's "size mismatch for ..."
        raise CheckpointError(
            f"{where} does not fit this model and optimizer: {str(exc)[:2000]} "
            "(was it saved from another model, or with another optimizer?)"
        ) from exc
    trainer.load_state_dict(state["trainer"])
    _map_position(state, trainer, where)
    trainer.load_hook_states({**state["hooks"], **mine["hooks"]}, strict=strict)
    if saved_world != world:
        trainer.logger.warning(
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


def latest_metrics(history: Any) -> dict[str, float]:
    """The last recorded value of every metric in a :class:`~ember.trainer.History`."""
    return {name: history.latest(name) for name in history.names}


def _meta(trainer: Trainer, ts: Mapping[str, Any], engine_state: Mapping[str, Any], reason: str) -> dict[str, Any]:
    import ember

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
        "metrics": latest_metrics(trainer.history),
        "world_size": distributed.world_size(),
        "data_parallel_size": trainer.engine.data_parallel_size,
        "parallel": getattr(trainer.engine.parallel, "name", "none"),
        "ember_version": ember.__version__,
        "torch_version": str(torch.__version__),  # a str subclass the safe loader refuses
    }


def _sampler_state(trainer: Trainer, ts: Mapping[str, Any]) -> dict[str, Any]:
    loader = trainer.train_dataloader
    sampler = getattr(loader, "sampler", None)
    batch_size = getattr(loader, "batch_size", None)
    return {
        "epoch": ts["cur_epoch"],
        "position": None if batch_size is None else ts["epoch_iter"] * batch_size,
        "batches": ts["epoch_iter"],
        "batch_size": batch_size,
        "data_parallel_size": trainer.engine.data_parallel_size,
        "seed": getattr(sampler, "seed", None),
        "shuffle": getattr(sampler, "shuffle", None),
    }


def _map_position(state: Mapping[str, Any], trainer: Trainer, where: str) -> None:
    """Resume the epoch at the sample where the saved ranks together had got to.

    The ranks of a :class:`~ember.data.ResumableSampler` consume the epoch's order from its
    start, so ``batches × batch size × data-parallel size`` samples were consumed, whatever
    the number of ranks; the Trainer turns that into its own batches (rounded down, so no
    sample is skipped; a few may be seen twice when the split is uneven).
    """
    sampler = state["sampler"]
    if not sampler["batches"] or sampler["batch_size"] is None:
        return
    saved_dp = int(sampler["data_parallel_size"])
    consumed = int(sampler["batches"]) * int(sampler["batch_size"]) * saved_dp
    trainer.resume_epoch_at_sample(consumed)
    if saved_dp != trainer.engine.data_parallel_size:
        trainer.logger.warning(
            f"{where}: the epoch resumes after the {consumed} samples that its {saved_dp} rank(s) had consumed",
            ranks=[0],
        )


def _mean_grads(ranks: list[Mapping[str, Any]]) -> list[torch.Tensor | None]:
    per_rank = [r["partial_grads"] for r in ranks]
    out: list[torch.Tensor | None] = []
    for grads in zip(*per_rank, strict=True):
        present = [g for g in grads if g is not None]
        out.append(torch.stack(present).mean(0) if present else None)
    return out
