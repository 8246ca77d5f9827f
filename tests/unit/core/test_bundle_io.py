"""Release bundles: files (the noise key among them), a complete card, verification on load
(weights hash, card checksum, the key against the card's key_sha256, Lipschitz bound, privacy
recomputed by the accountant), tampering refused, a bundle without a key refused, torch-free
reads, and the ``qveil train`` / ``qveil evaluate`` entry points end to end."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_helpers import ensure_population, registry_home

from qveil.bundle import (
    ADMIN_CARD_FILE,
    CARD_KEYS,
    CLIPPING,
    FILES,
    KEY_FILE,
    PUBLIC_CARD_KEYS,
    RECEIPT_FILE,
    build_card,
    card_digest,
    load_bundle,
    merge_card,
    split_card,
    write_bundle,
)
from qveil.cli import main
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.keyed import KEY_BYTES, seeded_key
from qveil.privacy import PrivacyParams, account
from qveil.trainer.config import TrainConfig, to_toml

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small bundle made through the CLI (seeded, sigma 0.1, gdp mode): the quick
    config cut to 400 samples (8 episodes, J = 8) to keep the suite fast."""
    d = tmp_path_factory.mktemp("b")
    cfg = dataclasses.replace(
        TrainConfig.from_toml(CONFIGS / "linewalk-quick.toml"), samples=400, resets=8
    )
    (d / "c.toml").write_text(to_toml(cfg))
    out = d / "bundle"
    with registry_home(d / "qveil-home"):  # this module's registry
        rc = main(
            [
                "train",
                *ensure_population(),
                "--config",
                str(d / "c.toml"),
                "--out",
                str(out),
                "--sigma",
                "0.1",
                "--mode",
                "gdp",
                "--seed",
                "3",
                "--no-progress",
            ]
        )
    assert rc == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _rewrite_card(path: Path, edit: Any, *, reseal: bool) -> None:
    """Edit the merged card and write it back as card.json + card_admin.json."""
    card = merge_card(
        json.loads((path / "card.json").read_text()),
        json.loads((path / ADMIN_CARD_FILE).read_text()),
    )
    edit(card)
    if reseal:
        card["card_sha256"] = card_digest(card)
    public, admin = split_card(card)
    (path / "card.json").write_text(json.dumps(public))
    (path / ADMIN_CARD_FILE).write_text(json.dumps(admin))


