"""Configs: load a Python file, YAML/JSON file or mapping, validate ember's keys, fill defaults.

A config is a plain :class:`Config` (a ``dict`` with attribute access). ember's own keys are
checked against a small schema table (``_SCHEMA``); every other key is kept for the user. See
``docs/config.md`` for the keys, their defaults and the error messages.

After a launch, ``ember.config.NAME`` reads ``NAME`` from the launched config (a module
``__getattr__``, as ``ember.context.rank`` does); ``ember.context.config`` is the whole Config.
The launch hands the config down with :func:`set_launched`: this module imports nothing of the
layers above it (``ember.context``, the launcher).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from ember.config.schema import _merge, _normalize
from ember.config.sources import _assign, _expand_dotted, _read, _split_key, _YamlLoader, check_shape
from ember.errors import ConfigError, ContextError, describe, short_repr

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
        raise ConfigError(f"overrides must be a list of 'key=value' strings; got {describe(items)}")
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form 'key.sub=value'")
        key, text = item.split("=", 1)
        parts = _split_key(key, item)
        try:
            value = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
        except RecursionError:
            raise ConfigError(f"override {short_repr(item)} is nested too deeply to read") from None
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or str(err)
            raise ConfigError(f"override {short_repr(item)} has a value that is not valid YAML: {problem}") from None
        check_shape(value, f"override {short_repr(key.strip())}")
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


_LAUNCHED: Config | None = None


def set_launched(config: Config | None) -> None:
    """Make ``config`` what ``ember.config.NAME`` reads; None when the context is reset.

    ``ember.context.set_context`` calls it at launch: the config module stays below the context
    and never asks it for the config.

    Example:
        >>> set_launched(Config(BATCH_SIZE=8))   # what a launch does with the job's config
        >>> import ember.config; ember.config.BATCH_SIZE
        8
    """
    global _LAUNCHED
    _LAUNCHED = config


def __getattr__(name: str) -> Any:
    # ``ember.config.BATCH_SIZE``: names this module does not define come from the launched config
    # (PEP 562), so DESIGN.md's ``cfg = ember.config; cfg.BATCH_SIZE`` works. Private and dunder
    # names stay plain AttributeErrors, for introspection.
    if name.startswith("_"):
        raise AttributeError(f"module 'ember.config' has no attribute {name!r}")
    if _LAUNCHED is None:
        raise ContextError(
            f"ember.config.{name} was read before launch: ember.config reads the launched config's "
            "keys once ember.launch(...), ember.launch_from_torch(config=...) or another launch_from_* "
            f"has run (and '{name}' is none of this module's own names: {', '.join(__all__)})"
        )
    return getattr(_LAUNCHED, name)
