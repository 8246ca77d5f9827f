"""The Lipschitz MLP (qveil.trainer.network): Lipschitz by construction whatever its raw
parameters, and the bound attained (all-positive aligned weights give Q(x) = L x)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qveil.bundle import lipschitz_bound, measured_lipschitz, mlp_forward
from qveil.trainer.network import LipschitzMLP


def test_network_is_lipschitz_by_construction_whatever_the_parameters() -> None:
    net = LipschitzMLP(
        n_actions=3, hidden=(32, 32), lipschitz=2.5, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(50.0)  # raw parameters far outside the bound
    w = net.export()
    assert lipschitz_bound(w) <= 2.5 * (1 + 1e-12)
    assert measured_lipschitz(w) <= lipschitz_bound(w) * (1 + 1e-12)
    # the bound is attained, not vacuous: all-positive aligned weights make Q(x) = L x
    with torch.no_grad():
        for wt, b in zip(net.weights, net.biases, strict=True):
            wt.fill_(7.0)
            b.zero_()
    w = net.export()
    assert measured_lipschitz(w) == pytest.approx(2.5, rel=1e-9)
    np.testing.assert_allclose(mlp_forward(w, [0.0, 0.4]), [[0.0] * 3, [1.0] * 3])
