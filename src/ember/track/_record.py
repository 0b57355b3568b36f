"""What a run and an artifact share: a folder in the store and the metadata read from its JSON file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Record:
    """A run or an artifact: its folder and its metadata (``run.json``, ``artifact.json``).

    Ranks other than 0 get a no-op twin (``NoOpRun``, ``NoOpArtifact``): no folder, an empty id,
    and ``active`` False.
    """

    kind: str
    """``"run"`` or ``"artifact"``: how lineage names the kind."""

    def __init__(self, path: Path | None, meta: dict[str, Any]) -> None:
        self._path = path
        self._meta = meta

    @property
    def id(self) -> str:
        """A unique id (32 hex characters); empty on a no-op twin."""
        return str(self._meta["id"])

    @property
    def name(self) -> str:
        """The name given at creation."""
        return str(self._meta["name"])

    @property
    def path(self) -> Path | None:
        """The folder in the store; None on a no-op twin (ranks other than 0)."""
        return self._path

    @property
    def active(self) -> bool:
        """False on the no-op twin that ranks other than 0 get."""
        return True
