"""ember's config keys: the schema table, value checks, normalisation and merging."""

from __future__ import annotations

import difflib
import math
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from ember.errors import ConfigError, describe

# ---------------------------------------------------------------------------------------------
# Value checks. Each takes (value, dotted key, full) and returns the normalized value; `full` is
# False while validating one side of a merge, so that defaults and required keys wait for the end.

_Check = Callable[[Any, str, bool], Any]
_NO_DEFAULT = object()


def _fail(key: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"config key '{key}' got {describe(value)}; allowed: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check(
    ok: Callable[[Any], bool], allowed: str, convert: Callable[[Any], Any] = lambda v: v, optional: bool = False
) -> _Check:
    """A check from a predicate: None passes when ``optional``; ``convert`` normalizes."""

    def check(value: Any, key: str, full: bool) -> Any:
        if value is None and optional:
            return None
        if not ok(value):
            _fail(key, value, allowed)
        return convert(value)

    return check


COUNT_MAX = 2**31 - 1
"""The largest count ember takes (accumulation, sizes, intervals): what torch keeps in an int32."""
SEED_MAX = 2**63 - 1
"""The largest seed: each rank seeds torch with ``seed + rank``, which must stay below 2**64."""


def _int(low: int, high: int = COUNT_MAX, optional: bool = False) -> _Check:
    allowed = f"an int from {low} to {high}"
    ok = lambda v: _is_int(v) and low <= v <= high  # noqa: E731
    return _check(ok, allowed + " or None" * optional, int, optional)


def _finite(value: Any) -> bool:
    """A real number that is finite as a float (a huge int is not: float() overflows)."""
    if not _is_real(value):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _real(low: float, high: float = float("inf"), allowed: str = "a number > 0") -> _Check:
    return _check(lambda v: _finite(v) and low < v < high, allowed, float)


def _choice(*options: str, optional: bool = False) -> _Check:
    allowed = ", ".join(map(repr, options)) + " or None" * optional
    ok = lambda v: isinstance(v, str) and v.lower() in options  # noqa: E731
    return _check(ok, allowed, str.lower, optional)


def _is(*types: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, types)


_BOOL = _check(_is(bool), "True or False")
_ANY = _check(lambda v: True, "anything")
_OPT_BOOL = _check(_is(bool), "True, False or None", optional=True)
_OPT_STR = _check(_is(str), "a string or None", optional=True)
_OPT_DICT = _check(_is(Mapping), "a dict or None", dict, optional=True)
_NAME_OR_FN = _check(lambda v: isinstance(v, str) or callable(v), "a name or a callable")
_CLIP = _check(
    lambda v: _finite(v) and v > 0,
    "a number > 0 or None (use a positive max norm, or None to disable)",
    float,
    optional=True,
)
_CLIP_VALUE = _check(
    lambda v: _finite(v) and v > 0,
    "a number > 0 or None (each gradient element is clamped to [-value, value]; None disables)",
    float,
    optional=True,
)
_NAMES = _check(
    lambda v: isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v),
    "a list of module names (strings) or None",
    list,
    optional=True,
)
_AMP_NAMES: dict[str, str | None] = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16"}
_AMP_NAMES |= {"float16": "fp16", "half": "fp16", "none": None, "no": None, "fp32": None}


def _amp(value: Any, key: str, full: bool) -> str | None:
    name = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    if name is None or name is False:
        return None
    if not isinstance(name, str) or name.lower() not in _AMP_NAMES:
        _fail(key, value, "None, 'bf16' or 'fp16' (also 'bfloat16', 'float16', 'half')")
    return _AMP_NAMES[name.lower()]


def _handlers(value: Any, key: str, full: bool) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        if not callable(value):
            _fail(key, value, "a callable fn(parameters) -> None, or a list of them")
        return [value]
    for i, fn in enumerate(value):
        if not callable(fn):
            hint = " (registry dicts such as dict(type=...) are not supported)"
            _fail(
                f"{key}[{i}]",
                fn,
                "a callable fn(parameters: list[torch.nn.Parameter]) -> None" + hint * isinstance(fn, Mapping),
            )
    return list(value)


@dataclass(frozen=True)
class _Field:
    check: _Check
    default: Any = _NO_DEFAULT  # run through `check` when filled in, so sections fill themselves
    required: bool = False


