"""Models the graph tests trace, seeded so that every process builds the same weights."""

from __future__ import annotations

import torch
from torch import nn


class ResidualCNN(nn.Module):
    """Conv, batch norm, a residual add, pooling, flatten, linear, tanh and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        y = y + self.conv2(y)
        y = self.avg(self.pool(y)).flatten(1)
        return torch.softmax(torch.tanh(self.fc(y)), dim=1)


def mlp() -> nn.Module:
    """Linear, ReLU, Dropout, Linear, Sigmoid."""
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 1), nn.Sigmoid())


def seeded(name: str) -> nn.Module:
    """The model `name` with fixed weights and moved batch-norm statistics, in eval mode."""
    torch.manual_seed(5)
    model = ResidualCNN() if name == "cnn" else mlp()
    if name == "cnn":
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(4, 1, 8, 8))
    return model.eval()


def example_input(name: str) -> torch.Tensor:
    """An input batch for `name`."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(2, 1, 8, 8, generator=g) if name == "cnn" else torch.randn(5, 6, generator=g)
