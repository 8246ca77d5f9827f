"""A loaded bundle's verification (qveil.bundle.verify), called on cards and weights directly:
the checksums, the model against the card, and every privacy number recomputed by the
accountant; each mismatch refused as IntegrityError naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import write_output_bundle

from qveil.bundle import card_digest, load_bundle
from qveil.bundle.layout import WEIGHTS_FILE, sha256_file
from qveil.bundle.verify import check_digests, check_model, verify_privacy
from qveil.errors import IntegrityError
from qveil.privacy import E3_SETTINGS


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "W0": rng.uniform(-1, 1, (4, 1)),
        "b0": rng.uniform(-1, 1, 4),
        "W1": rng.uniform(-1, 1, (2, 4)) / 4,
        "b1": np.zeros(2),
    }


@pytest.fixture(scope="module")
def output_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(bundle, merged card) of a small output-mode network release (sigma 2, L = 2)."""
    path = write_output_bundle(
        tmp_path_factory.mktemp("verify") / "b",
        _weights(),
        actions=2,
        lipschitz=2.0,
        sigma=2.0,
        settings=E3_SETTINGS,
        env_id="LineWalk-v0",
        interval=(0.0, 1.0),
        hyperparameters={},
        config_toml="",
        learning_curve_png=b"",
    )
    return path, dict(load_bundle(path).card)


def test_check_digests(output_bundle: tuple[Path, dict[str, Any]]) -> None:
    path, card = output_bundle
    digest = sha256_file(path / WEIGHTS_FILE)
    check_digests(card, digest, where="b")
    with pytest.raises(IntegrityError, match=r"^b: weights.npz sha256 0+ does not match"):
        check_digests(card, "0" * 64, where="b")
    edited = {**card, "epsilon": 0.01}
    with pytest.raises(IntegrityError, match=r"^b: card.json or card_admin.json was modified"):
        check_digests(edited, digest, where="b")
    check_digests({**edited, "card_sha256": card_digest(edited)}, digest, where="b")


def test_check_model_holds_a_network_to_the_card_lipschitz_bound(
    output_bundle: tuple[Path, dict[str, Any]],
) -> None:
    _, card = output_bundle
    check_model(card, _weights(), where="b")
    steep = {**_weights(), "W0": 100.0 * _weights()["W0"]}
    with pytest.raises(IntegrityError, match=r"network Lipschitz bound .* exceeds the L=2 "):
        check_model(card, steep, where="b")


def test_verify_privacy_returns_the_recomputed_numbers(
    output_bundle: tuple[Path, dict[str, Any]],
) -> None:
    _, card = output_bundle
    fresh = verify_privacy(card)
    assert fresh["epsilon"] == card["epsilon"] and fresh["mode"] == "output"


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("epsilon",), 0.5, "epsilon (card 0.5"),
        (("privacy", "epsilon"), 0.5, "privacy.epsilon"),
        (("privacy_params", "sigma"), 5.0, "privacy.sigma"),
        (("J",), 99, "J (card 99"),
        (("q_bound",), 1.0, "q_bound (card 1.0"),
    ],
)
def test_verify_privacy_names_each_mismatch(
    output_bundle: tuple[Path, dict[str, Any]], path: tuple[str, ...], value: object, named: str
) -> None:
    card = copy.deepcopy(output_bundle[1])
    target = card
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(IntegrityError, match="does not match the accountant's") as exc:
        verify_privacy(card)
    assert named in str(exc.value)


def test_verify_privacy_refuses_unaccountable_params(
    output_bundle: tuple[Path, dict[str, Any]],
) -> None:
    card = copy.deepcopy(output_bundle[1])
    with pytest.raises(IntegrityError, match="privacy_params is not an object"):
        verify_privacy({**card, "privacy_params": [1]})
    card["privacy_params"]["delta"] = 7.0
    with pytest.raises(IntegrityError, match="privacy_params cannot be accounted"):
        verify_privacy(card)


def test_kernel_release_betas_and_fqi_numbers(cartpole_release: tuple[Path, str]) -> None:
    """A kernel fqi card (the session's CartPole release): its model's betas must be the
    noise's, and the fqi accountant's numbers and the map's parameters must match."""
    bundle = load_bundle(cartpole_release[0])
    card = json.loads(json.dumps(bundle.card))
    with np.load(bundle.path / WEIGHTS_FILE) as z:
        weights = {k: z[k] for k in z.files}
    check_model(card, weights, where="b")
    other = {**weights, "betas": weights["betas"] * 2}
    with pytest.raises(IntegrityError, match="betas .* are not the noise's"):
        check_model(card, other, where="b")
    for key, value, named in (
        ("users", card["users"] + 1, "users (card"),
        ("dims", 3, "dims (card 3"),
        ("state_intervals", [[0.0, 1.0]], "state_intervals"),
        ("model", {**card["model"], "lam": 123.0}, "model (inducing_points"),
    ):
        with pytest.raises(IntegrityError, match="does not match") as exc:
            verify_privacy({**card, key: value})
        assert named in str(exc.value)
    assert verify_privacy(card)["epsilon"] == card["epsilon"]