class _Section:
    """A dict of known sub-keys; None means {}; a bare int means {shorthand: int}."""

    def __init__(self, fields: dict[str, _Field], shorthand: str | None = None) -> None:
        self.fields = fields
        self.shorthand = shorthand

    def __call__(self, value: Any, key: str, full: bool) -> dict[str, Any]:
        if value is None:
            value = {}
        elif self.shorthand is not None and _is_int(value):
            value = {self.shorthand: value}
        elif not isinstance(value, Mapping):
            extra = f" or an int ({self.shorthand})" if self.shorthand else ""
            _fail(key, value, f"a dict with keys {', '.join(self.fields)}{extra}")
        out: dict[str, Any] = {}
        for sub, sub_value in value.items():
            if sub not in self.fields:
                close = difflib.get_close_matches(str(sub).lower(), self.fields, n=1)
                allowed = f"allowed in '{key}': {', '.join(self.fields)}"
                hint = f"did you mean '{key}.{close[0]}'? ({allowed})" if close else allowed
                raise ConfigError(f"config key '{key}.{sub}' is not an ember setting; {hint}")
            out[sub] = self.fields[sub].check(sub_value, f"{key}.{sub}", full)
        for sub, field in self.fields.items() if full else ():
            if sub not in out and field.required:
                raise ConfigError(f"config key '{key}.{sub}' is required when '{key}' is set")
            if sub not in out and field.default is not _NO_DEFAULT:
                out[sub] = field.check(field.default, f"{key}.{sub}", full)
        return {sub: out[sub] for sub in self.fields if sub in out}


def _zero(value: Any, key: str, full: bool) -> dict[str, Any] | None:
    return None if value is None or value is False else _ZERO(value, key, full)


def _compile(value: Any, key: str, full: bool) -> bool | dict[str, Any]:
    if isinstance(value, bool):
        return value
    if not isinstance(value, Mapping):
        _fail(key, value, "True, False or a dict of torch.compile keyword arguments")
    return _COMPILE(value, key, full) or True  # compile=dict() means: compile with defaults


_TORCH_SCALER = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
_SCALER_FIELDS = {
    "init_scale": _Field(_real(0)),
    "growth_factor": _Field(_real(1, allowed="a number > 1")),
    "backoff_factor": _Field(_real(0, 1, allowed="a number between 0 and 1 (exclusive)")),
    "growth_interval": _Field(_int(1)),
    "enabled": _Field(_BOOL),
    # master_weights=True only (ember.amp.LossScale; torch's GradScaler has none of them)
    "hysteresis": _Field(_int(1)),
    "min_scale": _Field(_real(0)),
    "max_scale": _Field(_real(0)),
}
_ZERO = _Section(
    {
        "stage": _Field(_int(1, 3), required=True),
        "mixed_precision": _Field(_amp, None),
        "cpu_offload": _Field(_BOOL, False),
    },
    shorthand="stage",
)
_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_COMPILE = _Section(
    {
        "mode": _Field(_choice(*_COMPILE_MODES, optional=True)),
        "fullgraph": _Field(_BOOL),
        "dynamic": _Field(_OPT_BOOL),
        "backend": _Field(_NAME_OR_FN),
        "options": _Field(_OPT_DICT),
        "disable": _Field(_BOOL),
    }
)
_TENSOR = _Section(
    {
        "size": _Field(_int(1), 1),
        "mode": _Field(_choice("1d", "2d", "2.5d", "3d", optional=True), None),
        "depth": _Field(_int(1, optional=True), None),  # the 2.5-D mode's d (size = d × q²)
        "plan": _Field(_ANY, None),
    },
    shorthand="size",
)
_PIPELINE = _Section(
    {
        "size": _Field(_int(1), 1),
        "microbatches": _Field(_int(1, optional=True), None),
        "schedule": _Field(_choice("gpipe", "1f1b"), "gpipe"),
        "split_points": _Field(_NAMES, None),
    },
    shorthand="size",
)


# -- context parallelism and activation checkpointing (ember.parallel.context_parallel, .checkpointing)
def _seq_dim(value: Any, key: str, full: bool) -> int | dict[Any, int | None]:
    """One dim for every batch tensor, or ``{key or position: dim or None}``."""
    if _is_int(value) and value >= 0:
        return int(value)
    if isinstance(value, Mapping) and all(v is None or (_is_int(v) and v >= 0) for v in value.values()):
        return dict(value)
    _fail(key, value, "an int >= 0 (every batch tensor's sequence dim), or a dict {batch key or position: dim or None}")


