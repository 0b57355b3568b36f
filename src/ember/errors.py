"""ember's exceptions.

Every error ember raises on bad input is an :class:`EmberError`, raised where the bad value
enters, with a message that names the culprit and what would be right. The subclasses also
derive from the matching built-in (``ValueError``, ``TypeError``, ``RuntimeError``...) so that
code catching those keeps working.
"""

from __future__ import annotations

import reprlib


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ConfigError(EmberError, ValueError):
    """A config key is misspelt, of the wrong type, or has a value that is not allowed."""


class LaunchError(EmberError, RuntimeError):
    """The distributed environment cannot be set up (missing variables, bad sizes, twice)."""


class ContextError(EmberError, RuntimeError):
    """The global context was read before :func:`ember.launch` set it up."""


class EngineError(EmberError, ValueError):
    """A model, optimizer, criterion or dataloader given to ember cannot be used as it is."""


class DataError(EmberError, ValueError):
    """A dataset, dataloader or sampler argument is not usable."""


class HookError(EmberError, TypeError):
    """A hook is malformed: a misspelt lifecycle method, a bad priority, a duplicate name."""


class TrainerError(EmberError, ValueError):
    """Arguments to the Trainer or its ``fit``/``evaluate`` calls are inconsistent."""


class CheckpointError(EmberError, RuntimeError):
    """A checkpoint cannot be written, found, read or applied."""


class TrackingError(EmberError, ValueError):
    """A tracking call got bad input (non-numeric metric, bad name, missing file...)."""


class NonFiniteLossError(EmberError, FloatingPointError):
    """A training loss was NaN or infinite (config ``nonfinite_loss="error"``, the default).

    Attributes:
        step: the optimizer update (1-based) whose loss it was, or None.
    """

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)``, at most ``limit`` characters: how an error message shows a bad value.

    Long strings, containers and numbers are cut without building their whole ``repr`` first
    (a 50 MB string, a 5,000-digit int), so a message costs the same whatever the value.

    Example:
        >>> short_repr("x" * 10**6, 20)
        "'xxxxxxx...xxxxxxxx'"
    """
    shorten = reprlib.Repr()
    shorten.maxstring = shorten.maxlong = shorten.maxother = max(limit, 8)
    try:
        text = shorten.repr(value)
    except ValueError:  # an int with more digits than Python converts to text
        text = f"<an int of {value.bit_length()} bits>" if isinstance(value, int) else f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(value: object, limit: int = 80) -> str:
    """:func:`short_repr` and the type's name: ``"'abc' (str)"``."""
    return f"{short_repr(value, limit)} ({type(value).__name__})"
