"""Sharded checkpoints: a directory of ``torch.distributed.checkpoint`` (DCP) files plus ember's state.

Under FSDP2 (``zero`` stage 2/3) and tensor parallelism each rank holds shards of the
parameters and of the optimizer state. Gathering them onto rank 0 costs the memory of the whole
model there; a sharded checkpoint lets every rank write its own shards instead, and loads into
any other layout or number of processes (DCP reshards on load). Its layout::

    ckpt-e0001-s000000008.ckpt/      a directory, named like a single-file checkpoint
      .metadata                      DCP: which chunks of which tensor are in which file
      __0_0.distcp, __1_0.distcp     DCP: each rank's shards of the model and optimizer
      ember_state.pt                 everything else, as in a single-file checkpoint (written
                                     by rank 0 with torch.save): meta, engine counters and
                                     precision, trainer, hooks, sampler, every rank's RNG, and
                                     the ``shards`` section saying where the model/optimizer are

The DCP state dict is ``{"model": ..., "optimizer": ...}`` from
:func:`torch.distributed.checkpoint.state_dict.get_state_dict` (model keys of the plain model,
optimizer state keyed by parameter name), so its entries are named ``model.<name>`` and
``optimizer.state.<name>.<slot>``.

Atomicity is the single-file checkpoint's: every rank writes into the temporary directory
``.NAME.tmp-dcp``; once DCP has written its metadata (after every rank's files) and rank 0 its
state file, rank 0 fsyncs and renames the directory to ``NAME``, fsyncs the parent, and only then
updates ``last_checkpoint`` and applies retention. :func:`check_complete` refuses a directory
whose state file, DCP metadata or shard files are missing or shorter than the metadata says.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ember import distributed
from ember._atomic import fsync_dir
from ember.checkpoint.io import (
    _os_error,
    load_file,
    replace_checkpoint,
    safe_loader_reason,
    save_file,
    write_error,
)
from ember.checkpoint.safe_dcp import read_metadata, safe_planner, safe_reader
from ember.checkpoint.snapshot import TrainingState, agree_on_error, capture, tensor_bytes
from ember.checkpoint.validate import check_state
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from ember.engine import Engine

STATE_FILE = "ember_state.pt"
"""The file of a sharded checkpoint that holds everything but the model and optimizer."""
DCP_FORMAT = "torch.distributed.checkpoint"
_TMP = ".tmp-dcp"


def is_sharded(engine: Engine) -> bool:
    """True when ``engine``'s parameters are sharded (FSDP2 and/or tensor parallelism): its
    checkpoints are then sharded directories."""
    from ember.parallel.policy import ShardedPolicy

    return isinstance(engine.parallel, ShardedPolicy)


def is_checkpoint_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a sharded checkpoint's directory (complete or not), not a folder of checkpoints."""
    from ember.checkpoint.io import _NAME

    path = Path(path)
    return path.is_dir() and (_NAME.match(path.name) is not None or (path / STATE_FILE).is_file())