_CONTEXT = _Section(
    {
        "size": _Field(_int(1), 1),
        "seq_dim": _Field(_seq_dim, 1),
        "load_balance": _Field(_BOOL, True),  # zig-zag: rank r holds chunks r and 2N-1-r of 2N
    },
    shorthand="size",
)
_CHECKPOINT_TYPES = _check(
    lambda v: isinstance(v, (list, tuple)) and all(isinstance(t, (str, type)) for t in v),
    "a list of module class names or classes, or None",
    list,
    optional=True,
)
_CHECKPOINTING = _Section(
    {"modules": _Field(_NAMES, None), "types": _Field(_CHECKPOINT_TYPES, None), "every": _Field(_int(1), 1)}
)


def _checkpointing(value: Any, key: str, full: bool) -> dict[str, Any] | None:
    """None/False: off; True: every block of every nn.ModuleList; a dict: which modules."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        _fail(key, value, "True, False, None or a dict with keys modules, types, every")
    return _CHECKPOINTING(value, key, full)


def _fold_sequence(data: dict[str, Any]) -> None:
    """Colossal-AI's ``parallel.tensor = dict(size=N, mode="sequence")`` -> ``parallel.context``
    (contiguous slices, as Colossal-AI's sequence parallelism cuts them); its
    ``SequenceParallelGradientHandler`` is what ember's context policy does, so it is dropped."""
    parallel = data.get("parallel")
    if not isinstance(parallel, Mapping):
        return
    tensor = parallel.get("tensor")
    if not isinstance(tensor, Mapping) or str(tensor.get("mode", "")).lower() != "sequence":
        return
    if parallel.get("context") not in (None, 1):
        raise ConfigError(
            f"config parallel.tensor.mode='sequence' and parallel.context={parallel['context']!r} both split the "
            "sequence: keep one (tensor=dict(size=N, mode='sequence') means context=dict(size=N, load_balance=False))"
        )
    rest = {k: v for k, v in tensor.items() if k not in ("size", "mode")}
    if rest:
        raise ConfigError(f"config parallel.tensor.mode='sequence' takes only 'size'; remove {', '.join(rest)}")
    context = {"size": tensor.get("size", 1), "load_balance": False}
    data["parallel"] = {**{k: v for k, v in parallel.items() if k != "tensor"}, "context": context}
    handlers = data.get("gradient_handler")
    if isinstance(handlers, (list, tuple)):
        data["gradient_handler"] = [h for h in handlers if not _names_handler(h, "SequenceParallelGradientHandler")]


def _names_handler(handler: Any, name: str) -> bool:
    return isinstance(handler, Mapping) and handler.get("type") == name


# -- end of context parallelism and activation checkpointing


_PARALLEL = _Section(
    {
        "data": _Field(_int(1, optional=True), None),
        "tensor": _Field(_TENSOR, None),
        "pipeline": _Field(_PIPELINE, None),
        "context": _Field(_CONTEXT, None),  # splits each sequence (ember.layout, ember.parallel.context_parallel)
        "expert": _Field(_int(1, optional=True), None),  # splits data: the ranks that exchange tokens
    }
)
_DDP = _Section(
    {
        "find_unused_parameters": _Field(_BOOL),
        "broadcast_buffers": _Field(_BOOL),
        "bucket_cap_mb": _Field(_real(0)),
        "static_graph": _Field(_BOOL),
        "gradient_as_bucket_view": _Field(_BOOL),
    }
)
_SCHEMA: dict[str, _Field] = {
    "amp": _Field(_amp, None),
    "master_weights": _Field(_BOOL, False),  # parameters in amp's dtype, fp32 masters in the optimizer
    "grad_scaler": _Field(_Section(_SCALER_FIELDS), None),
    "gradient_accumulation": _Field(_int(1), 1),
    "clip_grad_norm": _Field(_CLIP, None),
    "clip_grad_value": _Field(_CLIP_VALUE, None),
    "gradient_handler": _Field(_handlers, None),
    "parallel": _Field(_PARALLEL, None),
    "zero": _Field(_zero, None),
    "compile": _Field(_compile, False),
    "seed": _Field(_int(0, SEED_MAX, optional=True), None),
    "deterministic": _Field(_BOOL, False),
    "ddp": _Field(_DDP, None),
    "nonfinite_loss": _Field(_choice("error", "warn", "ignore"), "error"),
    "activation_checkpointing": _Field(_checkpointing, None),
}
# Accepted on input and folded into the keys above (docs/config.md "Aliases"): fp16 -> amp +
# grad_scaler (+ master_weights for mode=NAIVE), parallel.moe and max_ep_size -> parallel.expert
# are permanent (Colossal-AI's configs, ember.compat.colossalai); the top-level
# find_unused_parameters -> ddp is deprecated and warns.
_FP16 = _Section({"mode": _Field(_ANY), **{k: v for k, v in _SCALER_FIELDS.items() if k in _TORCH_SCALER}})
# Colossal-AI's NAIVE options, by their names there: ember's name, or None when accepted and unused.
_NAIVE_NAMES = {"initial_scale": "init_scale", "growth_factor": "growth_factor", "backoff_factor": "backoff_factor",
                "growth_interval": "growth_interval", "hysteresis": "hysteresis", "min_scale": "min_scale",
                "max_scale": "max_scale", "clip_grad_norm": "clip_grad_norm", "verbose": None,
                "log_num_zeros_in_grad": None, "dynamic_grad_scale": None}  # fmt: skip
_NAIVE = _Section(
    {"mode": _Field(_ANY), "clip_grad_norm": _Field(_CLIP)}
    | {name: _SCALER_FIELDS[ours] for name, ours in _NAIVE_NAMES.items() if ours in _SCALER_FIELDS}
    | {name: _Field(_BOOL) for name, ours in _NAIVE_NAMES.items() if ours is None}
)
_KNOWN = (*_SCHEMA, "fp16", "find_unused_parameters", "max_ep_size")


# Other libraries' names for ember's settings: users bring them along, and a typo must never
# silently do nothing, so each is an error naming ember's key.
_PEER_ALIASES: dict[str, tuple[str, str]] = {
    "clip_grad": ("clip_grad_norm", "mmengine"),
    "grad_clip": ("clip_grad_norm", "mmcv/mmdet"),
    "max_grad_norm": ("clip_grad_norm", "HF Transformers/accelerate"),
    "gradient_clip_val": ("clip_grad_norm", "Lightning"),
    "gradient_clipping": ("clip_grad_norm", "DeepSpeed"),
    "max_norm": ("clip_grad_norm", "torch.nn.utils.clip_grad_norm_"),
    "gradient_clip_value": ("clip_grad_value", "pytorch-accelerated"),
    "clip_value": ("clip_grad_value", "torch.nn.utils.clip_grad_value_"),
    "gradient_accumulation_steps": ("gradient_accumulation", "HF Transformers/accelerate/pytorch-accelerated"),
    "accumulate_grad_batches": ("gradient_accumulation", "Lightning"),
    "grad_accum": ("gradient_accumulation", "common scripts"),
    "accumulation_steps": ("gradient_accumulation", "common scripts"),
    "mixed_precision": ("amp", "accelerate"),
    "precision": ("amp", "Lightning"),
    "bf16": ("amp", "HF Transformers"),
    "use_amp": ("amp", "common scripts"),
    "zero_optimization": ("zero", "DeepSpeed"),
    "zero_stage": ("zero", "common scripts"),
    "torch_compile": ("compile", "HF Transformers"),
    "ddp_find_unused_parameters": ("ddp", "HF Transformers"),
    "tensor_parallel_size": ("parallel", "Megatron/vLLM"),
    "pipeline_parallel_size": ("parallel", "Megatron"),
    "data_parallel_size": ("parallel", "Megatron"),
    "random_seed": ("seed", "common scripts"),
    "gradient_checkpointing": ("activation_checkpointing", "HF Transformers"),
    "checkpoint_activations": ("activation_checkpointing", "Megatron/DeepSpeed"),
    "context_parallel_size": ("parallel", "Megatron/torchtitan"),
    "sequence_parallel_size": ("parallel", "DeepSpeed"),
}


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) that turn ``a`` into ``b``."""
    previous, current = list(range(len(b) + 1)), [0] * (len(b) + 1)
    before_previous: list[int] = []
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before_previous[j - 2] + 1)
        before_previous, previous = previous, current
    return previous[len(b)]


def _near_miss(key: str) -> str | None:
    """ember's key that ``key`` is probably a typo of: within 1 edit of a short key, 2 of a longer one."""
    lowered = key.lower()
    best = min(_KNOWN, key=lambda known: edit_distance(lowered, known))
    allowed = 1 if len(best) <= 5 else 2
    return best if edit_distance(lowered, best) <= allowed else None


