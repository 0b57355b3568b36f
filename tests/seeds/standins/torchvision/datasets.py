"""torchvision's ``MNIST`` and ``CIFAR10`` with made-up images of their size, computed per index.

Each image is a function of its index (no file, no download): the class's own bright stripe on
noise, so a small model learns it within a few batches. Lengths are the real ones (the example
programs split them with fixed sizes), and nothing is held in memory; a ``SIZE`` file in the
dataset's root folder (a test's small "download") sets the number of training images instead
(``"512"``), or of training and test images (``"512 64"``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image  # imported with torchvision, as the real one does (programs use PIL.Image after `import PIL`)


class _Synthetic:
    classes: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    lengths = (0, 0)

    def __init__(self, root: str | Path = "", train: bool = True, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, download: bool = False) -> None:  # fmt: skip
        self.root, self.train, self.transform, self.target_transform = root, train, transform, target_transform
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self._offset = 0 if train else 10**7

    def __len__(self) -> int:
        size = Path(self.root) / "SIZE" if str(self.root) else None
        if size is not None and size.is_file():
            sizes = size.read_text().split()  # training images [test images]
            if self.train or len(sizes) > 1:
                return int(sizes[0 if self.train else 1])
        return self.lengths[0] if self.train else self.lengths[1]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        rng = np.random.default_rng(index + self._offset)
        label = int(rng.integers(len(self.classes)))
        image = rng.integers(0, 96, size=self.shape, dtype=np.uint8)
        rows = self.shape[0] // len(self.classes)
        image[label * rows : (label + 1) * rows] = 255
        target = label if self.target_transform is None else self.target_transform(label)
        return (image if self.transform is None else self.transform(image)), target


class MNIST(_Synthetic):
    """60,000 training and 10,000 test images, 28 x 28, classes 0-9."""

    classes = tuple(f"{d} - {w}" for d, w in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")))  # fmt: skip
    shape = (28, 28)
    lengths = (60000, 10000)


class CIFAR10(_Synthetic):
    """50,000 training and 10,000 test images, 32 x 32 x 3, ten classes."""

    classes = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    shape = (32, 32, 3)
    lengths = (50000, 10000)


IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder:
    """torchvision's ``ImageFolder``: ``root/<class>/<image>`` read with PIL as RGB, the classes
    sorted by name; ``classes``, ``class_to_idx``, ``samples`` and ``targets`` as torchvision's."""

    def __init__(self, root: str | Path, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None) -> None:  # fmt: skip
        self.root, self.transform, self.target_transform = str(root), transform, target_transform
        folder = Path(root)
        if not folder.is_dir():
            raise FileNotFoundError(f"no image folder at {folder}")
        self.classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [(str(f), i) for i, name in enumerate(self.classes) for f in sorted((folder / name).iterdir())
                        if f.suffix.lower() in IMG_EXTENSIONS]  # fmt: skip
        if not self.samples:
            raise FileNotFoundError(f"no images in the class folders of {folder}")
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, label = self.samples[index]
        with Image.open(path) as raw:
            image = raw.convert("RGB")
        target = label if self.target_transform is None else self.target_transform(label)
        return (image if self.transform is None else self.transform(image)), target


def write_image_files(folder: str | Path, names: list[str], size: int = 16, seed: int = 0) -> None:
    """Write small RGB images ``folder/<name>`` (the suffix picks the format): the test's
    "download" for ``ImageFolder`` and for programs that read image files themselves. The image
    of the ``k``-th class (its folder, or for a name in no folder what precedes its last ``_``,
    as in ``Abyssinian_1.jpg``) has a bright ``k``-th band of rows, so a small model learns it."""

    def label_of(name: str) -> str:
        return Path(name).parent.name or name.rsplit("_", 1)[0]

    classes = sorted({label_of(name) for name in names})
    rng = np.random.default_rng(seed)
    for name in names:
        label = classes.index(label_of(name))
        image = rng.integers(0, 96, size=(size, size, 3), dtype=np.uint8)
        rows = max(1, size // len(classes))
        image[label * rows : (label + 1) * rows] = 255
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
