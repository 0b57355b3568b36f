"""pytorch-accelerated's names on ember: ``from ember.compat.pytorch_accelerated import Trainer``.

Sub-modules as in pytorch-accelerated: ``.trainer``, ``.callbacks``, ``.tracking``,
``.run_config``. Importing it seeds Python, NumPy and torch with 42, as importing
pytorch-accelerated does.
"""

from __future__ import annotations

from ember.launcher import seed_everything

from .trainer import Trainer, TrainerPlaceholderValues

seed_everything(42)

__all__ = ["Trainer", "TrainerPlaceholderValues"]
