"""The parts of detectron2's ``engine.defaults`` (and ``engine.launch``) that need no config system.

``default_argument_parser`` and ``default_writers`` are detectron2's. ``default_setup`` takes
any config object (an attribute or dict holding ``OUTPUT_DIR``/``SEED``, a ``train.output_dir``
...): ember has no yacs or LazyConfig system. ``launch`` runs the function in this process: start
several with ``ember run --nproc N`` or ``torchrun``, which ``launch`` then joins.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ember
from ember import distributed
from ember.compat._not_provided import module_getattr
from ember.compat.detectron2.utils.events import CommonMetricPrinter, EventWriter, JSONWriter
from ember.compat.detectron2.utils.logger import setup_logger
from ember.context import is_launched
from ember.errors import LaunchError
from ember.launcher import seed_everything

__all__ = ["default_argument_parser", "default_setup", "default_writers", "launch"]


def default_argument_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """detectron2's command line: ``--config-file``, ``--resume``, ``--eval-only``, ``--num-gpus``,
    ``--num-machines``, ``--machine-rank``, ``--dist-url`` and trailing ``opts``.

    Example:
        >>> args = default_argument_parser().parse_args()
    """
    parser = argparse.ArgumentParser(
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a training program (started once per process by `ember run --nproc N` or torchrun).",
    )  # fmt: skip
    parser.add_argument("--config-file", default="", metavar="FILE", help="path to config file")
    parser.add_argument("--resume", action="store_true", help="resume from the newest checkpoint in the output folder")
    parser.add_argument("--eval-only", action="store_true", help="perform evaluation only")
    parser.add_argument("--num-gpus", type=int, default=1, help="number of processes per machine")
    parser.add_argument("--num-machines", type=int, default=1, help="total number of machines")
    parser.add_argument("--machine-rank", type=int, default=0, help="the rank of this machine")
    parser.add_argument("--dist-url", default="auto", help="accepted; ember's launcher sets the rendezvous")
    parser.add_argument("opts", default=None, nargs=argparse.REMAINDER, help="config options KEY VALUE ...")
    return parser


def _setting(cfg: Any, *paths: str) -> Any:
    """The first of ``paths`` (dotted) found in ``cfg`` by attribute or key, else None."""
    for path in paths:
        value: Any = cfg
        for part in path.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif hasattr(value, part):
                value = getattr(value, part)
            else:
                value = None
                break
        if value is not None:
            return value
    return None


def default_setup(cfg: Any, args: Any) -> None:
    """What detectron2 does at a program's start that needs no config system: create the output
    folder, set up the ``detectron2`` and ``fvcore`` loggers (console on rank 0, ``log.txt``),
    log the rank, the command line and the arguments, and seed every generator with ``SEED``
    (``seed`` / ``train.seed``) + rank when it is >= 0.

    Args:
        cfg: the program's config (an object or dict); ``OUTPUT_DIR`` or ``train.output_dir``
            names the output folder.
        args: the parsed command line.
    """
    output = _setting(cfg, "OUTPUT_DIR", "train.output_dir", "output_dir")
    rank = distributed.rank()
    if output and rank == 0:
        Path(output).mkdir(parents=True, exist_ok=True)
    setup_logger(output, distributed_rank=rank, name="fvcore")
    logger = setup_logger(output, distributed_rank=rank)
    logger.info(f"Rank of current process: {rank}. World size: {distributed.world_size()}")
    logger.info("Command line arguments: " + str(args))
    seed = _setting(cfg, "SEED", "seed", "train.seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        seed_everything(seed + rank)


def default_writers(output_dir: str | os.PathLike[str], max_iter: int | None = None) -> list[EventWriter]:
    """The writers detectron2 trains with: the console line and ``output_dir/metrics.json``
    (its TensorBoard writer is not provided: add ``ember.trainer.hooks.TensorboardHook``)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    return [CommonMetricPrinter(max_iter), JSONWriter(os.path.join(output_dir, "metrics.json"))]


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: Sequence[Any] = (),
    timeout: Any = None,
) -> Any:
    """Run ``main_func(*args)`` in this process, in the job ``ember run``/``torchrun`` started.

    detectron2's ``launch`` spawns ``num_gpus_per_machine`` processes itself; ember's launcher
    starts them (``ember run --nproc N train.py``), and each runs the program, so here the
    process joins the job (when several were started) and calls the function once.

    Raises:
        LaunchError: more processes asked for than were started, naming the command that starts them.
    """
    wanted = num_gpus_per_machine * num_machines
    started = int(os.environ.get("WORLD_SIZE", "1"))
    if wanted > 1 and started != wanted:
        script = " ".join(sys.argv) or "train.py"
        raise LaunchError(
            f"launch(num_gpus_per_machine={num_gpus_per_machine}, num_machines={num_machines}) wants {wanted} "
            f"processes but {started} {'was' if started == 1 else 'were'} started: start them with "
            f"`ember run --nproc {num_gpus_per_machine} {script}` (or torchrun)"
        )
    if started > 1 and not is_launched():
        ember.launch_from_torch(verbose=False)
    return main_func(*args)


__getattr__ = module_getattr(__name__, "detectron2.engine.defaults", {
    "DefaultTrainer": "it builds everything from a yacs config; build a SimpleTrainer (ember's Trainer "
                      "underneath) with your model, loader and optimizer, and register the hooks you need",
    "DefaultPredictor": "load the weights (ember.checkpoint.model_state) into your model and call it in eval mode",
    "create_ddp_model": "give the plain model to SimpleTrainer: ember makes it data-parallel from its config",
    "default_config_parser": "ember has no LazyConfig system: use default_argument_parser and your own config",
})  # fmt: skip
