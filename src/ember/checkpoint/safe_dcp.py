"""Reading ``torch.distributed.checkpoint`` (DCP) directories without running code from them.

DCP reads a checkpoint's ``.metadata`` with :mod:`pickle` and the non-tensor entries of its shard
files ("bytes" entries: an optimizer's ``lr``, ``betas``...) with ``torch.load(weights_only=False)``:
a directory named like a checkpoint could run its code in any process that opens it. ember reads
DCP directories only through what this module gives DCP instead:

* :func:`read_metadata`: an unpickler that admits the classes DCP's metadata is made of (the
  ``torch.distributed.checkpoint.metadata`` dataclasses, DCP's per-entry storage record,
  ``torch.Size``, dtypes and layouts, a ``pathlib`` path) and nothing else, then checks the
  result's shape: file names without a folder part, offsets and lengths that are numbers;
* :func:`safe_reader`, a ``FileSystemReader`` that reads its metadata with it;
* :func:`safe_planner`, a ``DefaultLoadPlanner`` whose bytes entries must load with torch's safe
  loader (``weights_only=True``) before DCP sees them.

Tensor entries DCP already reads with ``weights_only=True``.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from ember.checkpoint.io import first_line, safe_loader_reason
from ember.errors import CheckpointError

METADATA_FILE = ".metadata"
_DCP = "torch.distributed.checkpoint"
_METADATA_CLASSES = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                     "TensorProperties", "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING")  # fmt: skip
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        *((f"{_DCP}.metadata", name) for name in _METADATA_CLASSES),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a layout by its name: torch.strided
        ("pathlib", "PosixPath"),  # storage_meta.checkpoint_id: a path, made without touching the disk
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
)
_FILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _MetadataUnpickler(pickle.Unpickler):
    """A pickle reader that builds DCP's metadata classes only: any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"it refers to {module}.{name}, which is not part of torch.distributed.checkpoint's metadata"
        )


def read_metadata(directory: Path, name: str = METADATA_FILE) -> Any:
    """DCP's ``Metadata`` of the checkpoint directory ``directory``, read without running its code.

    Raises:
        CheckpointError: naming the directory and why, when the file is missing, does not unpickle
            with DCP's classes alone, or does not have the shape DCP writes.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    where = f"sharded checkpoint {str(directory)!r}"
    try:
        with open(directory / name, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RuntimeError, RecursionError, MemoryError) as exc:  # fmt: skip
        raise CheckpointError(
            f"{where} has no readable {_DCP} metadata ({type(exc).__name__}: {first_line(exc)}); "
            "use an earlier checkpoint"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: its {name} holds a {type(metadata).__name__}, not {_DCP} metadata")
    _check_shape(metadata, where)
    return metadata


def _check_shape(metadata: Any, where: str) -> None:
    """What ember and DCP read from the metadata has the types and values DCP writes."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(
        isinstance(k, str) and isinstance(v, TensorStorageMetadata | BytesStorageMetadata) for k, v in entries.items()
    ):
        raise CheckpointError(f"{where}: its metadata's entries are not DCP's tensor and bytes records")
    for key, info in entries.items():
        if isinstance(info, TensorStorageMetadata) and not (
            isinstance(info.size, torch.Size) and isinstance(getattr(info.properties, "dtype", None), torch.dtype)
        ):
            raise CheckpointError(f"{where}: the metadata of entry {key!r} has no tensor size and dtype")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise CheckpointError(f"{where}: its metadata names no shard files")
    for info in storage.values():
        ok = (
            isinstance(info, _StorageInfo)
            and isinstance(info.relative_path, str)
            and _FILE_NAME.match(info.relative_path) is not None
            and info.relative_path not in (".", "..")
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (info.offset, info.length))
        )
        if not ok:
            raise CheckpointError(
                f"{where}: its metadata places data at {getattr(info, 'relative_path', info)!r}, which is not a "
                "shard file of the directory (a file name with a byte offset and length)"
            )


@functools.cache
def _reader_class() -> type:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(dcp.FileSystemReader):
        """DCP's file reader, with the metadata read by :func:`read_metadata`."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            name = METADATA_FILE if rank is None else f"__{int(rank)}{METADATA_FILE}"
            metadata = read_metadata(Path(os.fspath(self.path)), name)
            if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


def safe_reader(directory: str | os.PathLike[str]) -> Any:
    """A ``torch.distributed.checkpoint.FileSystemReader`` of ``directory`` whose metadata is read safely."""
    return _reader_class()(directory)


@functools.cache
def _planner_class() -> type:
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        """DCP's load planner, with bytes entries admitted only when torch's safe loader reads them."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                torch.load(value, weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
                fqn = getattr(getattr(read_item, "dest_index", None), "fqn", "?")
                raise CheckpointError(
                    f"the entry {fqn!r} of a sharded checkpoint holds objects torch's safe loader refuses "
                    f"({safe_loader_reason(exc)}): it was not written by ember, or it was damaged"
                ) from None
            # What passed the safe loader holds plain data only, so DCP's own (unrestricted)
            # load of the same bytes builds the same objects and runs nothing else.
            value.seek(0)
            super().load_bytes(read_item, value)

    return SafePlanner


def safe_planner() -> Any:
    """A ``DefaultLoadPlanner`` that reads bytes entries only when ``weights_only=True`` admits them."""
    return _planner_class()()
