"""The demo's model architectures.

Plain `nn.Sequential` subclasses made only of Linear/ReLU/Sigmoid, so that torch.fx traces them
and CrypTen has an encrypted counterpart for every layer. Subclassing `nn.Sequential` keeps the
state_dict keys stable (`0.weight`, `2.bias`, ...), so a saved model loads into a fresh instance.
"""

from __future__ import annotations

from torch import nn


class LogisticRegression(nn.Sequential):
    """Logistic regression on the breast-cancer features: one probability per row."""

    def __init__(self, in_features: int = 30) -> None:
        super().__init__(nn.Linear(in_features, 1), nn.Sigmoid())


class BreastCancerMLP(nn.Sequential):
    """A one-hidden-layer network on the breast-cancer features: one probability per row."""

    def __init__(self, in_features: int = 30, hidden: int = 16) -> None:
        super().__init__(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
            nn.Sigmoid(),
        )


class DigitsMLP(nn.Sequential):
    """Bob's private classifier of 8x8 digit images (64 pixels in [0, 1]): returns 10 logits.

    Logits rather than probabilities, because an argmax needs no softmax, and a softmax is costly
    under MPC.
    """

    def __init__(self) -> None:
        super().__init__(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class DigitsTanhMLP(nn.Sequential):
    """A digits classifier with smooth non-linearities: Tanh, and a final Softmax.

    What the approximation tuner has something to choose for.
    """

    def __init__(self) -> None:
        super().__init__(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10), nn.Softmax(dim=1))


class DigitsCNN(nn.Sequential):
    """A small convolutional digits classifier on 1x8x8 images.

    Tanh, average pooling and a final Softmax.
    """

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(1, 4, 3),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(36, 10),
            nn.Softmax(dim=1),
        )
