"""CrypTen tests that fail over mpcml on purpose or for CrypTen's own reasons, each with why.

A listed test must fail, and its failure must mention `match`: the conformance tier fails when a
listed test starts passing (take it off) or fails for another reason (a new defect).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.crypten_suite.harness import Suite

_PICKLE = (
    "deliberate: mpcml's data plane sends tensors and plain values only and refuses an "
    "arbitrary object (here an nn.Linear), because nothing received from the network is "
    "unpickled; CrypTen on gloo pickles it"
)
_TORCH_LOAD = (
    "CrypTen's own incompatibility with torch >= 2.6: it calls torch.load without "
    "weights_only, whose default is now True, on files holding objects torch refuses to load"
)


@dataclass(frozen=True)
class Difference:
    module: str
    test: str
    match: str
    """A string the failure's report must contain."""
    reason: str
    providers: tuple[str, ...] = ("TFP", "dealer")
    """The providers on which it fails."""
    world_sizes: tuple[int, ...] = (2, 3)
    """The party counts at which it fails."""


DIFFERENCES = [
    Difference("test.test_communicator", "test_send_recv_obj", "cannot be sent", _PICKLE),
    Difference("test.test_communicator", "test_broadcast_obj", "cannot be sent", _PICKLE),
    Difference("test.test_crypten", "test_save_load", "weights_only", _TORCH_LOAD),
    Difference(
        "test.test_crypten",
        "test_plaintext_save_load_module_from_party",
        "weights_only",
        _TORCH_LOAD,
    ),
    Difference("test.test_nn", "test_state_dict", "weights_only", _TORCH_LOAD),
    Difference("test.test_mpc", "test_tuple_cache", "weights_only", _TORCH_LOAD, ("TFP",), (2,)),
    Difference(
        "test.test_mpc",
        "test_tuple_cache",
        "keeps no tuple cache",
        "deliberate: the dealer provider has no tuple cache to trace, fill, save or load (it "
        "sends each tuple's correction ahead of its use) and refuses those calls by name",
        ("dealer",),
        (2,),  # CrypTen's test returns early above 2 parties
    ),
    Difference(
        "test.test_nn",
        "test_tutorial_modules",
        "does not support ONNX op Identity",
        "CrypTen's own incompatibility with torch 2.13: crypten.nn.from_pytorch goes through "
        "torch's ONNX export, which now emits Identity nodes CrypTen's converter lacks (mpcml "
        "imports models through mpcml.graph, not from_pytorch)",
    ),
    Difference(
        "test.test_nn",
        "test_global_avg_pool_module",
        "GlobalAveragePool failed",
        "CrypTen's own at 3 parties: it fails the same way on CrypTen's gloo harness with "
        "world_size 3 (CrypTen runs test_nn at 2 parties only)",
        world_sizes=(3,),
    ),
]


def expected(suite: Suite, test: str) -> Difference | None:
    """The listed difference for `test` of `suite`, if any."""
    for difference in DIFFERENCES:
        if (
            difference.module == suite.module
            and difference.test == test
            and suite.provider in difference.providers
            and suite.world_size in difference.world_sizes
        ):
            return difference
    return None
