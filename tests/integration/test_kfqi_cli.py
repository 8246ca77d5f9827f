"""The d-coordinate fqi release (kernel estimator) through the CLI, as real
subprocesses: collect CartPole-v1 users, train with configs/cartpole-private.toml, load and
verify the additive bundle, inspect it; tampering (betas, lam, the model's betas) is
refused on load; a 1-D server path (``Bundle.interval``/``beta``) refuses it loudly rather
than serving 1-D noise. The variations of a command (refusals, repeats, the data each test
collects) run its same entry point in this process (cli_helpers.qveil_main)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main
from config_helpers import CARTPOLE_BETAS, CARTPOLE_CONFIG, mountaincar_config
from server_helpers import ensure_population, fresh_bundle

from qveil.bundle import (
    ADMIN_CARD_FILE,
    CARD_FILE,
    WEIGHTS_FILE,
    card_digest,
    load_bundle,
    merge_card,
    split_card,
)
from qveil.dataset import load_dataset
from qveil.errors import IntegrityError, InvalidArgument
from qveil.kfqi_config import load_fqi_config, plan_kernel
from qveil.trainer.served_eval import nonprivate_policy

QVEIL = str(Path(sys.executable).with_name("qveil"))
CONFIG, BETAS = CARTPOLE_CONFIG, CARTPOLE_BETAS


def qveil(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QVEIL, *argv], capture_output=True, text=True, timeout=300)


def _read(copy: Path) -> dict:  # type: ignore[type-arg]
    return merge_card(
        json.loads((copy / CARD_FILE).read_text()),
        json.loads((copy / ADMIN_CARD_FILE).read_text()),
    )


def _write(copy: Path, card: dict) -> None:  # type: ignore[type-arg]
    card["card_sha256"] = card_digest(card)
    public, admin = split_card(card)
    (copy / CARD_FILE).write_text(json.dumps(public))
    (copy / ADMIN_CARD_FILE).write_text(json.dumps(admin))


@pytest.fixture(scope="module")
def bundle(cartpole_release: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    template, out = cartpole_release
    assert "estimator=kernel d=4" in out and "holds=True" in out, out
    return fresh_bundle(template, tmp_path_factory.mktemp("kb") / "bundle")


def test_card_is_recomputed_and_says_states_are_clipped(bundle: Path) -> None:
    b = load_bundle(bundle)
    c = b.card
    assert c["dims"] == 4 and c["betas"] == BETAS and c["state_interval"] is None
    assert "clipped" in c["clipping"] and "clipped" in c["basis"]
    assert c["kappa"] == pytest.approx(1 / (4 * 0.2))
    assert c["hyperparameters"]["default_value"] == 0.0
    assert c["model"]["kind"] == "additive" and c["privacy_params"]["estimator"] == "kernel"
    pub = b.public_card()
    assert "state_intervals" in pub and "dataset_fingerprint" not in pub
    assert "training" not in pub
    assert pub["estimator"]["lam"] == 0.2 and pub["estimator"]["anchor_points"] == 6
    # the model: (n, d) raw states, out-of-box coordinates clipped (public post-processing)
    q = b.q_values([[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    qc = b.q_values([[0.0, 0.0, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(q, qc)
    assert q.shape == (2, 2) and np.isfinite(q).all()


def test_one_dimensional_paths_refuse_a_d_coordinate_release(bundle: Path) -> None:
    b = load_bundle(bundle)
    with pytest.raises(InvalidArgument, match="no 1-D interval"):
        _ = b.interval
    with pytest.raises(InvalidArgument, match="betas"):
        _ = b.beta
    with pytest.raises(InvalidArgument):
        b.q_values_unit([0.5, 0.5])  # a 1-D batch of two states is not (n, 4)


def test_inspect_sweeps_each_coordinate(bundle: Path) -> None:
    r = qveil("inspect", "--bundle", str(bundle), "--grid", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["states"]) == 12 and len(out["states"][0]) == 4
    assert np.asarray(out["mean"]).shape == (12, 2)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda c: c["privacy_params"].__setitem__("lam", 0.5), "privacy"),
        (lambda c: c.__setitem__("betas", [3.0] * 4), "betas"),
        (lambda c: c["model"].__setitem__("lam", 0.5), "model"),
    ],
)
def test_tampered_kernel_card_is_refused(bundle: Path, tmp_path: Path, edit, needle) -> None:  # type: ignore[no-untyped-def]
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    card = _read(copy)
    edit(card)
    _write(copy, card)
    with pytest.raises(IntegrityError, match=needle):
        load_bundle(copy)


def test_model_betas_must_be_the_noise_betas(bundle: Path, tmp_path: Path) -> None:
    """A model whose RKHS is not the noise's (betas differ) is refused even with a
    consistent weights hash."""
    from qveil.bundle.layout import sha256_file

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    with np.load(copy / WEIGHTS_FILE) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["betas"] = arrays["betas"] * 2
    with (copy / WEIGHTS_FILE).open("wb") as fh:
        np.savez(fh, **arrays)
    card = _read(copy)
    card["weights_sha256"] = sha256_file(copy / WEIGHTS_FILE)
    _write(copy, card)
    with pytest.raises(IntegrityError, match="noise"):
        load_bundle(copy)


def test_wrong_number_of_intervals_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        Path(CONFIG).read_text().replace("state_intervals = [[-0.3, 0.3], ", "state_intervals = [")
    )
    r = qveil_main(
        "dataset",
        "collect",
        "--env",
        "CartPole-v1",
        "--users",
        "5",
        "--seed",
        "2",
        "--reward-range",
        "0,1",
        "--out",
        str(tmp_path / "cp.npz"),
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    r = qveil_main(
        "train",
        *ensure_population(),
        "--mode",
        "fqi",
        "--dataset",
        str(tmp_path / "cp.npz"),
        "--config",
        str(cfg),
        "--epsilon",
        "1",
        "--out",
        str(tmp_path / "b"),
        "--force",
    )
    assert r.returncode == 2 and "has 4 state coordinates" in r.stderr, r.stderr
    assert "gives state_intervals for 3" in r.stderr and "c.toml" in r.stderr, r.stderr
    assert not (tmp_path / "b").exists()


def test_privacy_plan_of_a_kernel_config_before_any_data() -> None:
    """`qveil privacy --mode fqi --config <kernel config>` prints the same sigma the
    trainer would use (public quantities only), and refuses one --beta for its 4 coordinates."""
    from qveil.kfqi_config import load_fqi_config, plan_kernel

    plan = ("privacy", "--mode", "fqi", "--config", CONFIG, "--actions", "2", "--epsilon", "1")
    r = qveil(*plan, "--users", "100000")
    assert r.returncode == 0, r.stderr
    want = plan_kernel(
        load_fqi_config(CONFIG), users=100_000, actions=2, dims=4, reward_range=(0.0, 1.0)
    )
    assert f"{want.sigma:.6g}" in r.stdout and "kernel, d = 4" in r.stdout
    r = qveil_main(*plan, "--users", "100", "--beta", "3")
    assert r.returncode == 2 and "1 betas for 4 coordinates" in r.stderr, r.stderr


def test_a_three_action_config_plans_the_sigma_its_release_gets(tmp_path: Path) -> None:
    """The number of actions enters Delta (sqrt(m)): `qveil privacy --mode fqi --config C`
    takes it from the config's env (MountainCar-v0: 3), or its `actions` key, and prints the
    sigma `qveil train` then writes on the card; a config whose `actions` is not the data's
    is refused before the fit, and one that names neither actions nor env_id is refused by
    the plan. The config's default_value is the pessimistic end of its Q range [-100, 0]."""
    data = tmp_path / "mc.npz"
    r = qveil_main("dataset", "collect", "--env", "MountainCar-v0", "--users", "20", "--seed",
                   "1", "--reward-range=-1,0", "--out", str(data), "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = ("privacy", "--mode", "fqi", "--users", "20", "--epsilon", "1", "--delta", "1e-5")
    env_cfg = mountaincar_config(tmp_path)
    r = qveil_main(*plan, "--config", str(env_cfg), "--json")
    assert r.returncode == 0, r.stderr
    sigma = json.loads(r.stdout)["sigma"]
    out = tmp_path / "rel" / "bundle"
    r = qveil("train", "--mode", "fqi", "--dataset", str(data), "--config", str(env_cfg),
              "--epsilon", "1", "--delta", "1e-5", "--out", str(out), "--force",
              *ensure_population())  # fmt: skip
    assert r.returncode == 0, r.stderr
    card = load_bundle(out).card
    assert card["sigma"] == sigma and card["privacy_params"]["actions"] == 3
    assert card["hyperparameters"]["default_value"] == -100.0
    keyed = mountaincar_config(tmp_path, "keyed", env_id="", actions="3")  # no env: the key says 3
    r = qveil_main(*plan, "--config", str(keyed), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["sigma"] == sigma, r.stderr
    two = mountaincar_config(tmp_path, "two", actions="2")
    r = qveil_main("train", "--mode", "fqi", "--dataset", str(data), "--config", str(two),
                   "--epsilon", "1", "--out", str(tmp_path / "b2"), "--force",
                   *ensure_population())  # fmt: skip
    assert r.returncode == 2 and "actions = 2" in r.stderr and "3 actions" in r.stderr, r.stderr
    assert not (tmp_path / "b2").exists()
    bare = mountaincar_config(tmp_path, "bare", env_id="")
    r = qveil_main(*plan, "--config", str(bare))
    assert r.returncode == 2 and "neither actions nor an env_id" in r.stderr, r.stderr
    unknown = mountaincar_config(tmp_path, "unknown", env_id='"Nope-v9"')
    r = qveil_main(*plan, "--config", str(unknown))
    assert r.returncode == 2 and "Nope-v9" in r.stderr and "set actions = M" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_kernel_reward_relation_needs_the_population_averages_declaration(
    tmp_path: Path,
) -> None:
    """The kernel estimator guards the reward relation the same way, in
    train_kernel_fqi and fit_kernel (what experiments call): refused on per-user rows before
    anything is written, accepted on a dataset that declares population averages."""
    import dataclasses

    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.collect import collect
    from qveil.trainer.kfqi import fit_kernel, train_kernel_fqi

    cfg = load_fqi_config(Path(CONFIG)).replace(neighbour="reward")
    data = collect("CartPole-v1", 6, 2, reward_range=(0.0, 1.0))
    out = tmp_path / "b"
    for call in (
        lambda: train_kernel_fqi(cfg, data, out, force=True),
        lambda: fit_kernel(cfg, data),
    ):
        with pytest.raises(InvalidArgument, match="does not declare rewards_are_population"):
            call()
    assert not out.exists()
    declared = dataclasses.replace(data, rewards_are_population_averages=True)
    assert fit_kernel(cfg, declared).cfg.neighbour == "reward"


def test_a_public_prior_built_by_the_cli_and_trained_with(tmp_path: Path) -> None:
    """``qveil train --write-prior`` fits the config on a public dataset (no noise, no
    population) and writes the prior; a config whose ``prior`` key names it (relative to the
    config file) trains a release whose card (public part included) records the prior's
    sha256 and origin and whose basis says the uncovered votes come from it, at the sigma
    of the same config without it; evaluate's non-private reference, which refits from the
    card, refuses it. A prior of another config, and release flags with --write-prior, are
    refused (exit 2, nothing written)."""
    public, private = tmp_path / "public.npz", tmp_path / "private.npz"
    for seed, path in ((7, public), (1, private)):
        r = qveil_main("dataset", "collect", "--env", "MountainCar-v0", "--users", "10",
                       "--seed", str(seed), "--reward-range=-1,0", "--out", str(path),
                       "--no-progress")  # fmt: skip
        assert r.returncode == 0, r.stderr
    cfg = mountaincar_config(tmp_path)
    (tmp_path / "priors").mkdir()
    prior = tmp_path / "priors" / "mc.npz"
    r = qveil("train", "--mode", "fqi", "--config", str(cfg), "--dataset", str(public),
              "--write-prior", str(prior))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "25 anchors x 3 actions" in r.stdout, r.stdout
    sha = r.stdout.split("sha256 ")[-1].strip()
    assert len(sha) == 64 and prior.is_file()
    (tmp_path / "cfg").mkdir()
    with_prior = mountaincar_config(tmp_path / "cfg", prior='"../priors/mc.npz"')
    out = tmp_path / "rel" / "bundle"
    train = ("train", "--mode", "fqi", "--dataset", str(private), "--epsilon", "1",
             "--delta", "1e-5", "--force", *ensure_population())  # fmt: skip
    r = qveil(*train, "--config", str(with_prior), "--out", str(out))
    assert r.returncode == 0, r.stderr
    b = load_bundle(out)
    rec = b.card["hyperparameters"]["prior"]
    assert rec["sha256"] == sha and rec["anchors"] == 25 and rec["actions"] == 3
    assert "public.npz" in rec["origin"] and "10 users of MountainCar-v0" in rec["origin"]
    pub = b.public_card()
    assert pub["estimator"]["prior"]["sha256"] == sha and sha in pub["basis"]
    assert "public prior" in b.card["basis"] and b.card["privacy_params"]["prior_sha256"] == sha
    # evaluate's non-private reference refits from the card, which holds the prior's hash only
    with pytest.raises(InvalidArgument, match="public prior"):
        nonprivate_policy(pub, load_dataset(private))
    plain = plan_kernel(load_fqi_config(cfg).replace(epsilon=1.0, delta=1e-5), users=10,
                        actions=3, dims=2, reward_range=(-1.0, 0.0))  # fmt: skip
    assert plain.sigma == b.card["sigma"]
    # the plan before any data names the prior as the card does
    r = qveil_main("privacy", "--mode", "fqi", "--config", str(with_prior), "--users", "10",
                   "--epsilon", "1", "--delta", "1e-5", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    assert planned["sigma"] == b.card["sigma"] and planned["basis"] == b.card["basis"]
    # a prior of another anchor layout; release flags with --write-prior; no output at all
    other = mountaincar_config(tmp_path / "cfg", "other", prior='"../priors/mc.npz"',
                               anchor_points="4")  # fmt: skip
    r = qveil_main(*train, "--config", str(other), "--out", str(tmp_path / "b2"))
    assert r.returncode == 2 and "25 anchors" in r.stderr, r.stderr
    assert not (tmp_path / "b2").exists()
    r = qveil_main("train", "--mode", "fqi", "--config", str(cfg), "--dataset", str(public),
                   "--write-prior", str(tmp_path / "p2.npz"), "--epsilon", "1")  # fmt: skip
    assert r.returncode == 2 and "--epsilon has no use with --write-prior" in r.stderr
    assert not (tmp_path / "p2.npz").exists()
    r = qveil_main("train", "--mode", "fqi", "--config", str(cfg), "--dataset", str(public))
    assert r.returncode == 2 and "--write-prior" in r.stderr, r.stderr


def test_public_visitation_anchors_written_by_the_cli_and_trained_with(tmp_path: Path) -> None:
    """``qveil train --write-anchors`` places the config's anchor_count anchors where a
    public dataset's states go (owner-only file, the same bits when written again); a config
    with ``anchors = "file"`` and ``anchor_file`` (relative to the config file) trains a
    release on two different private datasets with those same anchors: the card (public
    part included) records the points, their sha256 and origin, sigma is the grid config's
    (the accountant does not depend on the anchors), and evaluate's non-private reference
    refits from the card's points (and refuses points that are not the hash's). Anchors of
    another box, a missing file and release flags with --write-anchors are refused (exit 2,
    nothing written)."""
    public, private, other = (tmp_path / f"{n}.npz" for n in ("public", "private", "other"))
    for seed, path in ((7, public), (1, private), (2, other)):
        r = qveil_main("dataset", "collect", "--env", "MountainCar-v0", "--users", "10",
                       "--seed", str(seed), "--reward-range=-1,0", "--out", str(path),
                       "--no-progress")  # fmt: skip
        assert r.returncode == 0, r.stderr
    (tmp_path / "cfg").mkdir()
    (tmp_path / "anchors").mkdir()
    layout = {"anchors": '"file"', "anchor_file": '"../anchors/mc.npz"', "anchor_count": "12",
              "neighbours": "4"}  # fmt: skip
    cfg = mountaincar_config(tmp_path / "cfg", **layout)
    written = []
    for run, name in ((qveil, "mc.npz"), (qveil_main, "again.npz")):
        r = run("train", "--mode", "fqi", "--config", str(cfg), "--dataset", str(public),
                "--write-anchors", str(tmp_path / "anchors" / name))  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "12 points in 2 coordinates" in r.stdout, r.stdout
        written.append(r.stdout.split("sha256 ")[-1].strip())
    sha = written[0]
    assert len(sha) == 64 and written[1] == sha  # the same bits every build
    assert (tmp_path / "anchors" / "mc.npz").stat().st_mode & 0o777 == 0o600
    train = ("train", "--mode", "fqi", "--epsilon", "1", "--delta", "1e-5", "--force",
             *ensure_population())  # fmt: skip
    cards = []
    for i, (run, data) in enumerate(((qveil, private), (qveil_main, other))):
        out = tmp_path / "rel" / f"b{i}"
        r = run(*train, "--dataset", str(data), "--config", str(cfg), "--out", str(out))
        assert r.returncode == 0, r.stderr
        cards.append(load_bundle(out))
    for b in cards:
        rec = b.card["hyperparameters"]["anchor_file"]
        assert rec["sha256"] == sha and rec["anchors"] == 12
        assert "public.npz" in rec["origin"] and "10 users of MountainCar-v0" in rec["origin"]
        assert b.card["hyperparameters"]["anchors"] == "file"
        assert b.public_card()["estimator"]["anchor_file"]["sha256"] == sha
    plain = load_fqi_config(mountaincar_config(tmp_path)).replace(epsilon=1.0, delta=1e-5)
    grid = plan_kernel(plain, users=10, actions=3, dims=2, reward_range=(-1.0, 0.0))
    assert cards[0].card["sigma"] == cards[1].card["sigma"] == grid.sigma
    # evaluate's non-private reference refits from the public card, which holds the points
    pub = cards[0].public_card()
    assert len(pub["estimator"]["anchor_file"]["points"]) == 12
    act = nonprivate_policy(pub, load_dataset(private))
    assert act(np.array([[-0.5, 0.0], [0.1, 0.01]])).shape == (2,)
    pub["estimator"]["anchor_file"]["points"][0][0] += 0.01  # not the points the hash names
    with pytest.raises(InvalidArgument, match="do not match"):
        nonprivate_policy(pub, load_dataset(private))
    # anchors of another box; a missing file; release flags with --write-anchors
    moved = mountaincar_config(tmp_path / "cfg", "moved", **layout,
                               state_intervals="[[-1.2, 0.5], [-0.07, 0.07]]")  # fmt: skip
    r = qveil_main(*train, "--dataset", str(private), "--config", str(moved), "--out",
                   str(tmp_path / "b2"))  # fmt: skip
    assert r.returncode == 2 and "state intervals" in r.stderr, r.stderr
    gone = mountaincar_config(tmp_path / "cfg", "gone", **{**layout, "anchor_file": '"no.npz"'})
    r = qveil_main(*train, "--dataset", str(private), "--config", str(gone), "--out",
                   str(tmp_path / "b3"))  # fmt: skip
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    r = qveil_main("train", "--mode", "fqi", "--config", str(cfg), "--dataset", str(public),
                   "--write-anchors", str(tmp_path / "a2.npz"), "--epsilon", "1")  # fmt: skip
    assert r.returncode == 2 and "--epsilon has no use with --write-anchors" in r.stderr
    assert not any((tmp_path / p).exists() for p in ("b2", "b3", "a2.npz"))
    assert "Traceback" not in r.stderr
