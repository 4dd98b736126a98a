"""torchvision's image classifiers, as a user has them: the zoo of bench/models.py and the tests.

`make install` puts torchvision 0.28 in a folder of its own (`.venv/zoo`): PyPI's wheel is a CUDA
build whose compiled ops (detection's nms and the like) cannot load beside the CPU torch, and
its import then fails registering their shapes; a torchvision on the path would also break
transformers' import. `torchvision()` puts the folder on the path, declares the two op
signatures torchvision's import registers shapes for, and imports it; the classifiers use none
of the compiled ops.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import torch

ZOO = Path(__file__).resolve().parents[1] / ".venv" / "zoo"

CLASSIFIERS = (
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
    "wide_resnet50_2",
    "alexnet",
    "vgg11",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "densenet121",
    "shufflenet_v2_x0_5",
    "mnasnet0_5",
    "efficientnet_b0",
    "regnet_y_400mf",
    "convnext_tiny",
    "squeezenet1_0",
    "googlenet",
    "vit_b_16",
    "swin_t",
)
"""The 18 classifiers of issue 33, in the order the report lists them."""

FULL_SIZE = {"vit_b_16": 224, "swin_t": 224}
"""Models that accept only their training resolution; the others run at 64x64."""

_library: Any = None


def torchvision() -> Any:
    """The torchvision module, importable beside the CPU torch; None when not installed."""
    global _library
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    if not (ZOO / "torchvision").is_dir():
        return None
    if str(ZOO) not in sys.path:
        sys.path.append(str(ZOO))
    if _library is None:
        _library = torch.library.Library("torchvision", "FRAGMENT")  # type: ignore[no-untyped-call]
        for op in ("nms", "qnms"):
            with contextlib.suppress(RuntimeError):  # declared: its compiled ops did load
                _library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision as module  # type: ignore[import-not-found,unused-ignore]

    return module


def classifier(name: str, seed: int = 0) -> torch.nn.Module:
    """The classifier `name` with random weights (seeded), in eval mode."""
    tv = torchvision()
    if tv is None:
        raise RuntimeError(f"torchvision is not installed in {ZOO} (make install puts it there)")
    torch.manual_seed(seed)
    settings = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    model: torch.nn.Module = getattr(tv.models, name)(**settings)
    return model.eval()


def input_shape(name: str, size: int = 64) -> tuple[int, int, int]:
    """The row shape `name` runs on: 3 x size x size, or its full resolution where it needs it."""
    side = FULL_SIZE.get(name, size)
    return (3, side, side)
