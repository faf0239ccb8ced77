"""The optical-recognition handwritten digits (UCI, via scikit-learn), shipped in the package.

1,797 grayscale 8x8 images with pixel values 0..16, labels 0..9, about 180 per class:
scikit-learn's ``load_digits()`` exported once to ``digits.npz`` (45 KB). Source and
license: README.md in this folder.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

DIGITS_FILE = "digits.npz"
NUM_CLASSES = 10


def load_digits() -> tuple[Any, Any]:
    """``(images, labels)``: NumPy arrays of shape ``(1797, 8, 8)`` and ``(1797,)``, uint8.

    Pixel values are 0..16; labels 0..9. Reads the file inside the package (NumPy needed,
    ``pip install 'cairn[torch]'``); nothing is downloaded.
    """
    import numpy

    with resources.files(__package__).joinpath(DIGITS_FILE).open("rb") as f:
        with numpy.load(f, allow_pickle=False) as archive:
            return archive["images"], archive["labels"]