def save_sharded(
    path: str | os.PathLike[str],
    trainer: TrainingState,
    reason: str = "manual",
    then: Callable[[], None] | None = None,
    extra: Mapping[str, Any] | None = None,
    skip_zip_crc: bool = False,
) -> Path:
    """Write ``trainer``'s state as the sharded checkpoint directory ``path``; a collective.

    Every rank writes its shards of the model and optimizer with :func:`torch.distributed.checkpoint.save`
    into a temporary directory next to ``path``; rank 0 adds the state file, renames the
    directory to ``path`` (replacing an earlier checkpoint of that name) and calls ``then()``
    (the hook's pointer update and retention).

    Args:
        path: the checkpoint directory to create.
        trainer: the Trainer (or another :class:`~ember.checkpoint.snapshot.TrainingState`), whose
            Engine is sharded (:func:`is_sharded`).
        reason: why it is taken, kept in the metadata.
        then: called on rank 0 once the checkpoint is in place.
        extra: the caller's own entries, kept as ``meta["extra"]``.
        skip_zip_crc: write the state file's zip records without CRC-32s (faster; it then fails
            ``unzip -t`` but loads): :func:`ember.checkpoint.io.save_file`.

    Returns:
        ``path``, on every rank.

    Raises:
        CheckpointError: on every rank, when a rank could not write its part.

    Example:
        >>> save_sharded("ckpt/ckpt-e0001-s000000008.ckpt", trainer)
    """
    import torch.distributed.checkpoint as dcp  # slow to import (DTensor, sympy): only when used

    final = Path(path)
    tmp = final.with_name(f".{final.name}{_TMP}")
    engine = trainer.checkpointables().engine
    model_state, optimizer_state = engine.parallel.sharded_state_dicts(engine.model, engine.optimizer)
    shards = {"format": DCP_FORMAT, "world_size": distributed.world_size(), "layout": engine.parallel.name}
    state = capture(trainer, reason=reason, shards=shards, extra=extra)
    error: Exception | None = None
    if distributed.rank() == 0:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a crash during an earlier save of this very state
                shutil.rmtree(tmp)
            tmp.mkdir()
        except OSError as exc:
            error = write_error(tmp, exc)
    agree_on_error(error, f"rank 0 could not create {str(tmp)!r}")
    try:
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    except dcp.CheckpointException as exc:  # raised on every rank: DCP gathers the ranks' failures
        failures = exc.failures.values()  # rank -> (exception, traceback)
        cause = next((c for error, _ in failures if (c := _os_error(error)) is not None), None)
        if cause is not None:
            raise write_error(final, cause) from exc
        raise CheckpointError(f"cannot write the shards of checkpoint {str(final)!r}: {dcp_failure(exc)}") from None
    if state is not None:
        try:
            state["meta"]["sizes"]["engine"] += tensor_bytes({"model": model_state, "optimizer": optimizer_state})
            save_file(state, tmp / STATE_FILE, skip_zip_crc=skip_zip_crc)
            fsync_dir(tmp)
            replace_checkpoint(tmp, final)
            if then is not None:
                then()
        except (OSError, CheckpointError) as exc:
            error = exc if isinstance(exc, CheckpointError) else write_error(final, exc)
    agree_on_error(error, f"rank 0 could not write checkpoint {str(final)!r}")
    return final


def obstacles(directory: str | os.PathLike[str]) -> list[Path]:
    """Entries of ``directory`` named like checkpoints that a save could not replace.

    A save renames its file (or, sharded, its directory) over the name; only a regular file or a
    sharded checkpoint's directory (one holding ``ember_state.pt``) can be replaced. Anything
    else under such a name (an empty or foreign directory, a link, a pipe) would make that save
    fail after the training it was to keep.
    """
    from ember.checkpoint.io import _NAME

    return [
        entry
        for entry in sorted(Path(directory).iterdir())
        if _NAME.match(entry.name) is not None
        and not (entry.is_file() or (entry.is_dir() and (entry / STATE_FILE).is_file()))
    ]