def _check_names(data: Mapping[str, Any]) -> None:
    """Unknown top-level keys are the user's, unless they are typos or other libraries' names of ember's keys.

    Keys in capitals (``BATCH_SIZE``) are the user's constants and never flagged.
    """
    for key in data:
        if not isinstance(key, str) or key in _KNOWN or key.isupper():
            continue
        alias = _PEER_ALIASES.get(key.lower())
        if alias is not None:
            ours, peer = alias
            raise ConfigError(
                f"config key '{key}' is {peer}'s name, not an ember setting; did you mean '{ours}'? "
                f"(see docs/config.md for '{ours}'; write your own constants in capitals, e.g. '{key.upper()}')"
            )
        close = _near_miss(key)
        if close is not None:
            raise ConfigError(
                f"config key '{key}' is not an ember setting; did you mean '{close}'? (rename it; unknown keys "
                f"are kept only when they are not near-misses of ember's keys, and keys in capitals always are)"
            )


_FP16_CHOICES = (
    "fp16=dict(mode='torch') (AMP_TYPE.TORCH: autocast + GradScaler, ember's amp='fp16'), fp16=dict(mode='naive') "
    "(AMP_TYPE.NAIVE: fp16 weights with fp32 master copies, ember's amp='fp16', master_weights=True), or amp='bf16'"
)


