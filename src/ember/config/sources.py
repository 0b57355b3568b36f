"""Reading configs: Python files, YAML/JSON files, mappings, and dotted overrides."""

from __future__ import annotations

import json
import os
import re
import stat
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


MAX_DEPTH = 100
"""The deepest nesting of dicts and lists a config may have."""
MAX_FILE_BYTES = 16 << 20
"""The largest config or YAML file ember reads (a config is a few kB; a bigger file is not one)."""
MAX_SHARED = 10_000
"""How many values a config may reach more than once (YAML aliases, a list shared in a .py file)."""
_INT_DIGITS = 4000  # below Python's 4300-digit limit on converting ints to and from text


class _LongInt:
    """An int too long to convert from text, kept in its place so the check can name its key."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a float (YAML 1.1 wants ``1.0e-3``).

    Ints of more digits than Python converts are kept as a marker that :func:`check_shape`
    reports with their key.
    """

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        text = str(node.value)
        if len(text) > _INT_DIGITS:
            return _LongInt(len(text))
        return super().construct_yaml_int(node)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
_YamlLoader.add_constructor("tag:yaml.org,2002:int", _YamlLoader.construct_yaml_int)


def _json_int(text: str) -> Any:
    return _LongInt(len(text)) if len(text) > _INT_DIGITS else int(text)


def check_shape(data: Any, source: str) -> None:
    """Refuse data that ember's own walks over a config could not handle, naming the key.

    Nesting deeper than :data:`MAX_DEPTH`, a dict or list that contains itself, more than
    :data:`MAX_SHARED` values reached again through shared parts (a YAML alias "bomb" expands
    exponentially when copied), and ints too long to write as text. The walk is iterative and
    visits each shared part once, so it costs the size of the data as written, whatever it
    would expand to.

    Raises:
        ConfigError: naming ``source`` and the key.
    """
    sizes: dict[int, int] = {}  # id of a container -> values in it, expanded
    open_: set[int] = set()  # containers on the path being walked
    stack: list[tuple[Any, str, Any]] = [(data, "", None)]
    while stack:
        obj, key, items = stack[-1]
        if items is None:  # first visit
            if isinstance(obj, _LongInt) or (isinstance(obj, int) and obj.bit_length() > 3.32 * _INT_DIGITS):
                digits = obj.digits if isinstance(obj, _LongInt) else int(obj.bit_length() * 0.30103)
                raise ConfigError(
                    f"{_where(source, key)} is an int of about {digits} digits, more than Python converts to and "
                    "from text: use a number that fits (or a string)"
                )
            if not isinstance(obj, Mapping | list | tuple) or id(obj) in sizes:
                stack.pop()
                continue
            if id(obj) in open_:
                raise ConfigError(f"{_where(source, key)} contains itself (a recursive alias or reference)")
            if len(open_) >= MAX_DEPTH:
                raise ConfigError(f"{_where(source, key)} is nested more than {MAX_DEPTH} levels deep")
            open_.add(id(obj))
            pairs = obj.items() if isinstance(obj, Mapping) else enumerate(obj)
            items = iter(list(pairs))
            stack[-1] = (obj, key, items)
        child = next(items, None)
        if child is None:
            stack.pop()
            open_.discard(id(obj))
            values = obj.values() if isinstance(obj, Mapping) else obj
            sizes[id(obj)] = 1 + sum(sizes.get(id(v), 0) for v in values)
            continue
        sub, value = child
        name = f"{key}[{sub}]" if not isinstance(obj, Mapping) else f"{key}.{sub}" if key else str(sub)
        if id(value) in open_:
            raise ConfigError(f"{_where(source, name)} contains itself (a recursive alias or reference)")
        if not (isinstance(value, Mapping | list | tuple) and id(value) in sizes):
            stack.append((value, name, None))
    total = sizes.get(id(data), 0)
    if total - len(sizes) > MAX_SHARED:
        raise ConfigError(
            f"{source} reaches {total - len(sizes)} values more than once through shared parts (YAML aliases, a "
            f"list or dict used several times), more than {MAX_SHARED}: copied, it would expand to {total} values "
            "(an alias bomb?); write the values out, or share less"
        )


