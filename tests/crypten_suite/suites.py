"""Which of CrypTen's test classes run, at how many parties, on which provider; which tests CI runs.

Classes that fix TFP (CrypTen's `TestTFP`) run on TFP as CrypTen runs them, and some also on the
dealer; the classes that fix no provider run on the dealer. Each module runs at 2 and 3 parties,
except `test_communicator`, whose tests are written for two parties (`1 - rank` as the peer, a
gather compared with `[0, 1]`, and a byte count CrypTen's own communicator only meets at two).
`make test` runs the tests not in `SLOW` of one suite per module but test_gradients and
test_arithmetic (the others have `ci=False`: each suite adds 10-45 s of start-up to CI, and the
suite went over 20 minutes once the model zoo's tests came in, and again at 20:50 in CI;
test_autograd's suite runs CrypTen's gradients in CI, test_mpc's the arithmetic ops);
`make test-crypten` runs every test of every suite, but the slow ones of a suite that is not
`heavy`: at 3 parties on 2 cores those of
test_mpc, test_arithmetic and test_gradients take 60-170 s each (test_mpc.Test3PC: 16 of its 78
tests in 18 min on the dealer, 24 in 30 min on TFP beside another run, all passed;
test_arithmetic at 3 parties on TFP: 34 of 34 passed in 952 s).
"""

from __future__ import annotations

from tests.crypten_suite.harness import Suite

SUITES = [
    Suite("test.test_mpc", "TestTFP", 2, "TFP", ci=False),
    Suite("test.test_mpc", "TestTFP", 2, "dealer"),
    Suite("test.test_mpc", "Test3PC", 3, "dealer", heavy=False, ci=False),
    Suite("test.test_communicator", "TestCommunicatorMultiProcess", 2, "dealer"),
    Suite("test.test_binary", "TestBinary", 2, "dealer", ci=False),
    Suite("test.test_binary", "TestBinary", 3, "TFP"),
    Suite("test.test_arithmetic", "TestArithmetic", 2, "dealer", ci=False),
    Suite("test.test_arithmetic", "TestArithmetic", 3, "TFP", heavy=False, ci=False),
    Suite("test.test_autograd", "TestTFP", 2, "TFP", ci=False),
    Suite("test.test_autograd", "TestTFP", 3, "dealer"),
    Suite("test.test_nn", "TestTFP", 2, "TFP"),
    Suite("test.test_nn", "TestTFP", 3, "dealer", ci=False),
    Suite("test.test_gradients", "TestTFP", 2, "TFP", ci=False),
    Suite("test.test_gradients", "TestTFP", 3, "dealer", heavy=False, ci=False),
    Suite("test.test_crypten", "TestCrypten", 2, "dealer"),
    Suite("test.test_crypten", "TestCrypten", 3, "TFP", ci=False),
    Suite("test.test_optim", "TestTFP", 2, "TFP", ci=False),
    Suite("test.test_optim", "TestTFP", 3, "dealer", ci=False),
    Suite("test.test_distributions", "TestTFP", 2, "TFP", ci=False),
    Suite("test.test_distributions", "TestTFP", 3, "dealer", ci=False),
]

_CONV = [
    f"test_conv{kind}_{shape}_{channels}"
    for kind, shapes in (
        ("1d", ("larger_signal", "smaller_signal")),
        ("2d", ("rectangular_image", "square_image")),
    )
    for shape in shapes
    for channels in ("one_channel", "many_channels")
]
_REDUCTIONS = ("pairwise", "log_reduction", "double_log_reduction", "accelerated_cascade")

SLOW: dict[str, frozenset[str]] = {
    # Tests that took over 2 s on some suite (`python -m tests.crypten_suite.harness MODULE
    # CLASS PARTIES PROVIDER` prints each test's seconds): convolutions, max/argmax, division
    # and the loops over many sizes. Measured on 2 cores: test_mpc.TestTFP at 2 parties on the
    # dealer, 27 such tests 686 s, the other 51 together 12 s.
    "test.test_mpc": frozenset(
        [
            *_CONV,
            *(
                f"test_conv_transpose2d_{s}"
                for s in (
                    "square_image_one_channel",
                    "square_image_many_channels",
                    "rectangular_image_one_channel",
                    "rectangular_image_many_channels",
                )
            ),
            *(f"test_max_min_{r}" for r in _REDUCTIONS),
            *(f"test_argmax_argmin_{r}" for r in _REDUCTIONS),
            "test_adaptive_pooling",
            "test_broadcast_arithmetic_ops",
            "test_max_pooling",
            "test_norm",
            "test_dropout",
            "test_hardtanh",
            "test_softmax",
        ]
    ),
    "test.test_arithmetic": frozenset(_CONV),
    "test.test_gradients": frozenset(
        [
            *_CONV,
            *(f"test_max_min_reductions_{r}" for r in _REDUCTIONS),
            "test_arithmetic",
            "test_avg_pool2d",
            "test_cat_stack",
            "test_cosine_similarity",
            "test_cross_entropy",
            "test_div",
            "test_hardtanh",
            "test_log_softmax",
            "test_magic_pow",
            "test_matmul",
            "test_max_pool2d",
            "test_norm",
            "test_pad",
            "test_pow",
            "test_rappor_loss",
            "test_rtruediv",
            "test_softmax",
            "test_truediv",
            "test_unary_functions",
            "test_var",
        ]
    ),
    "test.test_nn": frozenset(
        [
            "test_batchnorm_module",
            "test_custom_module_training",
            "test_losses",
            "test_non_pytorch_modules",
            "test_pytorch_modules",
            "test_training",
        ]
    ),
    "test.test_crypten": frozenset(["test_rand"]),
    "test.test_distributions": frozenset(["test_bernoulli"]),
    "test.test_binary": frozenset(["test_bitwise_broadcasting"]),
    "test.test_autograd": frozenset(["test_non_differentiable_marking"]),
}


def tier(suite: Suite, name: str) -> str | None:
    """ "ci" where `make test` (and so CI) runs this test of this suite, "full" where only
    `make test-crypten` does, None where neither does (a slow test of a suite not `heavy`)."""
    if name not in SLOW.get(suite.module, frozenset()):
        return "ci" if suite.ci else "full"
    return "full" if suite.heavy else None