def _fold_fp16(data: dict[str, Any]) -> None:
    """Colossal-AI's ``fp16=dict(mode=..., **options)``: ``AMP_TYPE.TORCH`` -> amp="fp16" + grad_scaler;
    ``AMP_TYPE.NAIVE`` -> the same with master_weights=True (its options by ember's names)."""
    fp16 = data.pop("fp16")
    if fp16 is None or fp16 is False:
        return
    if not isinstance(fp16, Mapping):  # Colossal-AI reads fp16.mode: True was an AttributeError there
        raise ConfigError(f"config key 'fp16' got {describe(fp16)}; Colossal-AI's fp16 is a dict: {_FP16_CHOICES}")
    mode = fp16.get("mode", "torch")
    mode = getattr(mode, "value", mode)  # Colossal-AI's AMP_TYPE members are an Enum
    if mode is None:  # Colossal-AI's way of saying "no AMP"
        return
    if not isinstance(mode, str) or mode.lower() not in ("torch", "naive"):
        raise ConfigError(
            f"config key 'fp16.mode' got {describe(mode)}; ember runs {_FP16_CHOICES} (apex is not a dependency)"
        )
    naive = mode.lower() == "naive"
    kwargs = (_NAIVE if naive else _FP16)(fp16, "fp16", False)
    kwargs.pop("mode", None)
    settings: dict[str, Any] = {"amp": "fp16"}
    if naive:
        _check_naive(kwargs)
        settings["master_weights"] = True
        if "clip_grad_norm" in kwargs:
            settings["clip_grad_norm"] = kwargs.pop("clip_grad_norm")
        kwargs = {ours: v for k, v in kwargs.items() if (ours := _NAIVE_NAMES[k]) is not None}
    for key, value in settings.items():
        ours = _SCHEMA[key].check(data.get(key), key, False) if key in data else None
        if ours is not None and ours != value:
            raise ConfigError(
                f"config keys 'fp16' and '{key}' disagree (fp16={fp16!r}, {key}={data[key]!r}): keep one of them "
                f"(fp16=dict(mode={mode!r}) means {', '.join(f'{k}={v!r}' for k, v in settings.items())})"
            )
        data[key] = value
    _fold_into(data, "grad_scaler", kwargs, "fp16.{sub}")


