"""Content-addressed file storage under ``<data>/blobs/<aa>/<bb>/<sha256>``.

An upload streams into ``<data>/tmp/`` while being hashed, and is renamed into place only when
its digest equals the one in the URL; a cut-off upload leaves at most a temporary file, which
the next start-up removes. The only path ever built from client input is from a digest that
:func:`ember.server.naming.sha256` has checked to be 64 hex digits.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import HTTPException

from ember.server import naming


class BlobStore:
    """The blob folder of one server.

    Example:
        >>> store = BlobStore(Path("/srv/ember"))
        >>> store.path("ab" * 32)
        PosixPath('/srv/ember/blobs/ab/ab/abab...')
    """

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "blobs"
        self.tmp = data_dir / "tmp"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha: str) -> Path:
        """Where the blob with this digest lives (the digest is checked first)."""
        sha = naming.sha256(sha)
        return self.root / sha[:2] / sha[2:4] / sha

    def has(self, sha: str) -> bool:
        """Whether the blob's file is present."""
        return self.path(sha).is_file()

    def clean_tmp(self) -> None:
        """Remove temporary files left by uploads that were cut off."""
        for leftover in self.tmp.glob("*.part"):
            leftover.unlink(missing_ok=True)

    async def receive(self, sha: str, chunks: AsyncIterator[bytes], max_bytes: int) -> int:
        """Store a streamed upload under ``sha`` after checking its digest; return its size.

        Raises:
            HTTPException: 413 when it passes ``max_bytes``; 422 when its digest differs.
        """
        final = self.path(sha)
        tmp = self.tmp / f"{secrets.token_hex(16)}.part"
        hasher = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise HTTPException(413, f"the file passes the server's limit of {max_bytes} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
            if hasher.hexdigest() != sha:
                raise HTTPException(
                    422, f"the bytes sent hash to {hasher.hexdigest()}, not to {sha}: the upload was damaged"
                )
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return size