def read_sharded(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state file of the sharded checkpoint ``path``, after checking the directory is complete.

    Raises:
        CheckpointError: naming the directory and what is missing or damaged.
    """
    path = Path(path)
    state = load_file(path / STATE_FILE) if (path / STATE_FILE).is_file() else None
    if state is None:
        raise CheckpointError(
            f"sharded checkpoint {str(path)!r} is incomplete: it has no {STATE_FILE} (a write was interrupted?); "
            "use an earlier checkpoint"
        )
    check_state(state, f"checkpoint {str(path)!r}")
    if "shards" not in state or state["shards"].get("format") != DCP_FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r} has a {STATE_FILE} but no {DCP_FORMAT} shards section")
    check_complete(path)
    return state


def check_complete(path: Path) -> dict[str, Any]:
    """Check that the DCP metadata of ``path`` reads and that every file it names holds its bytes.

    A structural check, like the single-file one (no checksum). Returns the metadata's tensor
    entries: ``{name: TensorStorageMetadata or BytesStorageMetadata}``. The metadata is read
    without running code from it (:mod:`ember.checkpoint.safe_dcp`).
    """
    metadata = read_metadata(path)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), int(info.offset) + int(info.length))
    for name, size in sorted(needed.items()):
        file = path / name
        have = file.stat().st_size if file.is_file() and not file.is_symlink() else None
        if have is None or have < size:
            what = "is missing" if have is None else f"has {have} bytes, the metadata says at least {size}"
            raise CheckpointError(
                f"sharded checkpoint {str(path)!r} is truncated or corrupt: its shard file {name!r} {what}; "
                "use an earlier checkpoint"
            )
    return dict(metadata.state_dict_metadata)


def load_shards(path: str | os.PathLike[str], engine: Engine) -> dict[str, Any]:
    """Read the model and optimizer of the sharded checkpoint ``path`` into ``engine``'s layout; a collective.

    Returns what ``engine.load_state_dict`` takes with the rest of the engine state:
    ``{"model": ..., "optimizer": ..., "sharded": True}``, each rank holding its own shards.
    """
    import torch.distributed.checkpoint as dcp  # slow to import (DTensor, sympy): only when used

    model_state, optimizer_state = engine.parallel.sharded_state_dicts(engine.model, engine.optimizer)
    alone = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    try:
        with _quiet_single_process():
            dcp.load({"model": model_state, "optimizer": optimizer_state}, storage_reader=safe_reader(path),
                     planner=safe_planner(), no_dist=alone)  # fmt: skip
    except dcp.CheckpointException as exc:
        raise CheckpointError(
            f"cannot load the shards of checkpoint {str(path)!r} into this model and optimizer: {dcp_failure(exc)}"
        ) from None
    return {"model": model_state, "optimizer": optimizer_state, "sharded": True}


def full_model_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The whole model of the sharded checkpoint ``path``, keys of the plain model; one process.

    Reads only the ``model.*`` entries, assembled from every rank's shards into full CPU
    tensors, without a process group: the result loads with ``model.load_state_dict`` into the
    unparallelised model.

    Raises:
        CheckpointError: the directory is not a complete sharded checkpoint.

    Example:
        >>> weights = full_model_state("ckpt/ckpt-e0002-s000000012.ckpt")
        >>> Net().load_state_dict(weights)
    """
    import torch.distributed.checkpoint as dcp  # slow to import (DTensor, sympy): only when used
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    path = Path(path)
    read_sharded(path)
    entries = check_complete(path)
    prefix = "model."
    model: dict[str, Any] = {}
    budget = directory_bytes(path)  # the tensors cannot hold more than the files do
    for key, info in entries.items():
        if not key.startswith(prefix):
            continue
        if isinstance(info, TensorStorageMetadata):
            budget -= info.size.numel() * info.properties.dtype.itemsize
            if budget < 0:
                raise CheckpointError(
                    f"sharded checkpoint {str(path)!r} is corrupt: its metadata describes more model bytes than its "
                    "files hold; use an earlier checkpoint"
                )
            model[key[len(prefix) :]] = torch.empty(info.size, dtype=info.properties.dtype)
        elif isinstance(info, BytesStorageMetadata):
            model[key[len(prefix) :]] = None  # DCP puts the saved object here
    if not model:
        raise CheckpointError(f"sharded checkpoint {str(path)!r} holds no model entries")
    try:
        with _quiet_single_process():
            dcp.load({"model": model}, storage_reader=safe_reader(path), planner=safe_planner(), no_dist=True)
    except dcp.CheckpointException as exc:
        raise CheckpointError(
            f"cannot read the model of sharded checkpoint {str(path)!r}: {dcp_failure(exc)}; use an earlier checkpoint"
        ) from None
    return model


def dcp_failure(exc: BaseException) -> str:
    """What went wrong in a ``torch.distributed.checkpoint`` failure, in a line per rank, without its tracebacks.

    DCP gathers every rank's exception and traceback into one ``CheckpointException``, whose text
    is those tracebacks. An ember error raised inside (the safe loader's refusal) is given as it is.
    """
    failures = getattr(exc, "failures", None) or {}
    parts = []
    for rank, failure in sorted(failures.items()):
        error = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(error, CheckpointError):
            parts.append(f"rank {rank}: {error}")
        elif isinstance(error, BaseException):  # torch's own load errors come wrapped in advice to load unsafely
            parts.append(f"rank {rank}: {type(error).__name__}: {safe_loader_reason(error)}")
    return "; ".join(parts) or type(exc).__name__


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that it loads in one process: without a process group that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def directory_bytes(path: Path) -> int:
    """Bytes of the files in the directory ``path``."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
