"""Images logged by a run: PNG files in ``images/`` and their index, ``images.jsonl``.

``run.log_image(name, image, step)`` encodes the image as PNG with the standard library's zlib (a
PNG of 8-bit gray, gray+alpha, RGB or RGBA pixels is a few lines, so ember needs no imaging
library; a PIL image is read through its own ``convert``), writes ``images/<name>/<step>.png``
atomically and then appends one line to
``images.jsonl``::

    {"name": "samples/real", "step": 100, "time": 1716200000.1, "file": "images/samples/real/100.png",
     "width": 64, "height": 48, "size": 3021, "sha256": "..."}

The index is append-only like the metrics files, so ``ember upload`` sends it from a cursor
(``POST /runs/{id}/images`` with the PNG bytes of its lines) and an upload cut off anywhere
completes on retry with no image twice.

Example:
    >>> run.log_image("samples", torch.rand(3, 32, 32), step=500)
    >>> [i["step"] for i in read_images(run.path)]
    [500]
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

from ember._atomic import atomic_write, why_write_failed
from ember.errors import TrackingError
from ember.track._fs import append_line, complete_lines, file_kind
from ember.track._upload_io import UploadError, lines_from, no_follow
from ember.track.receiver import ImageLine, ImageLines, RunReceiver

IMAGES_FILE = "images.jsonl"
IMAGES_DIR = "images"
MAX_SIDE = 16384
MAX_PNG_BYTES = 16 * 1024 * 1024
"""The largest PNG a run may log (the server refuses larger ones too)."""
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BATCH_PNG_BYTES = 8 * 1024 * 1024
"""About the most PNG bytes one upload request carries (a larger single image goes alone)."""
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}){0,4}")


def check_name(name: object) -> str:
    """An image name: 1-5 parts of letters, digits, ``_ . -`` joined by ``/`` (``samples/real``)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or len(name) > 200:
        raise TrackingError(
            f"image name {name!r}: use letters, digits, '_', '.', '-', and '/' between up to 5 parts "
            "(each starting with a letter, digit or '_'), e.g. 'samples/real'"
        )
    return name


def _pixels(image: Any) -> Any:
    """``image`` as a C-contiguous uint8 numpy array of shape (H, W, C), C in 1-4."""
    import numpy as np

    kind = type(image).__module__.split(".")[0]
    if kind == "PIL":
        mode = (
            "RGBA"
            if image.mode in ("RGBA", "LA", "PA", "P")
            else ("L" if image.mode in ("L", "1", "I", "F") else "RGB")
        )
        return np.asarray(image.convert(mode), dtype=np.uint8).reshape(image.height, image.width, -1)
    chw = False
    if kind == "torch":
        chw = image.ndim == 3 and image.shape[0] in (1, 3, 4) and image.shape[-1] not in (1, 3, 4)
        image = _tensor_array(image)
    if not isinstance(image, np.ndarray):
        raise TrackingError(f"log_image takes a numpy array, a PIL image or a torch tensor, got {type(image).__name__}")
    arr = image
    if arr.ndim == 3 and chw:
        arr = arr.transpose(1, 2, 0)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 2, 3, 4) or 0 in arr.shape[:2]:
        raise TrackingError(
            f"image of shape {tuple(image.shape)}: use HxW, HxWxC or (tensors) CxHxW with C in 1, 3 or 4"
        )
    if max(arr.shape[:2]) > MAX_SIDE:
        raise TrackingError(f"image of shape {tuple(image.shape)}: a side is longer than {MAX_SIDE} pixels")
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if arr.dtype == np.bool_:
        return np.ascontiguousarray(arr.astype(np.uint8) * 255)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all() or arr.min() < 0 or arr.max() > 1:
            raise TrackingError(
                "a float image must hold values in [0, 1] (NaN and infinities are refused); "
                f"this one spans [{np.nanmin(arr)}, {np.nanmax(arr)}]: scale it, or pass uint8"
            )
        return np.ascontiguousarray(np.rint(arr * 255).astype(np.uint8))
    raise TrackingError(f"image of dtype {arr.dtype}: use uint8 (0-255) or float in [0, 1]")


