"""ember's exceptions.

Every error ember raises on bad input is an :class:`EmberError`, raised where the bad value
enters, with a message that names the culprit and what would be right. The subclasses also
derive from the matching built-in (``ValueError``, ``TypeError``, ``RuntimeError``...) so that
code catching those keeps working.
"""

from __future__ import annotations


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
