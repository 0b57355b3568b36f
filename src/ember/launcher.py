"""Start a process's part in a job: process group, device mesh, seeds, config, context.

``launch`` takes everything explicitly; ``launch_from_torch``, ``launch_from_slurm`` and
``launch_from_openmpi`` read it from the environment their launcher sets.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ember import context as _context
from ember._exit import leave_process_group_at_exit
from ember._same_config import check_same_config
from ember.config import ConfigSource, load_config
from ember.errors import LaunchError
from ember.logging import get_dist_logger, setup_output


def launch(
    config: ConfigSource = None,
    rank: int = 0,
    world_size: int = 1,
    host: str = "127.0.0.1",
    port: int | str = 29500,
    backend: str | None = None,
    local_rank: int | None = None,
    seed: int = 1024,
    verbose: bool = True,
    overrides: Sequence[str] | None = None,
    timeout_s: float = 1800,
) -> _context.Context:
    """Set up this process: validate the config, join the process group, pick the device, seed.

    Args:
        config: a config file path (.py, .yaml), a dict, or None.
        rank: this process's global rank.
        world_size: the number of processes in the job.
        host: address of rank 0's rendezvous store.
        port: port of that store.
        backend: ``"nccl"`` or ``"gloo"``; by default ``nccl`` when CUDA is present, else ``gloo``.
        local_rank: rank on this machine; picks the CUDA device. Defaults to ``rank``.
        seed: base seed; the config's ``seed`` wins when set. Each rank seeds Python, NumPy and
            torch with ``seed + rank`` (DDP makes the initial weights equal on every rank).
        verbose: log one line on rank 0 describing the job. Unless the application configured
            logging first, the launch sends ember's records to stderr
            (:func:`ember.logging.setup_output`).
        overrides: ``"key.sub=value"`` strings applied on top of the config.
        timeout_s: how long collectives wait before failing; also how long the other ranks wait
            in a collective for a machine that vanished without closing its connections.

    Returns:
        The context, also available as ``ember.context``.

    Raises:
        LaunchError: bad ranks, a process group that cannot be joined, or (with several
            processes) a config that is not the same on every rank: the ranks compare a hash
            of their config right after joining, and the error names the ranks, their hosts
            and the keys that differ.

    Example:
        >>> ember.launch(config={"amp": "bf16"}, rank=0, world_size=1)
    """
    setup_output()  # ember's records to stderr, unless the application configured logging
    cfg = load_config(config, overrides)
    _check_ranks(rank, world_size, local_rank)
    layout = _context.ParallelLayout.from_config(cfg.parallel, world_size)  # before any collective
    local_rank = rank if local_rank is None else local_rank
    _context.ensure_not_launched()
    backend = _pick_backend(backend)

    if backend == "nccl":
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise LaunchError(
                f"local rank {local_rank} needs CUDA device {local_rank}, but this machine has {gpus}: NCCL "
                f"takes one GPU per process. Start at most {gpus} process(es) per machine "
                f"(torchrun --nproc_per_node {gpus}), or pass backend='gloo' to let processes share GPUs"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    elif torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    group_backend = None
    mesh = None
    if world_size > 1:
        if dist.is_initialized():
            raise LaunchError(
                "torch.distributed is already initialised in this process: let ember create the "
                "process group (remove your init_process_group call) or skip ember.launch"
            )
        try:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{host}:{port}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
            )
        except (RuntimeError, ValueError) as exc:
            raise LaunchError(
                f"could not join the process group at tcp://{host}:{port} as rank {rank} of "
                f"{world_size} with backend {backend!r}: {exc}"
            ) from None
        group_backend = backend
        leave_process_group_at_exit()  # see its docstring: an abort at exit otherwise
        check_same_config(cfg, world_size)  # before the mesh: a differing layout would hang there
        mesh = _build_mesh(layout, device)

    base_seed = cfg.seed if cfg.seed is not None else seed
    seed_everything(base_seed + rank, deterministic=cfg.deterministic)
    ctx = _context.Context(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        seed=base_seed,
        config=cfg,
        backend=group_backend,
        layout=layout,
        mesh=mesh,
    )
    _context.set_context(ctx)
    if mesh is not None:
        _build_groups(layout, device)
    if verbose and rank == 0:
        get_dist_logger().info(
            f"launched {world_size} process(es), backend={group_backend or 'none'}, "
            f"device={device.type}, seed={base_seed}, mesh pipeline×data×context×tensor="
            f"{layout.pipeline}×{layout.data}×{layout.context}×{layout.tensor}"
            + "".join(f", {name} {value}" for name, value in _sub_dims(layout))
        )
    return ctx


def launch_from_torch(
    config: ConfigSource = None,
    backend: str | None = None,
    seed: int = 1024,
    verbose: bool = True,
    overrides: Sequence[str] | None = None,
    timeout_s: float = 1800,
) -> _context.Context:
    """Launch from the variables ``torchrun`` (or ``ember run``) sets.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and ``LOCAL_RANK``. The
    same variables but ``LOCAL_RANK`` are what Kubernetes operators set for a pod that runs
    ``python train.py`` itself, one process per pod (a Kubeflow ``PyTorchJob``, T9k's
    ``PyTorchTrainingJob``): without ``LOCAL_RANK`` the local rank is 0, unless the operator
    says the pod runs several processes (``PET_NPROC_PER_NODE`` > 1, which it leaves to
    torchrun to start), which is a :class:`LaunchError`.

    Args:
        config: as for :func:`launch`.
        backend: as for :func:`launch`.
        seed: as for :func:`launch`.
        verbose: as for :func:`launch`.
        overrides: as for :func:`launch`.
        timeout_s: as for :func:`launch`.

    Example:
        >>> ember.launch_from_torch(config="config.py")   # under: torchrun --nproc_per_node 2 train.py
    """
    return _launch_from_env(
        config, "torch", None, None, backend=backend, seed=seed, verbose=verbose, overrides=overrides,
        timeout_s=timeout_s,
    )  # fmt: skip


def launch_from_slurm(
    config: ConfigSource,
    host: str,
    port: int | str,
    backend: str | None = None,
    seed: int = 1024,
    verbose: bool = True,
    timeout_s: float = 1800,
) -> _context.Context:
    """Launch from the variables ``srun`` sets (``SLURM_PROCID``, ``SLURM_NPROCS``, ``SLURM_LOCALID``).

    Args:
        config: as for :func:`launch`.
        host: the address of rank 0's node: the first of ``scontrol show hostnames
            "$SLURM_JOB_NODELIST"`` (``examples/slurm/srun_python.sbatch`` exports it as
            ``MASTER_ADDR``).
        port: a free port on that node that every node can reach.
        backend: as for :func:`launch`.
        seed: as for :func:`launch`.
        verbose: as for :func:`launch`.
        timeout_s: as for :func:`launch`.

    Example:
        >>> ember.launch_from_slurm("config.py", host=os.environ["MASTER_ADDR"], port=29500)  # under srun
    """
    return _launch_from_env(
        config, "slurm", host, port, backend=backend, seed=seed, verbose=verbose, timeout_s=timeout_s
    )


def launch_from_openmpi(
    config: ConfigSource,
    host: str,
    port: int | str,
    backend: str | None = None,
    seed: int = 1024,
    verbose: bool = True,
    timeout_s: float = 1800,
) -> _context.Context:
    """Launch from the variables ``mpirun`` sets (``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``).

    ``mpirun`` only starts the processes; they talk through gloo or NCCL, not MPI.

    Args:
        config: as for :func:`launch`.
        host: the address of rank 0's machine (the first host given to ``mpirun``).
        port: a free port on that machine that every machine can reach.
        backend: as for :func:`launch`.
        seed: as for :func:`launch`.
        verbose: as for :func:`launch`.
        timeout_s: as for :func:`launch`.

    Example:
        >>> ember.launch_from_openmpi("config.py", host="node0", port=29500)  # under: mpirun -np 8 -H node0:4,node1:4
    """
    return _launch_from_env(
        config, "openmpi", host, port, backend=backend, seed=seed, verbose=verbose, timeout_s=timeout_s
    )


LAUNCHER_VARIABLES: dict[str, tuple[str, str, str]] = {
    "torch": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    "slurm": ("SLURM_PROCID", "SLURM_NPROCS", "SLURM_LOCALID"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
}
"""Per launcher (``launch_from_<name>``): the variables of the rank, the world size and the local rank it sets."""

_HINTS = {
    "torch": "run the script with `torchrun --nproc_per_node N script.py` or `ember run --nproc N script.py`",
    "slurm": "start the script with `srun` inside a Slurm job",
    "openmpi": "start the script with Open MPI's `mpirun`",
}


def launcher_rank(launcher: str) -> str:
    """The global rank the variables of ``launcher`` (a key of :data:`LAUNCHER_VARIABLES`) give
    this process before the launch, as set ("0" when unset).

    Example:
        >>> launcher_rank("slurm")   # $SLURM_PROCID
        '3'
    """
    return os.environ.get(LAUNCHER_VARIABLES[launcher][0], "0")


def _launch_from_env(
    config: ConfigSource, launcher: str, host: str | None, port: int | str | None, **kwargs: Any
) -> _context.Context:
    """Launch with rank, world size and local rank read from the variables ``launcher`` sets.

    Without ``host``/``port`` they come from ``MASTER_ADDR``/``MASTER_PORT`` (torchrun's). Under
    torchrun's variables a missing local rank means one process per machine.
    """
    rank, world, local = LAUNCHER_VARIABLES[launcher]
    address = ("MASTER_ADDR", "MASTER_PORT") if host is None else ()
    local_optional = launcher == "torch"
    required = (rank, world, *address) if local_optional and local not in os.environ else (rank, local, world, *address)
    env = _read_env(required, _HINTS[launcher])
    if local not in env:
        _check_one_process_per_machine(local)
    return launch(
        config,
        rank=int(env[rank]),
        world_size=int(env[world]),
        host=env["MASTER_ADDR"] if host is None else host,
        port=env["MASTER_PORT"] if port is None else port,
        local_rank=int(env.get(local, "0")),
        **kwargs,
    )


def _check_one_process_per_machine(local: str) -> None:
    """Without a local rank, refuse what says this machine runs several processes of the job."""
    nproc = os.environ.get("PET_NPROC_PER_NODE", "1")
    if nproc != "1":
        raise LaunchError(
            f"{local} is not set, but PET_NPROC_PER_NODE={nproc!r} says this machine runs several processes "
            "(a Kubernetes operator sets it for torchrun): start the script with `torchrun script.py` or "
            "`ember run --nproc N script.py` in the container, which set each process's local rank, or run "
            "one process per pod (nprocPerNode 1)"
        )


def _build_mesh(layout: _context.ParallelLayout, device: torch.device) -> Any:
    """The job's DeviceMesh; a failure is a LaunchError on every rank (all ranks build it)."""
    try:
        return layout.build_mesh(device.type)
    except (RuntimeError, ValueError) as exc:
        raise LaunchError(f"could not build the device mesh {layout} on {device.type}: {exc}") from None


def _build_groups(layout: _context.ParallelLayout, device: torch.device) -> None:
    """The process groups of the layout's sub-dimensions (all ranks create them, in one order)."""
    try:
        _context.get_mesh(layout)
    except (RuntimeError, ValueError) as exc:
        raise LaunchError(f"could not create the process groups of {layout} on {device.type}: {exc}") from None


def _sub_dims(layout: _context.ParallelLayout) -> list[tuple[str, Any]]:
    """The layout's settings beyond the four mesh sizes, for the launch line (``mode 2d``, ``expert 2``)."""
    shown: list[tuple[str, Any]] = [("tensor mode", layout.tensor_mode)] if layout.tensor_mode != "1d" else []
    shown += [("depth", layout.tensor_depth)] if layout.tensor_depth > 1 else []
    return shown + ([("expert", layout.expert)] if layout.expert > 1 else [])


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA); optionally ask for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        use_deterministic_kernels()