def _tensor_array(tensor: Any) -> Any:
    """A torch tensor as a numpy array on the CPU; the float types numpy lacks (bfloat16, the
    float8 types) through float32."""
    import torch

    try:
        tensor = tensor.detach()
        if tensor.is_floating_point() and tensor.dtype not in (torch.float16, torch.float32, torch.float64):
            tensor = tensor.to(dtype=torch.float32)
        return tensor.to("cpu").numpy()
    except (RuntimeError, TypeError, NotImplementedError, ValueError) as e:
        raise TrackingError(
            f"a {tensor.dtype} tensor on {tensor.device} (layout {tensor.layout}) cannot be read as pixels "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): pass a dense uint8 tensor, or "
            "floats in [0, 1]"
        ) from None


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(pixels: Any) -> bytes:
    """PNG bytes of an (H, W, C) uint8 array: 8-bit gray, gray+alpha, RGB or RGBA, no filter, zlib level 6."""
    import numpy as np

    height, width, channels = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, width * channels)], axis=1)
    color = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    idat = zlib.compress(rows.tobytes(), 6)
    return _PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header, each 1 to :data:`MAX_SIDE`; TrackingError when ``data``
    is not a PNG or its header gives another size (a PNG is stored as it is: its header is its size)."""
    if len(data) < 24 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise TrackingError("not a PNG file: log_image takes a saved file only as PNG (or pass the pixels)")
    width, height = struct.unpack(">II", data[16:24])
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise TrackingError(f"a PNG of {width}x{height} pixels (its header); a side may be 1 to {MAX_SIDE}")
    return int(width), int(height)


def _read_image_file(path: Path) -> bytes:
    """The bytes of a saved image: a regular file (a link to one is followed: it is the caller's own
    path) of at most :data:`MAX_PNG_BYTES`, checked before reading; a pipe or a device is not read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise TrackingError(f"image file {str(path)!r} does not exist") from None
    except OSError as e:
        raise TrackingError(f"image file {str(path)!r} cannot be read: {e.strerror or e}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise TrackingError(
            f"image file {str(path)!r} is {file_kind(info.st_mode)}, not a regular file: pass an image file "
            "or the pixels"
        )
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_PNG_BYTES:
            raise TrackingError(
                f"image file {str(path)!r} is {info.st_size} bytes; the most log_image reads is {MAX_PNG_BYTES}"
            )
        data = f.read(MAX_PNG_BYTES + 1)
    if len(data) > MAX_PNG_BYTES:  # it grew while read
        raise TrackingError(f"image file {str(path)!r} is over {MAX_PNG_BYTES} bytes")
    return data


