"""CrypTen 0.4.1 imports and converts models on current torch through mpcml's shims alone."""

from __future__ import annotations

import subprocess
import sys

import torch


def test_import_crypten_after_mpcml_works_in_a_fresh_interpreter() -> None:
    code = "import mpcml, crypten, sys; print(crypten.__version__); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out[0] == "0.4.1"


def test_import_mpcml_alone_does_not_import_torch() -> None:
    code = "import sys, mpcml; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    assert out == "False"


def test_from_pytorch_converts_a_model_that_computes_like_the_original() -> None:
    from mpcml.runtime import compat

    compat.apply()
    import crypten

    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    converted = crypten.nn.from_pytorch(net, torch.empty(1, 4))
    x = torch.randn(5, 4)
    assert torch.allclose(converted(x), net(x), atol=1e-6)


def test_config_reads_are_cached_and_see_every_kind_of_change() -> None:
    from mpcml.runtime import compat

    compat.apply()
    import crypten

    cfg = crypten.cfg
    table = cfg.functions
    before = cfg.functions.exp_iterations
    try:
        assert cfg.functions is table  # cached, not rebuilt per read
        with cfg.temp_override({"functions.exp_iterations": before + 1}):
            assert cfg.functions.exp_iterations == before + 1
            assert cfg["functions.exp_iterations"] == before + 1
        assert cfg.functions.exp_iterations == before
        cfg.functions.exp_iterations = before + 2  # inside a table: the tree stays the same
        assert cfg.functions.exp_iterations == before + 2
        assert table.exp_iterations == before + 2  # a table held across the change
        cfg["functions.exp_iterations"] = before + 3  # CrypTen merges: a new tree
        assert cfg.functions.exp_iterations == before + 3
        assert cfg.functions.sqrt_nr_iters == 3
    finally:
        cfg.functions.exp_iterations = before
    assert cfg.functions.exp_iterations == before


def test_stock_restores_crypten_as_shipped() -> None:
    from mpcml.runtime import compat

    compat.apply()
    from crypten.config.config import CrypTenConfig
    from crypten.mpc.mpc import MPCTensor
    from crypten.mpc.primitives import converters

    cached, a2b, init = CrypTenConfig.__getattribute__, converters._A2B, MPCTensor.__init__
    try:
        compat.stock()
        assert CrypTenConfig.__getattribute__ is not cached
        assert CrypTenConfig.__getattribute__.__module__ == "crypten.config.config"
        assert converters._A2B is not a2b
        assert converters._A2B.__module__ == "crypten.mpc.primitives.converters"
        assert MPCTensor.__init__ is not init
        assert MPCTensor.__init__.__module__ == "crypten.mpc.mpc"
    finally:
        CrypTenConfig.__getattribute__, converters._A2B = cached, a2b
        MPCTensor.__init__ = init


def test_reveals_decode_negative_values_just_above_an_integer_exactly() -> None:
    # CrypTen's own decoder read raw -458747 (-6.99992) as -7.99992: a 3-party log once
    # revealed -8 for ln(0.001) that way.
    from mpcml.runtime import compat

    compat.apply()
    import crypten

    encoder = crypten.encoder.FixedPointEncoder()
    raw = torch.cat(
        [
            torch.arange(-(2**20), 2**20),
            torch.tensor([-(2**40) + 3, 2**40 + 3, -(2**16) * 1000 + 7]),
        ]
    )
    assert torch.equal(encoder.decode(raw), (raw.double() / 2**16).float())
    assert float(encoder.decode(torch.tensor([-458747]))) == -458747 / 2**16
    assert encoder.decode(encoder.encode(torch.tensor([-6.5, 0.25, 3.0]))).tolist() == [
        -6.5,
        0.25,
        3.0,
    ]
    assert torch.equal(crypten.encoder.FixedPointEncoder(precision_bits=0).decode(raw), raw)
