"""Configs: load a Python file, YAML/JSON file or mapping, validate ember's keys, fill defaults.

A config is a plain :class:`Config` (a ``dict`` with attribute access). ember's own keys are
checked against a small schema table (``_SCHEMA``); every other key is kept for the user. See
``docs/config.md`` for the keys, their defaults and the error messages.

After a launch, ``ember.config.NAME`` reads ``NAME`` from the launched config (a module
``__getattr__``, as ``ember.context.rank`` does); ``ember.context.config`` is the whole Config.
"""

from __future__ import annotations

import difflib
import json
import numbers
import os
import re
import sys
import traceback
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml

from ember.errors import ConfigError, ContextError

__all__ = ["Config", "ConfigSource", "load_config", "merge_configs", "parse_overrides"]

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | None
"""What a config can be given as: a file path, a mapping (a :class:`Config` too) or None."""


class Config(dict[str, Any]):
    """A dict whose keys are also attributes; nested mappings (also inside lists) become Configs.

    Example:
        >>> cfg = Config(parallel={"tensor": {"size": 2}}, BATCH_SIZE=32)
        >>> cfg.parallel.tensor.size, cfg.BATCH_SIZE
        (2, 32)
        >>> cfg.lr = 0.1
        >>> cfg.to_dict()["lr"]
        0.1
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _wrap(value))

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Set each key like ``cfg[key] = value`` does, converting nested mappings."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Return ``cfg[key]``, first setting it to ``default`` (converted) when missing."""
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self) -> Config:
        """A shallow copy that is still a :class:`Config`."""
        return Config(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(self._missing(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__") or hasattr(type(self), name):
            raise AttributeError(f"'{name}' is a Config method, not a key: set it with cfg[{name!r}] = value")
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(self._missing(name)) from None

    def __dir__(self) -> Iterable[str]:
        keys = (k for k in self if isinstance(k, str) and k.isidentifier())
        return [*super().__dir__(), *keys]

    def __repr__(self) -> str:
        return f"Config({_plain(self)!r})"

    def to_dict(self) -> dict[str, Any]:
        """Return plain nested dicts and lists (new containers; leaves such as callables shared).

        Returns:
            A ``dict`` with no :class:`Config` inside, e.g. for ``yaml.safe_dump`` or logging.
        """
        return _plain(self)

    def _missing(self, name: str) -> str:
        keys = sorted(k for k in self if isinstance(k, str))
        close = difflib.get_close_matches(name, keys, n=1)
        if close:
            return f"config has no key '{name}'; did you mean '{close[0]}'?"
        shown = ", ".join(keys[:20]) + (", ..." if len(keys) > 20 else "")
        return f"config has no key '{name}' (its keys: {shown or 'none'})"


def _wrap(value: Any) -> Any:
    """Mappings become Configs, recursively, also inside (exact) lists and tuples."""
    if isinstance(value, Config):
        return value
    if isinstance(value, Mapping):
        return Config(value)
    if type(value) is list:
        return [_wrap(v) for v in value]
    if type(value) is tuple:
        return tuple(_wrap(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """Mappings become new dicts, lists/tuples new lists/tuples; other leaves are shared."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain(v) for v in value]
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    return value


# ---------------------------------------------------------------------------------------------
# Value checks. Each takes (value, dotted key, full) and returns the normalized value; `full` is
# False while validating one side of a merge, so that defaults and required keys wait for the end.

_Check = Callable[[Any, str, bool], Any]
_NO_DEFAULT = object()


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:77] + '...' if len(text) > 80 else text} ({type(value).__name__})"


def _fail(key: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"config key '{key}' got {_describe(value)}; allowed: {allowed}")


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


def _int(low: int, high: float = float("inf"), optional: bool = False) -> _Check:
    allowed = f"an int >= {low}" if high == float("inf") else f"an int from {low} to {high}"
    ok = lambda v: _is_int(v) and low <= v <= high  # noqa: E731
    return _check(ok, allowed + " or None" * optional, int, optional)


def _real(low: float, high: float = float("inf"), allowed: str = "a number > 0") -> _Check:
    return _check(lambda v: _is_real(v) and low < v < high, allowed, float)


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
    lambda v: _is_real(v) and v > 0,
    "a number > 0 or None (use a positive max norm, or None to disable)",
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


_SCALER_FIELDS = {
    "init_scale": _Field(_real(0)),
    "growth_factor": _Field(_real(1, allowed="a number > 1")),
    "backoff_factor": _Field(_real(0, 1, allowed="a number between 0 and 1 (exclusive)")),
    "growth_interval": _Field(_int(1)),
    "enabled": _Field(_BOOL),
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
    {"size": _Field(_int(1), 1), "mode": _Field(_OPT_STR, None), "plan": _Field(_ANY, None)}, shorthand="size"
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
_PARALLEL = _Section(
    {"data": _Field(_int(1, optional=True), None), "tensor": _Field(_TENSOR, None), "pipeline": _Field(_PIPELINE, None)}
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
    "grad_scaler": _Field(_Section(_SCALER_FIELDS), None),
    "gradient_accumulation": _Field(_int(1), 1),
    "clip_grad_norm": _Field(_CLIP, None),
    "gradient_handler": _Field(_handlers, None),
    "parallel": _Field(_PARALLEL, None),
    "zero": _Field(_zero, None),
    "compile": _Field(_compile, False),
    "seed": _Field(_int(0, optional=True), None),
    "deterministic": _Field(_BOOL, False),
    "ddp": _Field(_DDP, None),
}
# Accepted on input and folded into the keys above: fp16 -> amp + grad_scaler, the other -> ddp.
_FP16 = _Section({"mode": _Field(_ANY), **_SCALER_FIELDS})
_KNOWN = (*_SCHEMA, "fp16", "find_unused_parameters")


def _check_names(data: Mapping[str, Any]) -> None:
    """Unknown top-level keys are the user's, unless they are near-misses of ember's keys."""
    for key in data:
        if not isinstance(key, str) or key in _KNOWN or key.isupper():
            continue
        close = difflib.get_close_matches(key.lower(), _KNOWN, n=1, cutoff=0.8)
        if close:
            raise ConfigError(
                f"config key '{key}' is not an ember setting; did you mean '{close[0]}'? (rename "
                "it; unknown keys are kept only when they are not near-misses of ember's keys)"
            )


def _fold_fp16(data: dict[str, Any]) -> None:
    """Colossal-AI's ``fp16=dict(mode="torch", **scaler_kwargs)`` -> amp="fp16" + grad_scaler."""
    fp16 = data.pop("fp16")
    if fp16 is None or fp16 is False:
        return
    kwargs = _FP16({} if fp16 is True else fp16, "fp16", False)
    mode = kwargs.pop("mode", "torch")
    mode = getattr(mode, "value", mode)  # Colossal-AI's AMP_TYPE.TORCH is an Enum
    if not isinstance(mode, str) or mode.lower() != "torch":
        raise ConfigError(
            f"config key 'fp16.mode' got {_describe(mode)}; ember supports mode='torch' "
            "(torch.amp) only: use fp16=dict(mode='torch'), or amp='fp16' or amp='bf16'"
        )
    if _amp(data.get("amp"), "amp", False) not in (None, "fp16"):
        raise ConfigError(
            f"config keys 'fp16' and 'amp' disagree (fp16={fp16!r}, amp={data['amp']!r}): "
            "keep one of them (fp16=dict(mode='torch') means amp='fp16')"
        )
    data["amp"] = "fp16"
    _fold_into(data, "grad_scaler", kwargs, "fp16.{sub}")


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
    if "find_unused_parameters" in data:
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


# ---------------------------------------------------------------------------------------------
# Reading sources.


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _load_python(path: Path, text: str) -> dict[str, Any]:
    """Run the file; keep its module-level names except ``_private`` ones and modules."""
    try:
        code = compile(text, str(path), "exec")
    except SyntaxError as err:
        raise ConfigError(f"config file '{path}' has a syntax error at line {err.lineno}: {err.msg}") from None
    module = types.ModuleType("_ember_config")
    module.__file__ = str(path)
    sys.path.insert(0, str(path.parent))  # so a config can import helpers that sit beside it
    try:
        exec(code, module.__dict__)
    except Exception as err:  # noqa: BLE001 - re-raised below as a ConfigError naming file and line
        frames = traceback.extract_tb(err.__traceback__)
        ours = [f for f in frames if f.filename == str(path)]
        where = f"line {ours[-1].lineno}" if ours else "load time"
        if frames and frames[-1].filename != str(path):
            where += f" (inside {frames[-1].filename}:{frames[-1].lineno})"
        raise ConfigError(f"config file '{path}' raised {type(err).__name__} at {where}: {err}") from None
    finally:
        sys.path.remove(str(path.parent))
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def _load_data(path: Path, text: str) -> Any:
    """YAML, or JSON by suffix; a parse error names the file, line and column."""
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else getattr(err, "lineno", "?")
        col = mark.column + 1 if mark else getattr(err, "colno", "?")
        problem = getattr(err, "problem", None) or getattr(err, "msg", None) or str(err)
        kind = path.suffix.lower().lstrip(".").upper().replace("YML", "YAML")
        raise ConfigError(f"config file '{path}' is not valid {kind} at line {line}, column {col}: {problem}") from None


_LOADERS = {".py": _load_python, ".yaml": _load_data, ".yml": _load_data, ".json": _load_data}


def _read(source: Any) -> Mapping[str, Any]:
    """The raw mapping behind a source: a path is loaded, a mapping used as is, None is empty."""
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"a config must be a file path ({', '.join(_LOADERS)}), a dict or None; got {_describe(source)}"
        )
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"config file '{path}' does not exist")
    loader = _LOADERS.get(path.suffix.lower())
    if loader is None:
        raise ConfigError(
            f"config file '{path}' has an unsupported suffix '{path.suffix}'; supported: {', '.join(_LOADERS)}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file '{path}' cannot be read: {err}") from None
    data = loader(path, text)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file '{path}' must hold a mapping of keys at the top level; got a {type(data).__name__}"
        )
    return data


def _split_key(key: str, item: str) -> list[str]:
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r} has an empty key or key part; write 'key.sub=value'")
    return parts


def _assign(target: dict[str, Any], parts: Sequence[str], value: Any) -> None:
    """Set ``target[a][b]... = value``; a later assignment wins over an earlier one."""
    for part in parts[:-1]:
        child = target.get(part)
        target[part] = child = dict(child) if isinstance(child, Mapping) else {}
        target = child
    old = target.get(parts[-1])
    both = isinstance(old, Mapping) and isinstance(value, Mapping)
    target[parts[-1]] = _merge(old, value) if both else value  # type: ignore[arg-type]


def _expand_dotted(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``{"parallel.data": 2}`` -> ``{"parallel": {"data": 2}}``, at every level."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            value = _expand_dotted(value)
        parts = _split_key(key, key) if isinstance(key, str) and "." in key else [key]
        _assign(out, parts, value)
    return out


# ---------------------------------------------------------------------------------------------
# Public API.


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Turn ``"key.sub=value"`` strings into a nested dict (mmengine's ``--cfg-options``).

    Values are read as YAML (``4`` is an int, ``true`` a bool, ``[1,2]`` a list, ``null`` and
    ``None`` are None, ``1e-3`` a float); a later item wins over an earlier one.

    Args:
        items: strings such as ``"amp=bf16"`` or ``"parallel.data=2"``.

    Returns:
        A nested dict, e.g. ``{"amp": "bf16", "parallel": {"data": 2}}``.

    Raises:
        ConfigError: an item is not a string, has no ``=`` or has an empty key part.

    Example:
        >>> parse_overrides(["gradient_accumulation=4", "parallel.data=2"])
        {'gradient_accumulation': 4, 'parallel': {'data': 2}}
    """
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ConfigError(f"overrides must be a list of 'key=value' strings; got {_describe(items)}")
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form 'key.sub=value'")
        key, text = item.split("=", 1)
        parts = _split_key(key, item)
        try:
            value = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or str(err)
            raise ConfigError(f"override {item!r} has a value that is not valid YAML: {problem}") from None
        _assign(out, parts, None if value in ("None", "none") else value)
    return out


def load_config(source: ConfigSource = None, overrides: Sequence[str] | Mapping[str, Any] | None = None) -> Config:
    """Load, override, validate and complete a config.

    Args:
        source: a ``.py`` file (its module-level names), a ``.yaml``/``.yml``/``.json`` file, a
            mapping (a :class:`Config` too), or None for an empty config.
        overrides: ``"key.sub=value"`` strings (see :func:`parse_overrides`) or a mapping, nested
            or with dotted keys, deep-merged on top of ``source``.

    Returns:
        A new :class:`Config` with ember's keys validated and defaults filled in (``fp16`` folded
        into ``amp``/``grad_scaler``); other keys kept as given. Inputs are not modified.

    Raises:
        ConfigError: a file is missing or broken, or a key is misspelt or has a bad value.

    Example:
        >>> cfg = load_config({"fp16": {"mode": "torch"}, "BATCH_SIZE": 32}, ["parallel.data=1"])
        >>> cfg.amp, cfg.parallel.data, cfg.gradient_accumulation, cfg.BATCH_SIZE
        ('fp16', 1, 1, 32)
    """
    if overrides is None:
        return merge_configs(source, None)
    extra = _expand_dotted(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    return merge_configs(source, extra)


def merge_configs(base: ConfigSource, extra: ConfigSource) -> Config:
    """Deep-merge ``extra`` over ``base`` (extra wins), then validate and complete the result.

    Each side is checked and its shorthands expanded first (``tensor=2`` -> ``{"size": 2}``,
    ``fp16`` -> ``amp``), so a partial ``extra`` only changes what it names. Mappings merge key
    by key; lists and other values are replaced.

    Args:
        base: the config to start from (e.g. the launched one); any :data:`ConfigSource`.
        extra: the settings to apply on top (e.g. ``initialize(config=...)``); any source.

    Returns:
        A new, normalized :class:`Config`; neither input is modified.

    Raises:
        ConfigError: as :func:`load_config`.

    Example:
        >>> cfg = merge_configs({"amp": "bf16"}, {"gradient_accumulation": 4})
        >>> cfg.amp, cfg.gradient_accumulation
        ('bf16', 4)
    """
    merged = _merge(_normalize(_read(base), False), _normalize(_read(extra), False))
    return Config(_plain(_normalize(merged, True)))


def __getattr__(name: str) -> Any:
    # ``ember.config.BATCH_SIZE``: names this module does not define come from the launched config
    # (PEP 562), so DESIGN.md's ``cfg = ember.config; cfg.BATCH_SIZE`` works. Private and dunder
    # names stay plain AttributeErrors, for introspection.
    if name.startswith("_"):
        raise AttributeError(f"module 'ember.config' has no attribute {name!r}")
    from ember import context

    if not context.is_launched():
        raise ContextError(
            f"ember.config.{name} was read before launch: ember.config reads the launched config's "
            "keys once ember.launch(...), ember.launch_from_torch(config=...) or another launch_from_* "
            f"has run (and '{name}' is none of this module's own names: {', '.join(__all__)})"
        )
    return getattr(context.get_context().config, name)
