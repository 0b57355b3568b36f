"""The error a compat package raises for a peer's name that ember deliberately does not provide.

Each compat package lists such names with the ember way to do the same thing; importing one
(``from ember.compat.colossalai.utils import checkpointing``) or reading it as an attribute
raises :class:`NotProvidedError` with that advice, never Python's bare "cannot import name".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["NotProvidedError", "module_getattr"]


class NotProvidedError(ImportError):
    """A peer library's name that ember does not provide; the message names the ember way.

    An ``ImportError``, so ``from peer import name`` shows the message (Python would replace an
    ``AttributeError`` raised there by its own "cannot import name").
    """


def module_getattr(module: str, peer: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``: names in ``names`` raise NotProvidedError.

    Args:
        module: the compat module's ``__name__``.
        peer: the peer's spelling of the module (``"pytorch_accelerated.callbacks"``).
        names: each name left out, and what to use instead.

    Returns:
        The function to assign to the module's ``__getattr__``; other names raise AttributeError.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            raise NotProvidedError(f"{peer}.{name} is not provided by ember: {names[name]} (docs/migrating.md)")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
