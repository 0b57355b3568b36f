"""run.log_image: numpy, PIL and torch images stored as PNG in the run folder, read back pixel for pixel."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember import track
from ember.errors import TrackingError
from ember.track.images import encode_png, read_images


def decode_png(data: bytes) -> np.ndarray:
    """Pixels of an 8-bit PNG (Pillow when installed, else the unfiltered PNGs ember's encoder writes)."""
    try:
        import io

        from PIL import Image

        img = Image.open(io.BytesIO(data))
        arr = np.asarray(img)
        return arr if arr.ndim == 3 else arr[:, :, None]
    except ImportError:
        pass
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    channels = {0: 1, 4: 2, 2: 3, 6: 4}[color]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    assert depth == 8 and (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, channels)


@pytest.mark.parametrize(
    ("make", "expected_shape"),
    [
        (lambda a: a, (4, 6, 3)),  # numpy HxWxC uint8
        (lambda a: a[:, :, 0], (4, 6, 1)),  # numpy HxW
        (lambda a: a.astype(np.float32) / 255, (4, 6, 3)),  # float in [0, 1]
        (lambda a: torch.from_numpy(a).permute(2, 0, 1), (4, 6, 3)),  # tensor CxHxW
        (lambda a: torch.from_numpy(a), (4, 6, 3)),  # tensor HxWxC
        (lambda a: np.concatenate([a, np.full((4, 6, 1), 128, np.uint8)], axis=2), (4, 6, 4)),  # RGBA
    ],
)
def test_log_image_stores_a_png_that_reads_back_pixel_for_pixel(make, expected_shape) -> None:
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3) * 3
    with track.create_run(name="img") as run:
        run.log_image("samples/real", make(pixels), step=7)
    assert run.path is not None
    (line,) = read_images(run.path)
    assert (line["name"], line["step"], line["width"], line["height"]) == ("samples/real", 7, 6, 4)
    stored = decode_png((run.path / line["file"]).read_bytes())
    assert stored.shape == expected_shape
    assert (stored[:, :, :3] == pixels[:, :, : stored.shape[2]][:, :, :3]).all()
    assert line["file"] == "images/samples/real/7.png"
    assert json.loads((run.path / "images.jsonl").read_text().splitlines()[0]) == line


def test_pil_images_are_accepted() -> None:
    from PIL import Image

    with track.create_run(name="pil") as run:
        run.log_image("pil", Image.new("RGB", (5, 3), (10, 20, 30)), step=0)
    (line,) = run.images()
    assert (line["width"], line["height"]) == (5, 3)
    assert run.path is not None
    assert (decode_png((run.path / line["file"]).read_bytes()) == np.array([10, 20, 30], np.uint8)).all()


@pytest.mark.parametrize(
    ("name", "image", "step", "message"),
    [
        ("../x", np.zeros((2, 2), np.uint8), 0, "image name"),
        ("ok", np.zeros((2, 2), np.float32) + 2.0, 0, r"in \[0, 1\]"),
        ("ok", np.zeros((2, 2, 5), np.uint8), 0, "shape"),
        ("ok", np.zeros((2, 2), np.int64), 0, "dtype"),
        ("ok", [[0, 1]], 0, "numpy array, a PIL image or a torch tensor"),
        ("ok", np.zeros((2, 2), np.uint8), -1, "non-negative"),
    ],
)
def test_bad_images_are_refused_naming_the_problem(name, image, step, message) -> None:
    with track.create_run(name="bad") as run:
        with pytest.raises(TrackingError, match=message):
            run.log_image(name, image, step=step)
        assert run.images() == []