def _where(source: str, key: str) -> str:
    shown = key if len(key) <= 80 else key[:40] + "..." + key[-37:]
    return f"{source}: key '{shown}'" if key else source


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
    except (Exception, SystemExit, KeyboardInterrupt) as err:  # noqa: BLE001 - the config's own error, below
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
    if path.suffix.lower() != ".json":
        return load_yaml(text, f"config file '{path}'")
    try:
        return json.loads(text, parse_int=_json_int)
    except RecursionError:
        raise ConfigError(f"config file '{path}' is nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"config file '{path}' is not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text with ember's one YAML loader, and check what it holds.

    Every YAML ember reads goes through here: config files and overrides, and a tracking run's
    ``config_path``. The loader is ``yaml.SafeLoader`` (plain data only: no tag builds a Python
    object) that also reads ``1e-3`` as a float; the result is then checked by
    :func:`check_shape`, which refuses an alias "bomb" (a few lines whose aliases expand to
    billions of values when copied, as writing them to JSON would), nesting deeper than
    :data:`MAX_DEPTH` and ints too long to convert, at the cost of the text as written.

    Args:
        text: the YAML.
        source: what it is, for messages (``"config file 'a.yaml'"``).

    Returns:
        The parsed data.

    Raises:
        ConfigError: naming ``source`` (and the line and column of a syntax error, or the key).

    Example:
        >>> load_yaml("lr: 1e-3\nlayers: [64, 64]", "config file 'c.yaml'")
        {'lr': 0.001, 'layers': [64, 64]}
    """
    try:
        data = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass
    except RecursionError:
        raise ConfigError(f"{source} is nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None
    check_shape(data, source)
    return data


def read_text_file(path: str | os.PathLike[str], source: str) -> str:
    """The UTF-8 text of ``path``, a regular file of at most :data:`MAX_FILE_BYTES`.

    A pipe, a device or a folder (or a link to one) is refused without reading it, so a config
    path that names ``/dev/zero`` or a FIFO fails at once instead of reading without end.

    Raises:
        ConfigError: naming ``source`` and what the path is.
    """
    try:
        with open(path, "rb", opener=_open_nonblocking) as f:
            mode = os.fstat(f.fileno())
            if not stat.S_ISREG(mode.st_mode):
                raise ConfigError(f"{source} is not a regular file (a folder, a pipe or a device): give a file")
            if mode.st_size > MAX_FILE_BYTES:
                raise ConfigError(f"{source} is {mode.st_size} bytes, over the {MAX_FILE_BYTES >> 20} MiB of a config")
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{source} does not exist") from None
    except OSError as err:
        raise ConfigError(f"{source} cannot be read: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{source} is over the {MAX_FILE_BYTES >> 20} MiB of a config")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source} is not UTF-8 text (byte {err.start}): {err.reason}") from None


def _open_nonblocking(path: str, flags: int) -> int:
    """``open``'s opener: never wait on a pipe with no writer (the caller refuses it next)."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def read_yaml(path: str | os.PathLike[str], source: str) -> Any:
    """Read a YAML file: :func:`read_text_file`, then :func:`load_yaml`.

    Example:
        >>> read_yaml("run.yaml", "config_path 'run.yaml'")
        {'name': 'mnist', 'hparams': {'lr': 0.001}}
    """
    return load_yaml(read_text_file(path, source), source)


_LOADERS = {".py": _load_python, ".yaml": _load_data, ".yml": _load_data, ".json": _load_data}


def _read(source: Any) -> Mapping[str, Any]:
    """The raw mapping behind a source: a path is loaded, a mapping used as is, None is empty."""
    if source is None:
        return {}
    if isinstance(source, Mapping):
        check_shape(source, "config")
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
    data = loader(path, read_text_file(path, f"config file '{path}'"))
    check_shape(data, f"config file '{path}'")
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
