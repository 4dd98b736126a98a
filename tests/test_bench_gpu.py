"""bench/gpu.py's models take the shapes its rows feed them, and its rows say what did not run."""

from __future__ import annotations

import pytest
import torch

from bench import gpu


@pytest.mark.parametrize("name", list(gpu.MODELS))
def test_each_model_takes_its_input_shape(name: str) -> None:
    out = gpu.MODELS[name]()(torch.zeros(2, *gpu.SHAPES[name]))
    assert out.shape == (2, 10)


def test_rows_carry_the_published_figures_and_why_a_row_did_not_run() -> None:
    lenet = gpu.Workload("LeNet", "inference", 1, False)
    cells = gpu._cells(lenet, "cuda", "not run: no CUDA device")
    assert cells[4] == "not run: no CUDA device" and cells[-2:] == ["0.38", "0.031"]
    alexnet = gpu.Workload("AlexNet", "inference", 1, True)
    ran = {"seconds": 1.5, "mib": [1.0, 2.0, 3.0], "peak_mib": [10.0, 20.0, 30.0]}
    assert gpu._cells(alexnet, "cuda", ran)[4:] == ["1.500", "1/2/3", "10/20/30", "-", "-"]
