"""Activation checkpointing from the config: chosen blocks keep only their inputs in the forward
pass and recompute the rest in the backward pass.

``activation_checkpointing = True`` checkpoints every block of every ``nn.ModuleList`` (a
transformer's layers); a dict chooses::

    activation_checkpointing = dict(
        modules=["blocks.*.mlp"],   # fnmatch patterns over module names, or None
        types=["Block"],            # module classes, or their names, or None
        every=2,                    # of the modules chosen, every 2nd (the 1st, 3rd, ...)
    )

``modules`` and ``types`` together choose what either matches; neither chooses the ModuleList
blocks. A module inside another chosen one is left out (the outer one recomputes it anyway).

Underneath is torch's non-reentrant :func:`torch.utils.checkpoint.checkpoint` with the random
state preserved (``preserve_rng_state=True``): the recomputation draws the same dropout masks,
runs under the same autocast, and the gradients are bitwise those of the model without
checkpointing on the CPU. Each chosen module's ``forward`` is replaced on the instance, so its
parameters, ``state_dict`` keys and hooks stay as they were, and it composes with every
parallel mode (DDP, ZeRO/FSDP2 wrap the module from outside; tensor-parallel layers inside it
are recomputed through their own hooks; under context parallelism the recomputed attention
takes the ring again, :func:`~ember.parallel.context_parallel.recompute_context`) and with
``torch.compile``.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from ember.errors import ConfigError
from ember.logging import get_dist_logger
from ember.parallel.context_parallel import recompute_context

__all__ = ["apply_activation_checkpointing", "checkpoint", "checkpointed_modules"]

T = TypeVar("T")


class _Checkpointed:
    """A module's ``forward`` run under checkpointing (an instance attribute; a class, not a
    closure, so that ``copy.deepcopy`` and pickling carry it over to the copy's own module)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(type(self.module).forward, self.module, *args, **kwargs)


