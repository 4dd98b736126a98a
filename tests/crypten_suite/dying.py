"""A CrypTen-style test class whose parties die or hang, for the harness's own tests."""

from __future__ import annotations

import os
import time

import crypten
import torch

from tests.crypten_suite.harness import load_module

MultiProcessTestCase = load_module("test.multiprocess_test_case").MultiProcessTestCase


class Dies(MultiProcessTestCase):  # type: ignore[misc,valid-type]
    """Run in name order: a, b, c, d."""

    def _reveal(self) -> None:
        x = crypten.cryptensor(torch.arange(4.0), src=0)
        self.assertTrue(torch.allclose(x.get_plain_text(), torch.arange(4.0)))

    def test_a_passes(self) -> None:
        self._reveal()

    def test_b_party_dies(self) -> None:
        if self.rank == 1:
            os._exit(3)
        self._reveal()

    def test_c_hangs(self) -> None:
        if self.rank == 1:
            time.sleep(3600)

    def test_d_passes_after_a_restart(self) -> None:
        self._reveal()
