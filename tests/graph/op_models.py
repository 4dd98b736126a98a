"""Small models that, together, hold every op of the core ATen table (`mpcml.graph.aten`).

Each is captured, run on CrypTen shares by 2 and 3 parties, and compared with torch; the test
also checks that the union of their ops is the whole table, so a new op cannot go untested.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


class Convolutions(nn.Module):
    """Grouped and dilated conv, ReLU6, batch norm, ceil-mode pools, conv1d, adaptive pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(3, 3, 3, groups=3, dilation=2, bias=False)
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.max = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.avg = nn.AvgPool2d(2, padding=1, ceil_mode=True, count_include_pad=False)
        self.conv1d = nn.Conv1d(4, 2, 2)
        self.fc = nn.Linear(2 + 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(F.relu6(self.depthwise(x))))
        pooled = self.avg(self.max(y))
        line = self.conv1d(pooled.flatten(2))
        channels = F.adaptive_avg_pool2d(F.relu(y), (2, 2)).mean((2, 3))
        out: torch.Tensor = self.fc(torch.cat([line.mean(-1), channels], dim=1))
        return out


class Elementwise(nn.Module):
    """Gates and activations: hardswish, squeeze-and-excitation, SiLU, GELU, clamps, exp."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.register_buffer("mask", torch.tensor([1.0, 0, 1, 1, 0, 1]) > 0, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.fc(x))
        y = y * F.hardsigmoid(y) + F.silu(x) - F.gelu(x, approximate="tanh") / 4
        y = torch.clamp(y, min=-1.5) + torch.clamp(x, -0.5, 0.75) - F.gelu(x)
        mask = cast(torch.Tensor, self.mask)
        y = torch.where(mask, y, 0.5 * x) + torch.sigmoid(x) * torch.tanh(y)
        return (
            -y.detach()
            + torch.exp(x / 4)
            + torch.rsqrt(x * x + 1)
            + (1 - x).to(torch.float64).float()
        )


class Layout(nn.Module):
    """Reshapes, views, slices, gathers, embeddings, padding, reductions, layer norm, products."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.weight = nn.Parameter(torch.randn(6, 5) / 3)
        self.table = nn.Parameter(torch.randn(4, 5) / 2)  # rows picked by public indices
        self.register_buffer("order", torch.tensor([3, 0, 2]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = cast(torch.Tensor, self.order)
        y = self.norm(x.reshape(x.size(0), 4, 6))
        a, b = y.chunk(2, dim=1)
        scores = torch.softmax(a @ b.transpose(1, 2), dim=-1)
        z = torch.cat([scores, y[:, 1:3, :2]], dim=-1)
        z = torch.roll(z, 1, dims=1).index_select(2, order[:2]).unsqueeze(1)
        z = F.pad(z, (1, 0, 0, 1), value=0.5).squeeze(1)[:, order[[2, 1, 2]]]
        first = y.select(1, 0).matmul(self.weight)
        total = z.sum(dim=(1, 2)).unsqueeze(-1).expand(-1, 5)
        out: torch.Tensor = first + total + z.mean(dim=-1, keepdim=True)[:, 0]
        picked: torch.Tensor = F.embedding(order[:1], self.table)
        cubed: torch.Tensor = (first / 2).pow(3)
        return out + picked + cubed


class Attention(nn.Module):
    """A class token, position embeddings and PyTorch's own attention (a safe softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 4))
        self.position = nn.Parameter(torch.randn(1, 4, 4) / 2)
        self.attention = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([self.token.expand(x.size(0), -1, -1), x], dim=1) + self.position
        out, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        return cast(torch.Tensor, out[:, 0])


class ChannelsLast(nn.Module):
    """A channels-last block whose pooling restrides (as_strided, as in ConvNeXt)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return cast(torch.Tensor, self.pool(y).flatten(1))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "convolutions": (Convolutions, (3, 9, 9)),
    "elementwise": (Elementwise, (6,)),
    "layout": (Layout, (24,)),
    "attention": (Attention, (3, 4)),
    "channels_last": (ChannelsLast, (8, 2, 2)),
}
"""name -> (the model, its input row shape)."""


def seeded(name: str) -> nn.Module:
    """The model `name` with fixed weights and moved batch-norm statistics, in eval mode."""
    torch.manual_seed(3)
    make, shape = MODELS[name]
    model = make()
    with torch.no_grad():
        model.train()
        for _ in range(2):
            model(torch.randn(4, *shape))
    return model.eval()


def example_input(name: str) -> torch.Tensor:
    """A batch of 3 rows for `name`.

    The convolutions' input is scaled so that its batch norm sees variances of about 1:
    CrypTen's inverse square root is accurate from about 0.1 up, and a training job's batch
    statistics take it as they come.
    """
    g = torch.Generator().manual_seed(7)
    scale = 4.0 if name == "convolutions" else 1.0
    return scale * torch.randn(3, *MODELS[name][1], generator=g)
