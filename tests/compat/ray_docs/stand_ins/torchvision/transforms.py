"""``ToTensor``, ``Normalize``, ``Compose`` for uint8 HxW images (see __init__)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class ToTensor:
    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(image.astype(np.float32) / 255.0).unsqueeze(0)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, value: Any) -> Any:
        for transform in self.transforms:
            value = transform(value)
        return value
