"""The public card leaks nothing that depends on the data.

The card is split into card.json (the allow-list ``PUBLIC_CARD_KEYS``) and card_admin.json
(everything else); GetRelease serves only the public part, AdminService.GetAdminCard the
admin part (admin role). The central test trains twice on one public configuration with
different seeds (so different environment data, exploration and weights) and asserts the
public cards are identical except the random release id and the creation time: any public
field that were a function of the trained parameters (e.g. ``lipschitz.measured``, which
differs between the two runs) would make it fail. A second test perturbs the weights of one
bundle and rewrites it with the same card.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import charge, make_tokens, start_server

from qveil.bundle import (
    ADMIN_CARD_FILE,
    CARD_FILE,
    PUBLIC_CARD_KEYS,
    card_digest,
    load_bundle,
    public_card_of,
    split_card,
    write_bundle,
)
from qveil.errors import IntegrityError
from qveil.trainer.config import TrainConfig
from qveil.trainer.train import run_training

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
#: fields that may differ between two releases of one public configuration
PER_RELEASE = {"bundle_id", "created_at"}
#: fields that come from the trained weights, the run or the release's secret noise key:
#: never public
DATA_DEPENDENT = (
    "lipschitz.measured",
    "lipschitz.bound_from_weights",
    "hyperparameters.hidden",
    "key_sha256",
)


def _train(tmp: Path, name: str, seed: int, mode: str, **kw: Any) -> Path:
    cfg = dataclasses.replace(
        TrainConfig.from_toml(CONFIGS / "linewalk-quick.toml"),
        samples=300,
        resets=6,
        mode=mode,
        **kw,
    )
    return run_training(cfg, tmp / name, seed=seed, progress=False).path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """:func:`_train`'s bundle of (seed, mode, settings), trained once per module: tests read
    it, and one that serves or edits it works on a copy."""
    made: dict[tuple[Any, ...], Path] = {}

    def get(seed: int, mode: str, **kw: Any) -> Path:
        key = (seed, mode, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = _train(tmp_path_factory.mktemp("trained"), "bundle", seed, mode, **kw)
        return made[key]

    return get


def _without(card: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in card.items() if k not in keys}


def _has_path(card: dict[str, Any], dotted: str) -> bool:
    top, _, sub = dotted.partition(".")
    return top in card and (not sub or (isinstance(card[top], dict) and sub in card[top]))


@pytest.mark.parametrize(
    ("mode", "kw"), [("output", {"epsilon": 8.0, "sigma": None}), ("gdp", {"sigma": 0.5})]
)
def test_public_card_is_not_a_function_of_the_trained_parameters(
    trained: Callable[..., Path], mode: str, kw: dict[str, Any]
) -> None:
    """A wrong split (any of DATA_DEPENDENT public, or a run statistic such as the number of
    clipped rewards) makes the two public cards differ: the measured Lipschitz constants of
    the two runs differ in their third digit."""
    a = load_bundle(trained(1, mode, **kw))
    b = load_bundle(trained(2, mode, **kw))
    assert a.card["weights_sha256"] != b.card["weights_sha256"]
    assert a.card["lipschitz"]["measured"] != b.card["lipschitz"]["measured"]
    pa, pb = a.public_card(), b.public_card()
    assert _without(pa, PER_RELEASE) == _without(pb, PER_RELEASE)
    assert pa["bundle_id"] != pb["bundle_id"]
    # and what the release card must show is there
    for k in ("mode", "epsilon", "delta_total", "holds", "basis", "sigma", "beta"):
        assert k in pa, k
    for k in ("state_interval", "actions", "neighbour", "created_at"):
        assert k in pa, k
    for dotted in DATA_DEPENDENT:
        assert not _has_path(pa, dotted), dotted
        assert _has_path(a.card, dotted), dotted  # it is in the admin card
    # the files on disk are the two halves
    on_disk = json.loads((a.path / CARD_FILE).read_text())
    admin = json.loads((a.path / ADMIN_CARD_FILE).read_text())
    assert on_disk == pa
    assert admin == a.admin_card() and admin["card_sha256"] == card_digest(a.card)
    assert "weights_sha256" in admin and "network" in admin and "hyperparameters" in admin


def test_perturbed_weights_leave_the_public_card_unchanged(
    tmp_path: Path, trained: Callable[..., Path]
) -> None:
    """Rewriting a bundle with other weights under the same card: the public card must not
    move; the admin card must (its weights hash and measured constants)."""
    src = load_bundle(trained(1, "output", epsilon=8.0, sigma=None))
    rng = np.random.default_rng(0)
    w2 = {k: v * (0.5 + 0.1 * rng.random(v.shape)) for k, v in src.weights.items()}
    card = {
        k: v
        for k, v in src.card.items()
        if k not in {"card_sha256", "weights_sha256", "network", "bundle_id", "created_at"}
    }
    card["lipschitz"] = {"bound": src.card["lipschitz"]["bound"]} | {
        k: v
        for k, v in src.card["lipschitz"].items()
        if k in ("with_respect_to", "raw_state_bound")
    }
    out = write_bundle(
        tmp_path / "perturbed",
        card={**card, "network": {"hidden": src.card["network"]["hidden"]}},
        weights=w2,
        config_toml="",
        training_log_rows=[],
        learning_curve_png=b"",
    )
    b = load_bundle(out)
    assert b.card["weights_sha256"] != src.card["weights_sha256"]
    assert b.card["lipschitz"]["measured"] != src.card["lipschitz"]["measured"]
    assert _without(b.public_card(), PER_RELEASE) == _without(src.public_card(), PER_RELEASE)


def test_allow_list_and_split() -> None:
    card = {
        "epsilon": 1.0,
        "lipschitz": {"bound": 4.0, "measured": 0.3, "bound_from_weights": 2.0},
        "hyperparameters": {"hidden": [16]},
        "weights_sha256": "ab",
        "users": 10,  # an fqi public parameter: listed, so public
    }
    pub, adm = split_card(card)
    assert pub == {"epsilon": 1.0, "lipschitz": {"bound": 4.0}, "users": 10}
    assert adm == {
        "lipschitz": {"measured": 0.3, "bound_from_weights": 2.0},
        "hyperparameters": {"hidden": [16]},
        "weights_sha256": "ab",
    }
    assert public_card_of(card) == pub
    assert "card_sha256" not in PUBLIC_CARD_KEYS and "weights_sha256" not in PUBLIC_CARD_KEYS


def test_edits_to_either_file_are_refused(tmp_path: Path, trained: Callable[..., Path]) -> None:
    src = trained(1, "gdp", sigma=0.5)  # read only: each edit is made to a copy
    for name, edit in (
        (ADMIN_CARD_FILE, lambda c: c["lipschitz"].update(measured=0.0)),
        (CARD_FILE, lambda c: c.update(sigma=c["sigma"] * 2)),
    ):
        d = tmp_path / f"copy-{name}"
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        c = json.loads((d / name).read_text())
        edit(c)
        (d / name).write_text(json.dumps(c))
        with pytest.raises(IntegrityError, match="was modified"):
            load_bundle(d)
    # a non-public field moved into card.json (the merged card is unchanged): refused
    d = tmp_path / "moved"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    pub = json.loads((d / CARD_FILE).read_text())
    adm = json.loads((d / ADMIN_CARD_FILE).read_text())
    pub["weights_sha256"] = adm.pop("weights_sha256")
    (d / CARD_FILE).write_text(json.dumps(pub))
    (d / ADMIN_CARD_FILE).write_text(json.dumps(adm))
    with pytest.raises(IntegrityError, match="non-public fields"):
        load_bundle(d)


def test_server_shows_public_card_to_clients_and_admin_card_to_admins(
    tmp_path: Path, trained: Callable[..., Path]
) -> None:
    """A real `qveil serve` (of a release charged and receipted in this test's registry):
    GetRelease carries the public card only; GetAdminCard needs the admin role and returns
    card_admin.json."""
    from qveil.client.sync import AdminClient, ValueClient
    from qveil.errors import PermissionDenied

    bundle = tmp_path / "a"  # a copy of the module's release, charged in this test's registry
    shutil.copytree(trained(1, "output", epsilon=8.0, sigma=None), bundle)
    charge(bundle)
    b = load_bundle(bundle)
    tokens = make_tokens(tmp_path / "tokens.toml")
    srv = start_server(tmp_path, bundle, "--tokens-file", str(tokens.path))
    try:
        with ValueClient(srv.target, token=tokens.query) as vc:
            card = vc.release().card
        assert card == b.public_card()
        for dotted in DATA_DEPENDENT:
            assert not _has_path(card, dotted), dotted
        with AdminClient(srv.target, token=tokens.admin) as ad:
            admin = ad.admin_card()
        assert admin == b.admin_card()
        assert admin["lipschitz"]["measured"] == b.card["lipschitz"]["measured"]
        with AdminClient(srv.target, token=tokens.query) as ad, pytest.raises(PermissionDenied):
            ad.admin_card()
    finally:
        assert srv.terminate() == 0


def test_fqi_public_card_is_not_a_function_of_the_data(tmp_path: Path) -> None:
    """The fqi mode (integrator's): two datasets of the same size from different seeds give
    different released values and dataset fingerprints, and identical public cards (except
    id and time); the fingerprint stays in the admin card."""
    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.collect import collect
    from qveil.trainer.kfqi import train_kernel_fqi

    cfg = load_fqi_config(CONFIGS / "linewalk-private.toml")
    out = []
    for seed in (1, 2):
        data = collect("qveil/LineWalk-v0", 300, seed)
        out.append(load_bundle(train_kernel_fqi(cfg, data, tmp_path / f"f{seed}", force=True).path))
    a, b = out
    assert a.card["weights_sha256"] != b.card["weights_sha256"]
    assert a.card["dataset_fingerprint"] != b.card["dataset_fingerprint"]
    pa, pb = a.public_card(), b.public_card()
    assert _without(pa, PER_RELEASE) == _without(pb, PER_RELEASE)
    assert pa["mode"] == "fqi" and "users" in pa and "neighbour" in pa
    assert "dataset_fingerprint" not in pa and "dataset_fingerprint" in a.admin_card()
    assert json.loads((a.path / CARD_FILE).read_text()) == pa
