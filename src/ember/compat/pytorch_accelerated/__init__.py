"""pytorch-accelerated's names on ember: ``from ember.compat.pytorch_accelerated import Trainer``.

Sub-modules as in pytorch-accelerated: ``.trainer``, ``.callbacks``, ``.tracking``,
``.run_config``. Importing it seeds Python, NumPy and torch with 42, as importing
pytorch-accelerated does.
"""

from __future__ import annotations

from ember.compat._not_provided import module_getattr
from ember.launcher import seed_everything

from .trainer import Trainer, TrainerPlaceholderValues

seed_everything(42)

__all__ = ["Trainer", "TrainerPlaceholderValues"]

__getattr__ = module_getattr(__name__, "pytorch_accelerated", {
    "notebook_launcher": "start the program with `ember run --nproc N train.py` (or torchrun): the first "
                         "Trainer joins the process group",
})  # fmt: skip