def _decoded(path: Path, data: bytes) -> Any:
    """A saved image file that is not a PNG (its bytes ``data``), decoded by Pillow (loaded whole)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise TrackingError(
            f"{path}: not a PNG file; log_image reads other formats (JPEG, GIF, BMP, WebP...) through Pillow: "
            "`pip install pillow`, or save the image as PNG, or pass the pixels"
        ) from None
    try:
        with Image.open(io.BytesIO(data)) as opened:
            size = opened.size
            if max(size) <= MAX_SIDE:
                opened.load()
                return opened.copy()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise TrackingError(f"{path}: not an image file Pillow can read ({e})") from None
    raise TrackingError(f"{path}: an image of {size[0]}x{size[1]} pixels; a side may be at most {MAX_SIDE}")


def write_image(run_dir: Path, name: str, image: Any, step: int, when: float) -> dict[str, Any]:
    """Encode ``image``, write its PNG and append its line to ``images.jsonl``; return the line.

    A path to a saved image (T9k's and MLflow's habit: a chart saved by matplotlib) is copied as
    it is when it is a PNG; another format (JPEG, GIF, BMP, WebP...) is decoded by Pillow, when
    installed, and stored as PNG.

    Raises:
        TrackingError: a bad name or image, one too large, a file that is no image (or not a PNG
            without Pillow), or this name already logged at ``step``.
    """
    check_name(name)
    if isinstance(image, (str, os.PathLike)):
        data = _read_image_file(Path(image))
        if data[:8] == _PNG_SIGNATURE:
            width, height = png_size(data)
        else:
            pixels = _pixels(_decoded(Path(image), data))
            height, width = int(pixels.shape[0]), int(pixels.shape[1])
            data = encode_png(pixels)
    else:
        pixels = _pixels(image)
        height, width = int(pixels.shape[0]), int(pixels.shape[1])
        data = encode_png(pixels)
    if len(data) > MAX_PNG_BYTES:
        raise TrackingError(f"image {name!r} is {len(data)} bytes as PNG; the most is {MAX_PNG_BYTES}")
    rel = f"{IMAGES_DIR}/{name}/{step}.png"
    path = run_dir / rel
    if path.exists():
        raise TrackingError(f"image {name!r} is already logged at step {step}: log it at another step")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)  # fsynced before its line is appended: no line names a lost file
    except OSError as e:
        raise TrackingError(f"cannot write image {name!r} to {path}: {why_write_failed(e)}") from None
    line = {
        "name": name,
        "step": step,
        "time": when,
        "file": rel,
        "width": width,
        "height": height,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    try:
        append_line(run_dir / IMAGES_FILE, json.dumps(line, separators=(",", ":")) + "\n")
    except OSError as e:
        path.unlink(missing_ok=True)  # no file without its line: it could never be logged at this step again
        raise TrackingError(f"cannot add image {name!r} to {run_dir / IMAGES_FILE}: {why_write_failed(e)}") from None
    return line


def read_images(run_dir: Path | None) -> list[dict[str, Any]]:
    """The lines of a run's ``images.jsonl`` (complete lines only), in the order logged.

    Raises:
        TrackingError: the file is not a regular file, or a complete line is not an object.
    """
    if run_dir is None:
        return []
    path = run_dir / IMAGES_FILE
    lines = []
    for number, line in complete_lines(path):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise TrackingError(
                f"{path}: line {number} is not JSON ({type(e).__name__}); it was not written by ember"
            ) from None
        if not isinstance(record, dict):
            raise TrackingError(f"{path}: line {number} is not a JSON object; it was not written by ember")
        lines.append(record)
    return lines


def send(receiver: RunReceiver, run_id: str, run_dir: Path, cursor: int, max_lines: int) -> int:
    """Upload ``images.jsonl`` from ``cursor`` with each line's PNG; return the new cursor.

    ``max_lines``: lines read for one batch at most (the client's ``BATCH_LINES``).

    A batch carries about :data:`BATCH_PNG_BYTES` of PNG (base64 in the JSON body); the server
    stores each (name, step) once and moves the cursor in the same transaction, so a retry
    adds nothing.
    """
    path = run_dir / IMAGES_FILE
    while True:
        lines, end = lines_from(path, cursor, max_lines)
        if end == cursor:
            return cursor
        batch: list[ImageLine] = []
        used, total = cursor, 0
        for line in lines:
            if line.strip():
                try:
                    record = json.loads(line)
                    rel = str(record["file"])
                    if not rel.startswith(IMAGES_DIR + "/") or ".." in rel.split("/"):
                        raise ValueError(f"file {rel!r} is not under {IMAGES_DIR}/")
                    with open(run_dir / rel, "rb", opener=no_follow) as f:
                        data = f.read(MAX_PNG_BYTES + 1)
                    name, step, when = record["name"], record["step"], record["time"]
                except (KeyError, TypeError, ValueError, OSError) as e:
                    raise UploadError(f"{path}: the line at byte {used} names no readable image ({e})") from None
                if batch and total + len(data) > BATCH_PNG_BYTES:
                    break
                batch.append({"name": name, "step": step, "time": when, "png": base64.b64encode(data).decode()})
                total += len(data)
            used += len(line) + 1
        body: ImageLines = {"start": cursor, "end": used, "images": batch}
        cursor = receiver.put_images(run_id, body)
