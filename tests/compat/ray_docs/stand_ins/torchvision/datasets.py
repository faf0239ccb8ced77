"""``FashionMNIST``: 256 deterministic synthetic 28x28 images (see __init__)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class FashionMNIST:
    def __init__(self, root: str, train: bool = True, download: bool = False,
                 transform: Callable[[Any], Any] | None = None) -> None:
        rng = np.random.default_rng(0 if train else 1)
        self.targets = np.arange(256) % 10
        patterns = rng.integers(0, 256, size=(10, 28, 28))
        noise = rng.integers(-40, 40, size=(256, 28, 28))
        self.data = np.clip(patterns[self.targets] + noise, 0, 255).astype(np.uint8)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image: Any = self.data[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])