def test_the_same_name_and_step_is_refused_and_the_first_image_kept() -> None:
    with track.create_run(name="twice") as run:
        run.log_image("a", np.zeros((2, 2), np.uint8), step=1)
        with pytest.raises(TrackingError, match="already logged at step 1"):
            run.log_image("a", np.ones((2, 2), np.uint8), step=1)
        run.log_image("a", np.ones((2, 2), np.uint8), step=2)
    assert [i["step"] for i in run.images()] == [1, 2]


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_the_encoder_writes_pngs_that_pillow_reads_back(channels: int) -> None:
    """ember's own PNG writer, checked by a real decoder (Pillow), for every colour type it writes."""
    import io

    from PIL import Image

    pixels = np.random.default_rng(channels).integers(0, 256, (9, 7, channels), dtype=np.uint8)
    with Image.open(io.BytesIO(encode_png(pixels))) as image:
        assert image.mode == {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[channels]
        read = np.asarray(image).reshape(9, 7, channels)
    assert (read == pixels).all()


def test_other_ranks_check_the_arguments_and_store_nothing(tmp_path: Path) -> None:
    from ember.track.run import NoOpRun

    run = NoOpRun(
        {
            "id": "0" * 32,
            "name": "r",
            "folder": "default",
            "hparams": {},
            "labels": [],
            "description": "",
            "status": "Running",
        }
    )
    run.log_image("ok", np.zeros((2, 2), np.uint8), step=0)
    with pytest.raises(TrackingError, match="image name"):
        run.log_image("/bad", np.zeros((2, 2), np.uint8), step=0)


def test_a_png_file_is_logged_as_it_is_and_another_file_is_refused(tmp_path: Path) -> None:
    """MLflow's log_image/log_artifact habit: a chart saved by matplotlib as a file."""
    pixels = np.zeros((3, 5, 3), np.uint8)
    saved = tmp_path / "plot.png"
    saved.write_bytes(encode_png(pixels))
    with track.create_run(name="file") as run:
        run.log_image("plots/loss", saved, step=3)
        (tmp_path / "plot.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg either")
        with pytest.raises(TrackingError, match=r"plot\.jpg: not an image file Pillow can read"):
            run.log_image("plots/loss", tmp_path / "plot.jpg", step=4)
    (line,) = run.images()
    assert (line["width"], line["height"]) == (5, 3)
    assert (run.path / line["file"]).read_bytes() == saved.read_bytes()


@pytest.mark.parametrize("suffix", ["jpg", "gif", "bmp", "webp"])
def test_a_saved_file_of_another_format_is_stored_as_png(tmp_path: Path, suffix: str) -> None:
    """A JPEG (or GIF, BMP, WebP) saved by matplotlib or PIL is decoded by Pillow and kept as PNG."""
    from PIL import Image

    pixels = np.zeros((6, 8, 3), np.uint8)
    pixels[:, :4] = (200, 30, 30)
    saved = tmp_path / f"plot.{suffix}"
    Image.fromarray(pixels).save(saved, quality=100) if suffix == "jpg" else Image.fromarray(pixels).save(saved)
    with track.create_run(name="file") as run:
        run.log_image("plots/confusion", saved, step=1)
    (line,) = run.images()
    assert line["file"] == "images/plots/confusion/1.png" and (line["width"], line["height"]) == (8, 6)
    stored = decode_png((run.path / line["file"]).read_bytes())
    with Image.open(saved) as original:
        expected = np.asarray(original.convert("RGBA" if stored.shape[-1] == 4 else "RGB"))  # GIF: a palette
    assert (stored == expected).all()  # the decoded pixels, lossy format or not


def test_a_non_png_file_without_pillow_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pillow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    (tmp_path / "plot.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    monkeypatch.setattr(builtins, "__import__", no_pillow)
    with (
        track.create_run(name="file") as run,
        pytest.raises(TrackingError, match=r"plot\.jpg: not a PNG.*pip install pillow"),
    ):
        run.log_image("plots/loss", tmp_path / "plot.jpg", step=0)
    assert run.images() == []


def test_a_t9k_em_run_logs_a_saved_png_as_an_image(tmp_path: Path) -> None:
    """T9k scripts saved charts as files; `em` runs are ember's, so the file goes to log_image as it is."""
    from ember.compat.t9k import em

    saved = tmp_path / "confusion.png"
    saved.write_bytes(encode_png(np.zeros((4, 4, 3), np.uint8)))
    run = em.create_run(name="t9k")
    run.log_image("val/confusion", str(saved), step=1)
    run.finish()
    assert [(i["name"], i["step"]) for i in run.images()] == [("val/confusion", 1)]


def _track_imports() -> dict[str, set[str]]:
    """``{module: the ember.track modules it imports}`` for every module of ember.track, the
    imports inside functions included (a local import only hides a circle until it runs)."""
    import ast

    folder = Path(track.__file__).parent
    names = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ember.track"):
                rest = (node.module or "").removeprefix("ember.track").lstrip(".")
                deps |= {rest.split(".")[0]} if rest else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names if a.name.startswith("ember.track.")}
        graph[name] = (deps & names) - {name}
    return graph


def test_the_images_and_the_client_do_not_import_each_other_nor_any_track_module_its_importer() -> None:
    # images.send used the client's line reader and UploadError through a local import, while the
    # client imports images to upload them: a circle at run time. Both now read through _upload_io.
    graph = _track_imports()
    assert {"receiver", "_upload_io"} <= graph["images"] and {"images", "_upload_io"} <= graph["client"]
    assert "client" not in graph["images"]

    def reached(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        return seen

    circles = sorted((a, b) for a in graph for b in graph[a] if a in reached(b))
    assert circles == []
