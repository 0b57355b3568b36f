"""Checking that a dict read from disk is an ember checkpoint that resuming can apply.

A file can load and still not be usable: cut short inside the pickle, written by something else
under a checkpoint's name, edited by hand. :func:`check_state` looks at every entry that
resuming reads (types and ranges of the counters, the sections, each rank's random generator
states, tried on scratch generators) so that a damaged file is refused when it is *read*, with
a :class:`~ember.errors.CheckpointError` naming the entry: ``resume="auto"`` can then fall back to
the checkpoint before it instead of failing half-way through restoring it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ember.checkpoint.state import as_tuple
from ember.errors import CheckpointError, describe

FORMAT = "ember.checkpoint"
VERSION = 1


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _positive(v: Any) -> bool:
    return _count(v) and v >= 1


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _epoch(v: Any) -> bool:
    return _count(v) or (isinstance(v, str) and v.isdigit())


_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "count": ("an int >= 0", _count),
    "positive": ("an int >= 1", _positive),
    "optional count": ("an int >= 0 or None", lambda v: v is None or _count(v)),
    "optional positive": ("an int >= 1 or None", lambda v: v is None or _positive(v)),
    "number": ("a number", _number),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("True or False", lambda v: isinstance(v, bool)),
    "dict": ("a dict", lambda v: isinstance(v, Mapping)),
    "list": ("a list", lambda v: isinstance(v, list | tuple)),
    "tensor": ("a tensor", lambda v: isinstance(v, torch.Tensor)),
}
_META = {"epoch": "count", "epoch_iter": "count", "step": "count", "world_size": "positive"}
_META_SHOWN = {"time": "number", "reason": "str", "micro_step": "count", "samples_seen": "count",
               "fit_active": "bool", "accumulation_micro_step": "count", "metrics": "dict",
               "data_parallel_size": "positive", "parallel": "str", "ember_version": "str",
               "torch_version": "str", "sizes": "dict"}  # fmt: skip
_ENGINE = {"micro_step": "count", "num_updates": "count", "skipped_updates": "count", "precision": "dict"}
_TRAINER = {"cur_epoch": "count", "epoch_iter": "count", "cur_step": "count", "micro_step": "count",
            "samples_seen": "count", "history": "dict"}  # fmt: skip
_SAMPLER = {"batches": "count", "batch_size": "optional positive", "data_parallel_size": "positive"}


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.where} is damaged: {what}; use an earlier checkpoint")

    def get(self, obj: Mapping[str, Any], path: str, key: str, kind: str, required: bool = True) -> Any:
        """``obj[key]``, checked to be of ``kind``; a missing optional key gives None."""
        if key not in obj:
            if required:
                raise self.fail(f"it has no {path}[{key!r}]")
            return None
        value = obj[key]
        allowed, ok = _KINDS[kind]
        if not ok(value):
            raise self.fail(f"its {path}[{key!r}] is {describe(value)}, not {allowed}")
        return value

    def fields(self, obj: Mapping[str, Any], path: str, kinds: Mapping[str, str], required: bool = True) -> None:
        for key, kind in kinds.items():
            self.get(obj, path, key, kind, required)


def check_format(state: Any, where: str) -> None:
    """Raise CheckpointError unless ``state`` is an ember checkpoint of a version this code reads.

    Only the format marker and the version; :func:`check_state` checks the rest.
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{where} is not an ember checkpoint (no 'format': {FORMAT!r}); for bare weights use "
            "model.load_state_dict(torch.load(path))"
        )
    version: Any = state.get("version")
    if not _positive(version):
        raise CheckpointError(
            f"{where} is damaged: its 'version' is {describe(version)}, not an int >= 1; use an earlier checkpoint"
        )
    if version > VERSION:
        raise CheckpointError(
            f"{where} has checkpoint format version {version}, newer than this ember reads ({VERSION}): upgrade ember"
        )


