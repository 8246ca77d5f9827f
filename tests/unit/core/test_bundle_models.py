"""The model kinds a bundle serves (qveil.bundle.models): their array checks (each bad array
refused with what was expected), their Q values at unit states, and the network's
Lipschitz bounds."""

from __future__ import annotations

import numpy as np
import pytest

from qveil.bundle.models import (
    GridModel,
    KernelModel,
    MLPModel,
    grid_arrays,
    kernel_arrays,
    layers_of,
    lipschitz_bound,
    measured_lipschitz,
    mlp_forward,
)
from qveil.errors import InvalidArgument


def _mlp() -> dict[str, np.ndarray]:
    """1 -> 2 -> 2: hidden h = relu([x, -x]), Q = [h0 + h1, 2 h0 - 1]."""
    return {
        "W0": np.array([[1.0], [-1.0]]),
        "b0": np.zeros(2),
        "W1": np.array([[1.0, 1.0], [2.0, 0.0]]),
        "b1": np.array([0.0, -1.0]),
    }


def test_mlp_forward_is_relu_between_layers() -> None:
    q = mlp_forward(_mlp(), [0.0, 0.5, -0.5])
    np.testing.assert_allclose(q, [[0.0, -1.0], [0.5, 0.0], [0.5, -1.0]])


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({}, "no W0 array"),
        ({"W0": np.ones((2, 1)), "b0": np.ones(2), "c": np.ones(1)}, r"unexpected arrays \['c'\]"),
        ({"W0": np.ones((2, 1))}, "W0 has no b0"),
        ({"W0": np.ones((2, 3)), "b0": np.ones(2)}, r"layer 0 has W0 \(2, 3\), b0 \(2,\)"),
        ({"W0": np.ones((2, 1)), "b0": np.ones(3)}, "layer 0"),
        (
            {"W0": np.ones((2, 1)), "b0": np.ones(2), "W1": np.ones((1, 3)), "b1": np.ones(1)},
            r"expected \(out, 2\)",
        ),
        ({"W0": np.array([[np.nan]]), "b0": np.ones(1)}, "layer 0 has non-finite values"),
    ],
)
def test_layers_of_refuses_bad_weights(weights: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        layers_of(weights)


def test_mlp_model_clamps_to_its_q_bound() -> None:
    layers = layers_of(_mlp())
    x = np.array([3.0, -3.0])
    free = MLPModel(layers)
    assert free.n_actions == 2 and free.kind == "mlp"
    np.testing.assert_allclose(free.q_values_unit(x), [[3.0, 5.0], [3.0, -1.0]])
    np.testing.assert_allclose(
        MLPModel(layers, q_bound=2.0).q_values_unit(x), [[2.0, 2.0], [2.0, -1.0]]
    )


def test_lipschitz_bound_and_the_measured_constant() -> None:
    w = _mlp()
    # ||W0||_2 = sqrt(2); the output rows' norms sqrt(2) and 2
    assert lipschitz_bound(w) == pytest.approx(2.0 * np.sqrt(2.0))
    # on [0, 1] only h0 = x is active: Q = [x, 2x - 1], slope 2
    assert measured_lipschitz(w, grid=101) == pytest.approx(2.0)
    assert measured_lipschitz(w) <= lipschitz_bound(w)


def test_grid_model_interpolates_linearly() -> None:
    g, v = grid_arrays(
        {
            "grid": np.array([0.0, 0.5, 1.0]),
            "values": np.array([[0.0, 1.0], [1.0, 1.0], [3.0, 0.0]]),
        }
    )
    m = GridModel(g, v)
    assert m.n_actions == 2 and m.kind == "grid"
    np.testing.assert_allclose(
        m.q_values_unit(np.array([0.0, 0.25, 0.5, 0.75, 1.0])),
        [[0.0, 1.0], [0.5, 1.0], [1.0, 1.0], [2.0, 0.5], [3.0, 0.0]],
    )


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"grid": np.array([0.0, 1.0])}, "expected arrays grid, values; got"),
        ({"grid": np.array([0.1, 1.0]), "values": np.zeros((2, 1))}, "increase strictly"),
        ({"grid": np.array([0.0, 0.5, 0.5, 1.0]), "values": np.zeros((4, 1))}, "strictly"),
        ({"grid": np.array([0.0]), "values": np.zeros((1, 1))}, "strictly"),
        ({"grid": np.array([0.0, 1.0]), "values": np.zeros((3, 1))}, r"shape \(2, m\)"),
        ({"grid": np.array([0.0, 1.0]), "values": np.array([[0.0], [np.inf]])}, "finite"),
    ],
)
def test_grid_arrays_refuses_bad_arrays(weights: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        grid_arrays(weights)


def _kernel() -> dict[str, np.ndarray]:
    return {
        "inducing": np.array([0.0, 1.0]),
        "betas": np.array([2.0]),
        "alpha": np.array([[[1.0, 0.0]], [[0.0, -1.0]]]),  # (m=2, d=1, M=2)
        "centre": np.array(0.5),
    }


def test_kernel_model_is_the_additive_expansion() -> None:
    u, b, a, c = kernel_arrays(_kernel())
    m = KernelModel(u, b, a, c)
    assert (m.n_actions, m.dims, m.kind, c) == (2, 1, "additive", 0.5)
    x = np.array([[0.0], [0.25]])
    want = np.array(
        [[0.5 + np.exp(-2 * abs(s)), 0.5 - np.exp(-2 * abs(s - 1))] for s in (0.0, 0.25)]
    )
    np.testing.assert_allclose(m.q_values_unit(x), want)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": np.ones(1)}, "expected arrays"),
        ({"inducing": np.array([0.0])}, "inducing must be finite"),
        ({"betas": np.array([0.0])}, "betas must be positive"),
        ({"alpha": np.ones((2, 1, 3))}, r"alpha must be finite of shape \(m, 1, 2\)"),
        ({"centre": np.array([0.5])}, "centre must be a finite scalar"),
        ({"centre": np.array(np.nan)}, "centre must be a finite scalar"),
    ],
)
def test_kernel_arrays_refuses_bad_arrays(change: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        kernel_arrays({**_kernel(), **change})
