"""A package's public names loaded on first use, so importing the package stays quick."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_getattr(package: str, attrs: Mapping[str, str], modules: Iterable[str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name imported when first asked for, then kept.

    Args:
        package: the package's dotted name (``__name__``).
        attrs: public name -> the module that defines it.
        modules: the sub-modules that are public names of the package.

    Returns:
        A function to assign to the package's ``__getattr__`` (PEP 562).

    Example:
        >>> __getattr__ = lazy_getattr(__name__, {"launch": "ember.launcher"}, ("track",))
    """
    namespace = sys.modules[package].__dict__
    submodules = frozenset(modules)

    def __getattr__(name: str) -> Any:
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in attrs:
            value = getattr(importlib.import_module(attrs[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # later look-ups skip this function
        return value

    return __getattr__
