"""A stand-in for what the peers' example programs take from torchvision (no download, no network).

The programs are the peers' own, vendored with their imports rewritten (``torchvision`` ->
``tests.seeds.standins.torchvision``): :mod:`.datasets` makes data of the same shape that a
small model learns, :mod:`.transforms` the transforms they use.
"""

from . import datasets, models, transforms

__all__ = ["datasets", "models", "transforms"]
