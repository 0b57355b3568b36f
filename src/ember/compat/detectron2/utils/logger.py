"""detectron2's ``utils.logger.setup_logger``: a console (and file) handler on its logger.

detectron2's own lines are logged under ``ember.compat.detectron2`` here (the import rewrite
renames ``detectron2``), so ``setup_logger()`` sets up that logger; the lines also reach ember's
``"ember"`` logger (and its console) unless propagation is turned off.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ember import distributed

__all__ = ["setup_logger"]

_OURS = "ember.compat.detectron2"


def setup_logger(
    output: str | os.PathLike[str] | None = None,
    distributed_rank: int | None = None,
    *,
    color: bool = True,
    name: str = "detectron2",
    abbrev_name: str | None = None,
    enable_propagation: bool = False,
    configure_stdout: bool = True,
) -> logging.Logger:
    """Set up logger ``name`` (``"detectron2"`` means ember's detectron2 compat): DEBUG level, the
    console on rank 0, and ``output`` (a ``.txt``/``.log`` file, or a folder for ``log.txt``)
    with ``.rank<N>`` on the other ranks.

    Args:
        output: a file or folder for the log file (None: no file).
        distributed_rank: this process's rank (None: ember's).
        color: accepted; the lines are not coloured.
        name: the logger (``"detectron2"``, ``"fvcore"``, your own).
        abbrev_name: accepted; names are shown whole.
        enable_propagation: also pass the records to the parent loggers (ember's console).
        configure_stdout: add the console handler on rank 0.

    Returns:
        The logger.
    """
    rank = distributed.rank() if distributed_rank is None else distributed_rank
    logger = logging.getLogger(_OURS if name == "detectron2" else name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = enable_propagation
    fmt = logging.Formatter("[%(asctime)s] %(name)s %(levelname)s: %(message)s", datefmt="%m/%d %H:%M:%S")
    if configure_stdout and rank == 0:
        console = logging.StreamHandler(stream=sys.stdout)
        console.setFormatter(fmt)
        logger.addHandler(console)
    if output is not None:
        path = Path(output)
        file = path if path.suffix in (".txt", ".log") else path / "log.txt"
        if rank > 0:
            file = file.with_name(f"{file.name}.rank{rank}")
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(file)
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger
