"""``resnet18``: a small CNN with ResNet's ``conv1`` / ``fc`` attributes (see __init__)."""

from __future__ import annotations

import torch
from torch import nn


class _SmallResNetLike(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.relu(self.conv1(x)))
        return self.fc(torch.flatten(x, 1))


def resnet18(num_classes: int = 1000) -> nn.Module:
    return _SmallResNetLike(num_classes)