def _check_naive(options: dict[str, Any]) -> None:
    """NAIVE options with no ember counterpart are refused, or dropped when they would change nothing."""
    if options.pop("log_num_zeros_in_grad", False):
        raise ConfigError(
            "config key 'fp16.log_num_zeros_in_grad=True' has no ember counterpart (ember does not count zero "
            "gradients): remove it"
        )
    if options.pop("dynamic_grad_scale", True) is False:
        raise ConfigError(
            "config key 'fp16.dynamic_grad_scale=False' (a constant loss scale) has no ember counterpart: remove it "
            "(the scale is dynamic; a very large fp16.growth_interval keeps it nearly constant)"
        )
    options.pop("verbose", None)  # ember logs every skipped update and the lowered scale anyway


def _fold_moe(data: dict[str, Any]) -> None:
    """Colossal-AI's expert-parallel size: ``max_ep_size=E`` or ``parallel.moe=dict(size=E)`` -> parallel.expert."""
    sources = {"max_ep_size": data.pop("max_ep_size")} if "max_ep_size" in data else {}
    parallel = data.get("parallel")
    if isinstance(parallel, Mapping) and "moe" in parallel:
        moe = parallel["moe"]
        data["parallel"] = {k: v for k, v in parallel.items() if k != "moe"}
        if not (isinstance(moe, Mapping) and set(moe) == {"size"}):
            _fail("parallel.moe", moe, "dict(size=E), Colossal-AI's expert-parallel size (ember: parallel.expert=E)")
        sources["parallel.moe.size"] = moe["size"]
    for name, size in sources.items():
        _fold_into(data, "parallel", {"expert": _int(1)(size, name, False)}, name)
    handlers = data.get("gradient_handler")  # Colossal-AI's MoeGradientHandler is the expert-parallel policy's work
    if isinstance(handlers, (list, tuple)):
        data["gradient_handler"] = [h for h in handlers if not _names_handler(h, "MoeGradientHandler")]


def _deprecated(key: str, instead: str) -> None:
    """A DeprecationWarning for an alias, attributed to the first caller outside ember (shown there)."""
    package = os.path.dirname(os.path.dirname(__file__))
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"config key '{key}' is deprecated and will be removed: write {instead} (docs/config.md, Aliases)",
        DeprecationWarning,
        stacklevel=level,
    )


def _fold_into(data: dict[str, Any], section: str, values: Mapping[str, Any], source: str) -> None:
    """Move alias values into a section; ``source`` names them (``{sub}`` is filled in)."""
    existing = data.get(section) or {}
    if not isinstance(existing, Mapping):
        return  # the section's own check reports its type
    for sub, value in values.items():
        if sub in existing and existing[sub] != value:
            ours, theirs = source.format(sub=sub), f"{section}.{sub}"
            raise ConfigError(
                f"config keys '{ours}' and '{theirs}' disagree ({ours}={value!r}, "
                f"{theirs}={existing[sub]!r}): set it in one place"
            )
    data[section] = {**existing, **values}


def _normalize(source: Mapping[str, Any], full: bool) -> dict[str, Any]:
    """Validate ember's keys; with ``full``, also fill defaults and check required keys."""
    data = dict(source)
    _check_names(data)
    if "fp16" in data:
        _fold_fp16(data)
    _fold_moe(data)
    if "parallel" in data:
        _fold_sequence(data)
    if "find_unused_parameters" in data:
        _deprecated("find_unused_parameters", "ddp=dict(find_unused_parameters=...)")
        flag = _BOOL(data.pop("find_unused_parameters"), "find_unused_parameters", full)
        _fold_into(data, "ddp", {"find_unused_parameters": flag}, "find_unused_parameters")
    out: dict[str, Any] = {}
    for key, field in _SCHEMA.items():
        if key in data:
            out[key] = field.check(data[key], key, full)
        elif full:
            out[key] = field.check(field.default, key, full)
    out.update((k, v) for k, v in data.items() if k not in _SCHEMA)
    return out


def _merge(base: Mapping[Any, Any], extra: Mapping[Any, Any]) -> dict[Any, Any]:
    """Deep merge into a new dict: mappings merge key by key, anything else in ``extra`` wins."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        both = isinstance(old, Mapping) and isinstance(value, Mapping)
        out[key] = _merge(old, value) if both else value  # type: ignore[arg-type]
    return out
