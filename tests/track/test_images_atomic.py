"""An image's PNG is written as every other file of the store: atomically and durably (ember._atomic)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ember import _atomic
from ember.errors import TrackingError
from ember.track.images import IMAGES_FILE, write_image


def test_an_images_file_and_its_folder_are_fsynced_before_its_line_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = _atomic.fsync_dir

    def recording(directory: str | os.PathLike[str]) -> None:
        synced.append(Path(directory))
        assert not (tmp_path / IMAGES_FILE).exists()  # the index does not name it yet
        real(directory)

    monkeypatch.setattr(_atomic, "fsync_dir", recording)
    line = write_image(tmp_path, "samples/real", np.zeros((4, 4, 3), np.uint8), step=3, when=0.0)
    assert synced == [tmp_path / "images" / "samples" / "real"]
    assert (tmp_path / line["file"]).stat().st_size == line["size"]


def test_a_write_cut_short_leaves_neither_the_image_nor_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(TrackingError, match=r"cannot write image 'samples' to .*: No space left on device \(the disk"):
        write_image(tmp_path, "samples", np.zeros((4, 4, 1), np.uint8), step=1, when=0.0)
    monkeypatch.undo()
    folder = tmp_path / "images" / "samples"
    assert list(folder.iterdir()) == []
    assert not (tmp_path / IMAGES_FILE).exists()
    write_image(tmp_path, "samples", np.zeros((4, 4, 1), np.uint8), step=1, when=0.0)  # the step is still free
    assert [p.name for p in folder.iterdir()] == ["1.png"]
