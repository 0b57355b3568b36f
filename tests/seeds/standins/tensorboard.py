"""``torch.utils.tensorboard``, which needs the ``tensorboard`` package (not an ember dependency).

T9k's tutorial programs import ``SummaryWriter`` unconditionally and write to it only when given
``--log_dir``; run without it, nothing is written. Given one here, the writer says that the
package is missing rather than dropping the scalars.
"""

from __future__ import annotations

from typing import Any


class SummaryWriter:
    """Refuses to be built: install ``tensorboard`` to write event files."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ModuleNotFoundError("SummaryWriter needs the tensorboard package: pip install tensorboard")