def check_state(state: Any, where: str) -> None:
    """Raise CheckpointError naming the entry unless ``state`` holds everything resuming reads, well typed.

    Args:
        state: what a checkpoint file (or a sharded checkpoint's state file) held.
        where: how to name it in the message ("checkpoint 'ckpt/ckpt-e0001-s000000010.ckpt'").
    """
    check_format(state, where)
    c = _Checker(where)
    sharded = "shards" in state
    sections = {"meta": "dict", "engine": "dict", "trainer": "dict", "hooks": "dict", "sampler": "dict",
                "ranks": "list"}  # fmt: skip
    c.fields(state, "state", sections)
    if sharded:
        c.get(state, "state", "shards", "dict")
    meta, engine, trainer, sampler, ranks = (state[k] for k in ("meta", "engine", "trainer", "sampler", "ranks"))
    c.fields(meta, "meta", _META)
    c.fields(meta, "meta", _META_SHOWN, required=False)
    if not all(isinstance(k, str) and _number(v) for k, v in (meta.get("metrics") or {}).items()):
        raise c.fail("its meta['metrics'] is not a dict of names to numbers")
    c.fields(engine, "engine", _ENGINE, required=False)
    if not sharded:
        model = c.get(engine, "engine", "model", "dict")
        if not all(isinstance(k, str) for k in model):
            raise c.fail("its engine['model'] is not a state dict (names to tensors)")
        optimizer = c.get(engine, "engine", "optimizer", "dict")
        if optimizer:  # {} on a checkpoint whose optimizer has no state of its own
            c.get(optimizer, "engine['optimizer']", "param_groups", "list")
    c.fields(trainer, "trainer", _TRAINER)
    values = c.get(trainer["history"], "trainer['history']", "values", "dict")
    if not all(isinstance(series, Mapping) and all(_epoch(e) and _number(v) for e, v in series.items())
               for series in values.values()):  # fmt: skip
        raise c.fail("its trainer['history'] is not a dict of metric names to {epoch: value}")
    c.fields(sampler, "sampler", _SAMPLER)
    if not all(isinstance(k, str) and isinstance(v, Mapping) for k, v in state["hooks"].items()):
        raise c.fail("its 'hooks' is not a dict of hook names to states")
    if len(ranks) != meta["world_size"]:
        raise c.fail(f"it has {len(ranks)} per-rank entries for meta['world_size'] = {meta['world_size']}")
    mid_cycle = (engine.get("micro_step") or 0) > 0
    for i, mine in enumerate(ranks):
        path = f"ranks[{i}]"
        if not isinstance(mine, Mapping):
            raise c.fail(f"its {path} is {describe(mine)}, not a dict")
        rng = c.get(mine, path, "rng", "dict")
        c.get(mine, path, "hooks", "dict")
        if mid_cycle and not sharded:
            c.get(mine, path, "partial_grads", "list")
        _dry_run(c, f"{path}['rng']", _apply_rng, rng)


def _dry_run(c: _Checker, path: str, apply: Callable[[Any], None], value: Any) -> None:
    """Apply ``value`` to a scratch object the way resuming will apply it to the real one."""
    try:
        apply(value)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError, OverflowError) as exc:
        raise c.fail(f"its {path} cannot be applied ({type(exc).__name__}: {str(exc)[:200]})") from None


def _apply_rng(rng: Mapping[str, Any]) -> None:
    """Set scratch Python, NumPy and torch generators from ``rng`` (what :func:`set_rng_state` restores)."""
    random.Random().setstate(as_tuple(rng["python"]))
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.RandomState().set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.Generator().set_state(rng["torch"])
    cuda = rng.get("cuda")
    if cuda is not None and not (isinstance(cuda, list | tuple) and all(isinstance(t, torch.Tensor) for t in cuda)):
        raise TypeError(f"'cuda' is {describe(cuda)}, not a list of generator states")