def test_files_and_complete_card(trained: Path) -> None:
    # the bundle's files (its noise key among them), and the registry's receipt of its charge
    assert sorted(p.name for p in trained.iterdir()) == sorted([*FILES, RECEIPT_FILE])
    card = load_bundle(trained).card  # card.json (public) merged with card_admin.json
    assert set(CARD_KEYS) <= set(card)
    cfg = TrainConfig.from_toml(trained / "config.toml")
    assert card["hyperparameters"] == json.loads(json.dumps(cfg.to_dict()))
    assert card["seeded"] is True and card["env_id"] == "qveil/LineWalk-v0"
    assert card["state_interval"] == [0.0, 1.0] and card["actions"] == 2
    assert card["J"] == cfg.resets == card["training_noise"]["paths_per_action"]
    # the accountant was told the updates actually taken and the step size used
    assert card["privacy_params"]["steps"] == card["training"]["updates"] == cfg.planned_updates
    assert card["privacy_params"]["lr"] == cfg.lr and card["privacy_params"]["plain_sgd"]
    assert card["mode"] == "gdp" and card["holds"] is True and card["q_bound"] is None
    assert card["sigma"] == 0.1 and card["privacy"]["sigma"] == 0.1
    lip = card["lipschitz"]
    assert lip["measured"] <= lip["bound_from_weights"] <= lip["bound"] == cfg.lipschitz
    assert card["assumptions"]["enforced"] and card["assumptions"]["assumed"]
    assert "exceed_k" in card["training_noise"]
    assert any("exceeded k" in a for a in card["assumptions"]["assumed"])
    assert card["env_fingerprint"].startswith("sha256:")
    log = (trained / "training_log.csv").read_text().splitlines()
    assert log[0].startswith("episode,steps,return") and len(log) == 1 + 8
    assert (trained / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_verifies_and_serves_q_values(trained: Path) -> None:
    b = load_bundle(trained)
    assert b.n_actions == 2 and b.sigma == 0.1 and b.q_bound is None
    q = b.q_values([0.0, 0.25, 1.0])
    assert q.shape == (3, 2) and np.isfinite(q).all()
    for bad in ([float("nan")], [[0.1, 0.2]]):
        with pytest.raises(InvalidArgument):
            b.q_values(bad)
    assert np.array_equal(b.q_values([1.5, -0.1]), b.q_values([[1.0], [0.0]]))  # clipped
    fresh = account(PrivacyParams.from_dict(b.card["privacy_params"])).to_dict()
    assert b.card["epsilon"] == fresh["epsilon"]


def test_public_card_is_a_whitelist(trained: Path) -> None:
    pub = load_bundle(trained).public_card()
    assert set(pub) <= {k.partition(".")[0] for k in PUBLIC_CARD_KEYS}
    assert set(pub["lipschitz"]) == {"bound", "with_respect_to", "raw_state_bound"}
    assert "hyperparameters" not in pub and "network" not in pub
    assert "weights_sha256" not in pub and "training_noise" not in pub
    assert "card_sha256" not in pub and pub["epsilon"] is not None
    # the key's commitment is the admin's; how the noise is evaluated is public
    assert "key_sha256" not in pub and "key_sha256" in load_bundle(trained).admin_card()
    assert pub["noise_path"]["grid_levels"] == 32 and "AES-256" in pub["noise_path"]["prf"]


def test_seeded_training_writes_the_seeded_key_and_says_so(trained: Path) -> None:
    """Algorithm 1 with ``qveil train --seed 3``: the card says seeded, and the noise key is
    the one derived from the seed (owner-only, 32 bytes, the card's key_sha256)."""
    b = load_bundle(trained)
    key = (trained / KEY_FILE).read_bytes()
    assert b.card["seeded"] is True and b.card["mode"] == "gdp"
    assert key == seeded_key(3) == b.noise_key and len(key) == KEY_BYTES
    assert b.card["key_sha256"] == hashlib.sha256(key).hexdigest()
    assert (trained / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert "seeded" in b.card["release_noise"]["source"]


def test_tampered_card_is_refused(trained: Path, tmp_path: Path) -> None:
    def lower_eps(c: dict[str, Any]) -> None:
        c["epsilon"] = c["privacy"]["epsilon"] = 0.5

    def lower_sigma_params(c: dict[str, Any]) -> None:  # a consistent-looking lie
        c["privacy_params"]["sigma"] = c["sigma"] = c["privacy"]["sigma"] = 5.0

    def raise_lipschitz(c: dict[str, Any]) -> None:
        c["privacy_params"]["lipschitz"] = 0.01

    # 1. an edit without resealing: the checksum catches it
    p = _copy(trained, tmp_path / "a")
    _rewrite_card(p, lower_eps, reseal=False)
    with pytest.raises(IntegrityError, match="card.json or card_admin.json was modified"):
        load_bundle(p)
    # 2. resealed edits: the accountant's recomputation catches them
    for i, (edit, what) in enumerate(
        [
            (lower_eps, "epsilon"),
            (lower_sigma_params, "epsilon"),
            (raise_lipschitz, "Lipschitz bound"),
        ]
    ):
        p = _copy(trained, tmp_path / f"r{i}")
        _rewrite_card(p, edit, reseal=True)
        with pytest.raises(IntegrityError, match=what):
            load_bundle(p)
    assert load_bundle(p, verify=False).n_actions == 2  # explicit opt-out only


def test_tampered_weights_are_refused(trained: Path, tmp_path: Path) -> None:
    p = _copy(trained, tmp_path / "w")
    with np.load(p / "weights.npz") as z:
        w = {k: z[k] for k in z.files}
    w["b2"] = w["b2"] + 1.0
    np.savez(p / "weights.npz", **w)
    with pytest.raises(IntegrityError, match="weights.npz sha256"):
        load_bundle(p)


def test_a_replaced_or_missing_key_is_refused(trained: Path, tmp_path: Path) -> None:
    """A release has one key for good: another key (even a well-formed one) does not match
    the card's key_sha256; a key of the wrong length is refused; a bundle without a key was
    written before keyed noise and is refused, naming `qveil train`."""
    p = _copy(trained, tmp_path / "k")
    (p / KEY_FILE).write_bytes(seeded_key(4))
    with pytest.raises(IntegrityError, match="key_sha256"):
        load_bundle(p)
    (p / KEY_FILE).write_bytes(seeded_key(3)[:16])
    with pytest.raises(IntegrityError, match="32-byte key"):
        load_bundle(p)
    (p / KEY_FILE).unlink()
    with pytest.raises(FailedPrecondition, match="qveil train"):
        load_bundle(p)
    with pytest.raises(FailedPrecondition, match="noise.key"):
        load_bundle(p, verify=False)  # no key, nothing to answer with, verified or not


def test_missing_bundle_and_files(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        load_bundle(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="no card.json"):
        load_bundle(tmp_path / "empty")


def _small_weights(scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "W0": scale * rng.uniform(-1, 1, (4, 1)),
        "b0": rng.uniform(-1, 1, 4),
        "W1": scale * rng.uniform(-1, 1, (2, 4)) / 4,
        "b1": np.array([30.0, -30.0]),
    }


def _output_card(**kw: Any) -> dict[str, Any]:
    params = PrivacyParams(
        mode="output",
        sigma=2.0,
        delta=1e-5,
        samples=100,
        batch_size=10,
        lr=0.1,
        k=3.0,
        lipschitz=2.0,
        resets=1,
        actions=2,
        gamma=0.9,
        reward_bound=1.0,
    )
    return build_card(
        env_id="qveil/LineWalk-v0",
        interval=(-2.0, 2.0),
        actions=2,
        hyperparameters={"note": "test"},
        privacy_result=account(params),
        lipschitz=2.0,
        seeded=True,
        **kw,
    )


def test_write_bundle_for_tests_output_mode_clamps(tmp_path: Path) -> None:
    """write_bundle + build_card make small bundles quickly (the server's tests use this);
    output mode serves Q clamped to r0/(1-gamma) = 10 on the raw interval [-2, 2], states
    outside it clipped into it."""
    out = write_bundle(
        tmp_path / "o",
        card=_output_card(),
        weights=_small_weights(),
        config_toml="",
        training_log_rows=[{"episode": 1, "return": 1.0}],
        noise_key=seeded_key(7),
    )
    b = load_bundle(out)
    assert b.noise_key == seeded_key(7) and b.noise_paths.n_paths == 2  # d = 1, 2 actions
    assert b.q_bound == pytest.approx(10.0) and b.interval.lo == -2.0
    q = b.q_values([-2.0, 0.0, 2.0])
    assert q[:, 0].max() == pytest.approx(10.0) and q[:, 1].min() == pytest.approx(-10.0)
    # a state outside the interval is clipped into it (every release's rule, on its card)
    assert np.array_equal(b.q_values([2.5, -7.0]), b.q_values([2.0, -2.0]))
    assert b.public_card()["clipping"] == CLIPPING and "clipped" in CLIPPING
    assert b.card["lipschitz"]["raw_state_bound"] == pytest.approx(0.5)


def test_write_bundle_refuses_a_non_lipschitz_network_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="not 2-Lipschitz"):
        write_bundle(
            tmp_path / "x",
            card=_output_card(),
            weights=_small_weights(scale=50.0),
            config_toml="",
            training_log_rows=[],
        )
    assert list(tmp_path.iterdir()) == []


def test_write_bundle_draws_a_fresh_key_unless_given_one(tmp_path: Path) -> None:
    """No ``noise_key``: 32 bytes of OS entropy, a different key for each bundle written from
    the same card and weights (so two releases of the same model answer differently), owner-
    only and committed to by the card; a key of the wrong size is refused, nothing written."""

    def write(name: str, **kw: Any) -> Path:
        return write_bundle(
            tmp_path / name,
            card=_output_card(),
            weights=_small_weights(),
            config_toml="",
            training_log_rows=[],
            **kw,
        )

    a, b = load_bundle(write("a")), load_bundle(write("b"))
    assert len(a.noise_key) == len(b.noise_key) == KEY_BYTES and a.noise_key != b.noise_key
    assert a.card["key_sha256"] == hashlib.sha256(a.noise_key).hexdigest()
    assert a.card["key_sha256"] != b.card["key_sha256"]
    assert (a.path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert KEY_FILE in FILES and "noise_key" not in repr(a) and a.noise_key.hex() not in repr(a)
    for bad in (b"short", "x" * KEY_BYTES):
        with pytest.raises(InvalidArgument, match="32 bytes"):
            write("bad", noise_key=bad)
        assert not (tmp_path / "bad").exists()


def test_bundle_module_is_torch_free(trained: Path) -> None:
    code = (
        "import sys; from qveil.bundle import load_bundle; "
        f"b = load_bundle({str(trained)!r}); b.q_values([0.5]); "
        "assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules; print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ok", r.stderr


def test_evaluate_cli_prints_the_table(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "eval.png"
    assert (
        main(["evaluate", str(trained), "--episodes", "5", "--seed", "1", "--plot", str(png)]) == 0
    )
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    for row in ("released (Q + g, the release's key", "bare network", "random", "towards 0.5"):
        assert row in out


def test_a_bundle_of_an_earlier_version_without_a_key_is_refused(tmp_path: Path) -> None:
    """A grid-model bundle that an earlier version wrote (tests/data/grid-bundle-v1: K = 11,
    beta 3, 300 users) holds no noise key: it cannot be loaded, so it cannot be served; the
    refusal names the way out (`qveil train` a new release), with or without verification."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "data" / "grid-bundle-v1"
    g = shutil.copytree(src, tmp_path / "g")
    assert not (g / KEY_FILE).exists()
    for verify in (True, False):
        with pytest.raises(FailedPrecondition, match="`qveil train`") as exc:
            load_bundle(g, verify=verify)
        assert KEY_FILE in str(exc.value)