def use_deterministic_kernels() -> None:
    """Make torch pick deterministic kernels, on the CPU and on CUDA (cuBLAS and cuDNN too).

    cuBLAS is only deterministic with a fixed workspace, which ``CUBLAS_WORKSPACE_CONFIG``
    sets; torch refuses a CUDA matrix product under deterministic mode without it.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def _check_ranks(rank: Any, world_size: Any, local_rank: Any) -> None:
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise LaunchError(f"launch argument {name} must be an int, got {value!r}")
    if world_size < 1:
        raise LaunchError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise LaunchError(f"rank {rank} is outside the world of {world_size} process(es): use 0…{world_size - 1}")
    if local_rank is not None and (isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0):
        raise LaunchError(f"local_rank must be a non-negative int, got {local_rank!r}")


def _pick_backend(backend: str | None) -> str:
    if backend is None:
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend not in ("nccl", "gloo", "mpi"):
        raise LaunchError(f"unknown backend {backend!r}: use 'nccl' (CUDA) or 'gloo' (CPU)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise LaunchError("backend 'nccl' needs CUDA, and this machine has none: use backend='gloo'")
    return backend


def _read_env(names: tuple[str, ...], hint: str) -> dict[str, str]:
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise LaunchError(f"environment variable(s) {', '.join(missing)} are not set: {hint}")
    values = {n: os.environ[n] for n in names}
    for n in names:
        if n.endswith(("RANK", "SIZE", "NPROCS", "PROCID", "LOCALID", "PORT")) and not values[n].isdigit():
            raise LaunchError(f"environment variable {n}={values[n]!r} is not a non-negative integer")
    return values


__all__ = [
    "LAUNCHER_VARIABLES",
    "launch",
    "launch_from_openmpi",
    "launch_from_slurm",
    "launch_from_torch",
    "launcher_rank",
    "seed_everything",
]
