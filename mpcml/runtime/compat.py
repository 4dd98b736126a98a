"""Shims that let CrypTen 0.4.1 run on torch 2.11-2.14, unedited, and fix what it gets wrong.

Some are for its speed (a cache in front of its config, empty shells without random draws, a
three-party comparison), one for GPUs, one for its decoder. The GPU one routes
`CUDALongTensor`'s matmul and convolutions to `mpcml.runtime.blocks`; the decoder one reads
fixed point exactly. Every patch CrypTen needs lives here, so that a CrypTen upgrade means
reading one file. Targets: crypten 0.4.1 (the last release, 2022-12).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import io
import sys
import types
import warnings
from typing import Any, ClassVar

_LEGACY_REGISTRY = "torch.onnx._internal.registration"
_LEGACY_REGISTRY_NOW = "torch.onnx._internal.torchscript_exporter.registration"

_applied = False


class _RegistryAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves the registry's pre-2.1 import path, lazily, to where current torch keeps it."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _LEGACY_REGISTRY:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        # The alias shares the real module's objects (crypten imports `registry` from it).
        real = importlib.import_module(_LEGACY_REGISTRY_NOW)
        module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})


def install() -> None:
    """Make `import crypten` work on current torch, whenever it happens later.

    Cheap: imports nothing. `import mpcml` calls it, so import mpcml before crypten.
    """
    # crypten/nn/onnx_converter.py imports the TorchScript ONNX exporter's symbolic registry by
    # its pre-2.1 path; current torch keeps the same registry under torchscript_exporter.
    if not any(isinstance(f, _RegistryAlias) for f in sys.meta_path):
        sys.meta_path.append(_RegistryAlias())


def _export_pytorch_model(f: io.BytesIO, pytorch_model: Any, dummy_input: Any) -> io.BytesIO:
    # Same export as crypten.nn.onnx_converter._export_pytorch_model, but through the
    # TorchScript exporter: since torch 2.9 torch.onnx.export defaults to dynamo, which needs
    # onnxscript and ignores the symbolic registry CrypTen patches.
    import torch
    from crypten.nn import onnx_converter
    from torch.onnx import OperatorExportTypes

    torch.onnx.export(
        pytorch_model,
        dummy_input,
        f,  # type: ignore[arg-type]  # a file object, as torch documents
        do_constant_folding=False,
        export_params=True,
        input_names=["input"],
        operator_export_type=OperatorExportTypes.ONNX,
        output_names=["output"],
        opset_version=onnx_converter._OPSET_VERSION,
        dynamo=False,
    )
    return f


def apply() -> None:
    """Patch CrypTen so that `crypten.nn.from_pytorch` works too; imports crypten. Idempotent."""
    global _applied
    if _applied:
        return
    install()
    from crypten.nn import onnx_converter

    # from_pytorch wraps ONNX's read-only weight arrays with torch.from_numpy and only reads
    # them; torch's warning about it is noise to every user of the model converter.
    warnings.filterwarnings(
        "ignore",
        message="The given NumPy array is not writable",
        category=UserWarning,
        module=r"crypten\.nn\.onnx_converter",
    )

    onnx_converter._export_pytorch_model = _export_pytorch_model
    _cache_config_reads()
    _exact_cuda_arithmetic()
    _exact_decode()
    _three_party_a2b()
    _empty_shells()
    _differentiable_inv_sqrt()
    _applied = True


def _differentiable_inv_sqrt() -> None:
    """Give CrypTen's inv_sqrt a gradient: d x^-1/2 = -x^-3/2 / 2.

    It has none, and its Newton steps update in place, which CrypTen's autograd refuses: a
    training job through a layer norm (a transformer's last layer fine-tuned) failed with
    "Autograd is not supported for in-place functions".
    """
    from crypten import gradients

    if gradients.get_grad_fn("inv_sqrt") is not None:
        return

    @gradients.register_function("inv_sqrt")
    class _InvSqrt(gradients.AutogradFunction):  # type: ignore[misc]
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            y = x.inv_sqrt()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> Any:
            (y,) = ctx.saved_tensors
            return grad_output.mul(y.square().mul(y)).mul(-0.5)


class _Reads:
    """What has been read from CrypTen's config since it last changed."""

    config: ClassVar[Any] = None
    """The OmegaConf object the reads came from; CrypTen replaces it on every change but one."""
    generation: ClassVar[int] = 0
    """Moved on by that one: an assignment inside a table (`cfg.mpc.provider = ...`)."""
    values: ClassVar[dict[str, Any]] = {}


class _Table:
    """A table of CrypTen's config, read through a cache; assignments go to the real table."""

    __slots__ = ("_generation", "_node", "_values")

    def __init__(self, node: Any) -> None:
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_generation", _Reads.generation)

    def __getattr__(self, key: str) -> Any:
        values = self._values
        if self._generation != _Reads.generation:
            values.clear()
            object.__setattr__(self, "_generation", _Reads.generation)
        try:
            return values[key]
        except KeyError:
            value = values[key] = _cached(getattr(self._node, key))
            return value

    def __setattr__(self, key: str, value: Any) -> None:
        setattr(self._node, key, value)
        _Reads.generation += 1
        _Reads.values = {}

    __getitem__ = __getattr__
    __setitem__ = __setattr__


def _cached(value: Any) -> Any:
    from omegaconf import DictConfig

    return _Table(value) if isinstance(value, DictConfig) else value


_STOCK_READ: list[Any] = [None]
_STOCK_A2B: list[Any] = [None]
_STOCK_MPC_INIT: list[Any] = [None]


def stock() -> None:
    """CrypTen as shipped, for a benchmark's stock CrypTen baseline.

    Undoes the config cache, the three-party conversion and the empty shells.
    """
    if _STOCK_READ[0] is not None:
        from crypten.config.config import CrypTenConfig

        CrypTenConfig.__getattribute__ = _STOCK_READ[0]
    if _STOCK_A2B[0] is not None:
        from crypten.mpc.primitives import converters

        converters._A2B = _STOCK_A2B[0]
    if _STOCK_MPC_INIT[0] is not None:
        from crypten.mpc.mpc import MPCTensor

        MPCTensor.__init__ = _STOCK_MPC_INIT[0]


def _empty_shells() -> None:
    """Make `MPCTensor([])` an empty shell, as CrypTen meant, not a fresh sharing of nothing.

    CrypTen builds every `shallow_copy`, `clone` and `from_shares` result (a few per operation)
    as `MPCTensor([])` and then replaces its share. Its `if tensor is []` test, meant to skip
    the sharing, is never true, so each one draws a pseudo-random zero sharing of an empty
    tensor: two ChaCha20 key set-ups and a dozen torch calls, about a fifth of a small model's
    time per party. Every party skips the same draws, so the streams stay in step.
    """
    import torch
    from crypten.cryptensor import CrypTensor
    from crypten.mpc.mpc import MPCTensor
    from crypten.mpc.ptype import ptype as Ptype

    stock_init = _STOCK_MPC_INIT[0] = MPCTensor.__init__

    def __init__(
        self: Any,
        tensor: Any,
        ptype: Any = Ptype.arithmetic,
        device: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if type(tensor) is list and not tensor and not args and not kwargs:
            CrypTensor.__init__(self, requires_grad=False)
            self._tensor = torch.tensor([], device=device)
            self.ptype = ptype
            return
        stock_init(self, tensor, ptype, device, *args, **kwargs)

    MPCTensor.__init__ = __init__


def _three_party_a2b() -> None:
    """Convert three parties' arithmetic shares to binary with one adder, not two.

    CrypTen's `_A2B` binary-shares each party's share and sums them with its carry-lookahead
    adder, a tree of adders: two in a row for three parties (14 rounds of ANDs), so that every
    comparison costs 3 parties about twice what it costs 2. A carry-save step first turns the
    three summands into two in one round of ANDs, x ^ y ^ z and the majority
    (x & y) ^ (z & (x ^ y)) shifted left, and one adder sums those: 8 rounds. The values are
    the same bits; only the rounds differ. Two parties (and four or more) keep CrypTen's.
    """
    import crypten.communicator as comm
    from crypten.mpc.primitives import circuit, converters
    from crypten.mpc.primitives.binary import BinarySharedTensor

    stock_a2b = _STOCK_A2B[0] = converters._A2B

    def _a2b(arithmetic_tensor: Any) -> Any:
        if comm.get().get_world_size() != 3:
            return stock_a2b(arithmetic_tensor)
        x, y, z = (BinarySharedTensor(arithmetic_tensor.share, src=i) for i in range(3))
        xy = x ^ y
        both = BinarySharedTensor.stack([x, z]) & BinarySharedTensor.stack([y, xy])
        carry = both[0] ^ both[1]
        binary_tensor = circuit.add(xy ^ z, carry << 1)
        binary_tensor.encoder = arithmetic_tensor.encoder
        return binary_tensor

    converters._A2B = _a2b


def _cache_config_reads() -> None:
    """Serve CrypTen's config reads from a cache.

    CrypTen reads its config (an OmegaConf tree) thousands of times per training batch, about
    20 us a read through OmegaConf: a fifth of a small model's time. Every change to it either
    replaces the tree (`temp_override`, `cfg.key = ...`, `load_config`) or assigns inside a
    table, which `_Table` sees; either empties the cache.
    """
    from crypten.config.config import CrypTenConfig

    read = _STOCK_READ[0] = CrypTenConfig.__getattribute__

    def __getattribute__(self: Any, name: str) -> Any:
        if name in _NOT_CONFIG:
            return read(self, name)
        config = object.__getattribute__(self, "__dict__").get("config")
        if config is None:
            return read(self, name)
        if config is not _Reads.config:
            _Reads.config, _Reads.values = config, {}
        try:
            return _Reads.values[name]
        except KeyError:
            value = _Reads.values[name] = _cached(read(self, name))
            return value

    _NOT_CONFIG = frozenset(dir(CrypTenConfig)) | {"config"}
    CrypTenConfig.__getattribute__ = __getattribute__


def _exact_decode() -> None:
    """Decode fixed point as raw / scale exactly: a floor division and its remainder.

    CrypTen 0.4.1's `FixedPointEncoder.decode` divides a negative value by scale - 1, so a
    value less than q units in the last place above the integer -q decodes one lower: -6.99992
    revealed as -7.99992. Every reveal (outputs, metrics, tests against plaintext) goes through it.
    """
    from crypten.common.tensor_types import is_int_tensor
    from crypten.encoder import FixedPointEncoder

    def decode(self: Any, tensor: Any) -> Any:
        if tensor is None:
            return None
        assert is_int_tensor(tensor), "input must be a LongTensor"
        scale = self._scale
        if scale == 1:
            return tensor.data
        whole = tensor.div(scale, rounding_mode="floor")
        fraction = tensor - whole * scale
        return (whole.float() + fraction.float() / scale).data

    FixedPointEncoder.decode = decode


CUDA_OPS = ("matmul", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")
"""The torch functions `CUDALongTensor` computes from float64 blocks (its dispatch table)."""


def _exact_cuda_arithmetic() -> None:
    """Compute CUDA shares' matmul and convolutions with `mpcml.runtime.blocks`.

    CrypTen's `CUDALongTensor` (crypten/cuda/cuda_tensor.py) dispatches these through its
    `HANDLED_FUNCTIONS` table to a fixed 3x22- or 4x16-bit split, which is wrong for wide
    convolutions (3x3 over 256 channels) and refuses groups != 1, which conv2d's backward
    needs. mpcml's split is chosen from the real bound and takes groups. Touches no CUDA state:
    only the table changes.
    """
    import torch
    from crypten.cuda import cuda_tensor

    from mpcml.runtime import blocks

    for name in CUDA_OPS:
        cuda_tensor.HANDLED_FUNCTIONS[getattr(torch, name)] = _on_shares(getattr(blocks, name))
    # CrypTen defines __torch_function__ as a plain method, which torch deprecates (a warning
    # on every call, "an error in future"); its body never reads `self`.
    stock = cuda_tensor.CUDALongTensor.__dict__["__torch_function__"]
    if not isinstance(stock, classmethod):

        def __torch_function__(
            cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return stock(None, func, types, args, kwargs)

        cuda_tensor.CUDALongTensor.__torch_function__ = classmethod(__torch_function__)


def _on_shares(op: Any) -> Any:
    """`op` on CrypTen's `CUDALongTensor` arguments: unwrapped to int64, the result wrapped."""

    def on_shares(*args: Any, **kwargs: Any) -> Any:
        from crypten.cuda import cuda_tensor

        plain = [a.tensor() if isinstance(a, cuda_tensor.CUDALongTensor) else a for a in args]
        # Looked up at call time, like CrypTen's own functions do.
        return cuda_tensor.CUDALongTensor(op(*plain, **kwargs))

    on_shares.__name__ = on_shares.__qualname__ = f"exact_{op.__name__}"
    on_shares.__doc__ = op.__doc__
    return on_shares