def checkpointed_modules(model: nn.Module, spec: Mapping[str, Any] | None) -> list[str]:
    """The names of the modules that ``spec`` (``activation_checkpointing``) chooses in ``model``.

    Args:
        model: the model.
        spec: the config section: ``modules`` (name patterns), ``types`` (classes or class
            names), ``every`` (keep every k-th); None chooses nothing.

    Returns:
        The chosen module names, in the model's order (outermost only).

    Raises:
        ConfigError: a pattern or type that matches no module (the message names the model's
            modules or classes, with a did-you-mean), or nothing chosen at all.

    Example:
        >>> checkpointed_modules(gpt, {"every": 2})
        ['blocks.0', 'blocks.2']
    """
    if spec is None:
        return []
    named = [(name, m) for name, m in model.named_modules() if name]
    patterns: Sequence[str] = spec.get("modules") or ()
    types: Sequence[str | type] = spec.get("types") or ()
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name, _ in named):
            close = difflib.get_close_matches(pattern, [n for n, _ in named], n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ConfigError(
                f"config activation_checkpointing.modules entry {pattern!r} matches no module of "
                f"{type(model).__name__}{hint}; its modules: {_listing([n for n, _ in named])}"
            )
    for kind in types:
        if not any(_is_type(m, kind) for _, m in named):
            classes = sorted({type(m).__name__ for _, m in named})
            raise ConfigError(
                f"config activation_checkpointing.types entry {_type_name(kind)!r} is the class of no module of "
                f"{type(model).__name__}; its module classes: {_listing(classes)}"
            )
    if patterns or types:
        chosen = [
            name
            for name, m in named
            if any(fnmatch.fnmatchcase(name, p) for p in patterns) or any(_is_type(m, t) for t in types)
        ]
    else:
        lists = {name for name, m in named if isinstance(m, nn.ModuleList)}
        chosen = [name for name, _ in named if name.rpartition(".")[0] in lists]
        if not chosen:
            raise ConfigError(
                f"config activation_checkpointing=True checkpoints the blocks of nn.ModuleLists, and "
                f"{type(model).__name__} has none: choose modules with activation_checkpointing=dict(modules=[...]) "
                f"or types=[...]; its modules: {_listing([n for n, _ in named])}"
            )
    outermost = [n for n in chosen if not any(n.startswith(o + ".") for o in chosen if o != n)]
    return outermost[:: int(spec.get("every") or 1)]


def apply_activation_checkpointing(model: nn.Module, spec: Mapping[str, Any] | None) -> list[str]:
    """Checkpoint the modules of ``model`` that ``spec`` chooses (see :func:`checkpointed_modules`).

    Each chosen module's forward then runs under torch's non-reentrant checkpoint with the RNG
    state preserved; applying it twice changes nothing. Logs the chosen names on rank 0.

    Args:
        model: the user's model, before any parallel wrapping.
        spec: the ``activation_checkpointing`` config section (None: nothing to do).

    Returns:
        The names of the checkpointed modules.

    Raises:
        ConfigError: see :func:`checkpointed_modules`.

    Example:
        >>> apply_activation_checkpointing(model, {"types": ["Block"], "every": 1})
        ['blocks.0', 'blocks.1', 'blocks.2', 'blocks.3']
    """
    names = checkpointed_modules(model, spec)
    for name in names:
        module = model.get_submodule(name)
        if not isinstance(module.__dict__.get("forward"), _Checkpointed):
            module.forward = _Checkpointed(module)
    if names:
        get_dist_logger().info(f"activation checkpointing: {len(names)} module(s): {_listing(names)}", ranks=[0])
    return names


def checkpoint(function: Callable[..., T], *args: Any, offload: bool = False, **kwargs: Any) -> T:
    """Run ``function(*args, **kwargs)`` keeping only its inputs; recompute it in the backward pass.

    torch's non-reentrant checkpoint with the RNG state preserved, so dropout inside draws the
    same masks again. With ``offload=True`` the tensors kept for the recomputation wait in host
    memory (copied there now, back to their device when recomputing): it saves accelerator
    memory; on the CPU there is nothing to move and it is noted once in the log.

    Args:
        function: the computation (a module, or any callable of tensors).
        *args: its positional inputs.
        offload: keep the saved inputs in host memory instead of on the accelerator.
        **kwargs: its keyword inputs.

    Returns:
        What ``function`` returns.

    Example:
        >>> y = checkpoint(self.mlp, x)                 # inside a forward
    """
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if offload and devices - {torch.device("cpu")}:
        back = tuple(a.device if isinstance(a, torch.Tensor) else None for a in args)
        args = tuple(a.to("cpu") if isinstance(a, torch.Tensor) else a for a in args)
        function = _OnDevice(function, back)
    elif offload:
        _note_cpu_offload()
    recompute = recompute_context()  # context parallelism: the recomputed attention takes the ring again
    if recompute is not None:  # (torch.compile cannot trace a context_fn: pass one only when needed)
        kwargs["context_fn"] = lambda: (contextlib.nullcontext(), recompute)
    return _torch_checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


class _OnDevice:
    """``function`` called with its host copies moved back to the devices they came from."""

    def __init__(self, function: Callable[..., Any], devices: tuple[torch.device | None, ...]) -> None:
        self.function, self.devices = function, devices

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        moved = [a.to(d) if d is not None else a for a, d in zip(args, self.devices, strict=True)]
        return self.function(*moved, **kwargs)


_NOTED = False


def _note_cpu_offload() -> None:
    global _NOTED
    if not _NOTED:
        _NOTED = True
        get_dist_logger().info(
            "activation offload asked for tensors on the CPU: they already live in host memory, nothing is moved "
            "(offloading saves accelerator memory only)",
            ranks=[0],
        )


def _is_type(module: nn.Module, kind: str | type) -> bool:
    if isinstance(kind, type):
        return isinstance(module, kind)
    return kind in (type(module).__name__, f"{type(module).__module__}.{type(module).__qualname__}")


def _type_name(kind: str | type) -> str:
    return kind if isinstance(kind, str) else kind.__qualname__


def _listing(names: Sequence[str], limit: int = 12) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")
