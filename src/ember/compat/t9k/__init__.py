"""T9k's experiment management on ember: ``from ember.compat.t9k import em``.

``em`` is a module of aliases of :mod:`ember.track` (and three thin adapters where T9k's
argument order or names differ); runs and artifacts go to ember's local store and upload to
an ember tracking server. See ``docs/migrating.md`` for what still differs.

Example:
    >>> from ember.compat.t9k import em
    >>> run = em.create_run(name="mnist_torch", hparams={"batch_size": 64})
    >>> run.log(type="train", metrics={"loss": 0.31}, step=100, epoch=1)
    >>> run.finish()
"""

from __future__ import annotations

from ember.compat.t9k import em

__all__ = ["em"]
