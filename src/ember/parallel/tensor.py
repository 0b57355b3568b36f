"""Tensor parallelism: check a plan against the model, then apply it with ``parallelize_module``.

The plan comes from ``parallel.tensor.plan`` (see :mod:`ember.parallel.plans`); without one,
:func:`~ember.parallel.plans.recognise` looks for the blocks ember has ready plans for. The
styles are torch's own (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``), applied
on the mesh's ``"tensor"`` dimension; the parameters they touch become DTensors.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from ember.errors import ConfigError
from ember.parallel.plans import recognise

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

STYLE_NAMES = ("colwise", "rowwise", "sequence")
_SPLITS = {"colwise": "out_features", "rowwise": "in_features"}


def resolve_plan(model: nn.Module, plan: Any, size: int) -> dict[str, Any]:
    """Expand a plan's patterns to the model's module names and check each entry.

    Args:
        model: the user's model.
        plan: ``parallel.tensor.plan``: a mapping of pattern -> style, or None to recognise one.
        size: the tensor-parallel size (dims split column- or row-wise must divide by it).

    Returns:
        ``{module name: "colwise" | "rowwise" | "sequence" | ParallelStyle}``.

    Raises:
        ConfigError: no plan and nothing recognised; a pattern that matches no module; an
            unknown style; a style on a module it cannot split; a dimension not divisible.
    """
    if plan is None:
        plan = recognise(model)
        if not plan:
            raise ConfigError(
                f"config parallel.tensor.size={size} needs a plan, and ember recognises no block of "
                f"{type(model).__name__} (it knows q_proj/k_proj/v_proj/out_proj attention, fc1/fc2-style "
                "MLPs and Sequential(Linear, activation, Linear)): add parallel.tensor.plan={module name: "
                "'colwise' | 'rowwise' | 'sequence'}, e.g. plan=ember.parallel.plans.mlp('fc1', 'fc2', "
                f"prefix='blocks.*.mlp'). Its Linear layers: {_linears(model)}"
            )
    if not isinstance(plan, Mapping) or not plan:
        raise ConfigError(
            f"config parallel.tensor.plan must be a non-empty dict of module name -> style, got {type(plan).__name__}"
        )
    modules = dict(model.named_modules())
    names = [n for n in modules if n]
    resolved: dict[str, Any] = {}
    for pattern, style in plan.items():
        if not isinstance(pattern, str):
            raise ConfigError(f"config parallel.tensor.plan keys must be module names (strings), got {pattern!r}")
        style = _check_style(pattern, style)
        matches = [pattern] if pattern in modules else fnmatch.filter(names, pattern)
        if not matches:
            close = difflib.get_close_matches(str(pattern), names, n=3)
            hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
            raise ConfigError(
                f"config parallel.tensor.plan entry {pattern!r} matches no module of {type(model).__name__}: "
                f"{hint}its modules are {_shown(names)}"
            )
        for name in matches:
            if name in resolved and resolved[name] != style:
                raise ConfigError(
                    f"config parallel.tensor.plan gives module {name!r} two styles ({resolved[name]!r} and "
                    f"{style!r}, the second from pattern {pattern!r}): keep one"
                )
            _check_module(name, modules[name], style, size)
            resolved[name] = style
    return resolved


def apply_tensor_parallel(model: nn.Module, plan: Mapping[str, Any], mesh: DeviceMesh) -> None:
    """Apply a resolved plan to ``model`` in place on the 1-D ``mesh`` (the ``"tensor"`` dim)."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh, {name: _style(style) for name, style in plan.items()})


def _style(style: Any) -> ParallelStyle:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    classes = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel, "sequence": SequenceParallel}
    return classes[style]() if isinstance(style, str) else style


def _check_style(pattern: Any, style: Any) -> Any:
    from torch.distributed.tensor.parallel import ParallelStyle

    if isinstance(style, ParallelStyle):
        return style
    if isinstance(style, str) and style.lower() in STYLE_NAMES:
        return style.lower()
    raise ConfigError(
        f"config parallel.tensor.plan[{pattern!r}] got {style!r}; allowed: 'colwise', 'rowwise', 'sequence' "
        "or a torch.distributed.tensor.parallel ParallelStyle (ColwiseParallel(), RowwiseParallel(), ...)"
    )


def _check_module(name: str, module: nn.Module, style: Any, size: int) -> None:
    if style not in _SPLITS:
        return
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise ConfigError(
            f"config parallel.tensor.plan gives {name!r} the style {style!r}, but it is a {type(module).__name__}: "
            "'colwise' and 'rowwise' split nn.Linear and nn.Embedding only (plan the Linears inside it)"
        )
    attr = _SPLITS[style] if isinstance(module, nn.Linear) else {"colwise": "embedding_dim"}.get(style)
    if attr is not None and getattr(module, attr) % size:
        raise ConfigError(
            f"config parallel.tensor.plan splits {name!r} {style} across {size} ranks, but its {attr}="
            f"{getattr(module, attr)} does not divide by {size}: choose a tensor size that divides it"
        )


def _linears(model: nn.Module) -> str:
    return _shown([n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]) or "none"


def _shown(names: list[str], limit: int = 12) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")
