"""Reading configs: Python files, YAML/JSON files, mappings, and dotted overrides."""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ember.config.schema import _merge
from ember.errors import ConfigError, describe

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
            f"a config must be a file path ({', '.join(_LOADERS)}), a dict or None; got {describe(source)}"
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
