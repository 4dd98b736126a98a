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


def mlp(dropout: bool = True) -> nn.Module:
    """Linear, ReLU, Dropout (left out for training, which must be deterministic), Linear,
    Sigmoid."""
    layers: list[nn.Module] = [nn.Linear(6, 8), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(0.1))
    return nn.Sequential(*layers, nn.Linear(8, 1), nn.Sigmoid())


def seeded(name: str) -> nn.Module:
    """The model `name` with fixed weights and moved batch-norm statistics, in eval mode."""
    torch.manual_seed(5)
    model = ResidualCNN() if name == "cnn" else mlp(dropout=name != "mlp-train")
    if name == "cnn":
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(4, 1, 8, 8))
    return model.eval()


TRAIN_STEPS = 3
TRAIN_LR = 0.5


def labels() -> torch.Tensor:
    """0/1 targets for the training test's `example_input("mlp-train")`."""
    return (example_input("mlp-train").sum(1, keepdim=True) > 0).float()


def train_plaintext(model: nn.Module) -> nn.Module:
    """TRAIN_STEPS of full-batch SGD with BCE, in torch."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR)
    for _ in range(TRAIN_STEPS):
        loss = nn.functional.binary_cross_entropy(model(example_input("mlp-train")), labels())
        opt.zero_grad()
        torch.autograd.backward(loss)
        opt.step()
    return model


def example_input(name: str) -> torch.Tensor:
    """An input batch for `name`."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(2, 1, 8, 8, generator=g) if name == "cnn" else torch.randn(5, 6, generator=g)
