"""A stand-in for ``func_to_script`` (Chris Hughes's small CLI package, which pytorch-accelerated's
vision examples use and ember does not depend on): ``@script`` makes a function's keyword
parameters command-line options, ``--name value``, typed by the annotation, defaulting to the
signature's default; calling the function with no arguments parses ``sys.argv``."""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Callable
from typing import Any


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def script(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` run with its parameters from the command line (``--name value``)."""
    parser = argparse.ArgumentParser(description=function.__doc__)
    for name, parameter in inspect.signature(function).parameters.items():
        kind = {bool: _bool, int: int, float: float}.get(parameter.annotation, str)
        required = parameter.default is inspect.Parameter.empty
        parser.add_argument(f"--{name}", type=kind, required=required,
                            default=None if required else parameter.default)  # fmt: skip

    @functools.wraps(function)
    def main(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return function(*args, **kwargs)
        return function(**vars(parser.parse_args()))

    return main
