"""The fqi mode end to end through the CLI: collect a dataset, plan,
train (the release's noise key and the registry's signed receipt written with it), inspect,
serve on SQLite, query, and the refusals (noise above the value scale, a tampered card). The
fixtures' collect and train, inspect and evaluate run as real subprocesses; the variations
run the same entry point in this process (flags that do not belong to fqi:
tests/unit/trainer/test_trainer_commands_train.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import (
    QVEIL,
    InProcessServer,
    ensure_population,
    fresh_bundle,
    start_server,
)

from qveil.answer import DEFAULT_VALUE_GRID, released_values
from qveil.bundle import ADMIN_CARD_FILE, CARD_FILE, KEY_FILE, RECEIPT_FILE, load_bundle
from qveil.client import ValueClient
from qveil.errors import IntegrityError
from qveil.keyed import KEY_BYTES, snap

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "linewalk-private.toml")


def qveil(
    *argv: str, cwd: Path | None = None, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess; ``home``: its QVEIL_HOME (default: this test's)."""
    import os

    env = None if home is None else {**os.environ, "QVEIL_HOME": str(home)}
    return subprocess.run(
        [QVEIL, *argv], capture_output=True, text=True, timeout=180, cwd=cwd, env=env
    )


def cli(*argv: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The same command through the CLI's entry point in this process (the variations of the
    commands the fixtures and first tests run as real subprocesses)."""
    return qveil_main(*argv, env=None if home is None else {"QVEIL_HOME": str(home)})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "users.npz"
    r = qveil(
        "dataset",
        "collect",
        "--env",
        "qveil/LineWalk-v0",
        "--users",
        "300",
        "--seed",
        "3",
        "--out",
        str(out),
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    return out


def _train_argv(dataset: Path, epsilon: str, out: str, *, home: Path | None = None) -> list[str]:
    """``qveil train`` of the fqi CONFIG on ``dataset`` at (epsilon, 1e-5) into ``out``."""
    return [
        *("train", *ensure_population(home=home), "--mode", "fqi", "--dataset", str(dataset)),
        *("--config", CONFIG, "--epsilon", epsilon, "--delta", "1e-5", "--out", out),
    ]


@pytest.fixture(scope="module")
def bundle(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "bundle"
    home = out.parent / "qveil-home"  # the registry this bundle is recorded in
    r = qveil(
        *_train_argv(dataset, "1", str(out), home=home),
        home=home,
    )
    assert r.returncode == 0, r.stderr
    assert "holds=True" in r.stdout and "WARNING" not in r.stderr
    return out


def test_card_holds_and_matches_the_plan(bundle: Path, dataset: Path) -> None:
    """The card's numbers are the accountant's for the run's real parameters: the same as
    `qveil privacy --mode fqi` gives before training for N = 300 users."""
    card = load_bundle(bundle).card
    assert card["mode"] == "fqi" and card["holds"] is True
    assert card["neighbour"] == "user" and card["users"] == 300
    assert "one user's whole data replaced" in card["basis"]
    assert card["dataset_fingerprint"].startswith("sha256:")
    assert card["model"]["kind"] == "additive" and card["dims"] == 1 and card["seeded"] is False
    for key in (
        "reward_bound",
        "gamma",
        "iterations",
        "sup_sensitivity",
        "kappa",
        "beta",
        "sensitivity",
        "sigma",
        "epsilon",
        "delta_total",
    ):
        assert key in card, key
    r = cli(
        "privacy",
        "--mode",
        "fqi",
        "--config",
        CONFIG,
        "--users",
        "300",
        "--epsilon",
        "1",
        "--delta",
        "1e-5",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    for key in ("sigma", "sup_sensitivity", "kappa", "beta", "sensitivity", "epsilon"):
        assert plan[key] == pytest.approx(card[key], rel=1e-12), key
    assert plan["noise_to_value"] == pytest.approx(card["sigma"] / (0.5 / 0.7))


def test_inspect_prints_the_unnoised_mean(bundle: Path) -> None:
    r = qveil("inspect", "--bundle", str(bundle), "--grid", "11", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert np.allclose(out["states"], np.linspace(0, 1, 11)[:, None])  # [n, d], d = 1
    mean = np.array(out["mean"])
    assert mean.shape == (11, 2)
    assert np.allclose(mean, load_bundle(bundle).q_values(np.linspace(0, 1, 11)))
    # LineWalk: right is better on the left half, left on the right half
    assert mean[1, 1] > mean[1, 0] and mean[9, 0] > mean[9, 1]


def test_served_fqi_release_answers_the_release_s_own_values(
    bundle: Path, dataset: Path, tmp_path: Path
) -> None:
    """One serving path: the server answers an fqi bundle like any release, bit for bit
    :func:`qveil.answer.released_values` of the bundle (the mean at the snapped state plus
    the key's noise, on the value grid), repeated states the same. A copy of the release
    served from another store (an empty answer log) answers identically: the answers are the
    key's, not the store's. `qveil evaluate --target` plays the served policy from the
    PUBLIC card alone (the non-private reference reads the card's public estimator
    configuration) and beats random."""
    copy = fresh_bundle(bundle, tmp_path / "bundle")  # this test's registry
    b = load_bundle(copy)
    states = np.linspace(0.0, 1.0, 400)
    units = b.box.to_unit(states[:, None])
    expected = released_values(b, units)
    sp = start_server(tmp_path, copy, store=f"sqlite:///{tmp_path / 's.sqlite'}")
    try:
        with ValueClient(sp.target, timeout=30) as c:
            first = c.values(states)
            assert np.array_equal(first, expected)
            assert np.array_equal(first[::-1], c.values(states[::-1]))
            card = c.release()
            assert card.mode == "fqi" and card.holds
    finally:
        assert sp.terminate() == 0
    other = fresh_bundle(bundle, tmp_path / "copy2" / "bundle")
    sp = InProcessServer(other, f"sqlite:///{tmp_path / 'other.sqlite'}")  # the same server code
    try:
        with ValueClient(sp.target, timeout=30) as c:
            assert np.array_equal(first, c.values(states))
        r = qveil(
            "evaluate",
            "--target",
            sp.target,
            "--dataset",
            str(dataset),
            "--episodes",
            "10",
            "--seed",
            "1",
            "--json",
        )
        assert r.returncode == 0, r.stderr
        scores = {row["policy"].split(" (")[0]: row["mean"] for row in json.loads(r.stdout)}
        assert set(scores) == {"served release", "random", "non-private FQI"}
        assert scores["served release"] > scores["random"] + 3
    finally:
        sp.close()
    # the values are the snapped mean plus the key's noise, within half a value-grid step;
    # the noise is there (a path within 1e-3 sigma of 0 on all of [0, 1] has no real chance)
    idx, xs = snap(units)
    exact = b.q_values_unit(xs) + b.noise_paths.noise(idx)
    assert np.abs(first - exact).max() <= DEFAULT_VALUE_GRID / 2
    assert np.abs(first - b.q_values(states)).max() > 1e-3 * b.sigma


def test_train_writes_the_release_key_and_its_receipt(
    bundle: Path, dataset: Path, tmp_path: Path
) -> None:
    """`qveil train` writes the release's one noise key (32 bytes, owner-only) with the
    bundle, the admin card commits to it (key_sha256; the public card does not show it), and
    the registry's signed receipt of the charge (receipt.json) names the release, its
    population, its charge, its key, weights and card, signed by the key `qveil budget
    registry-key` prints. No store is created. A second training of the same data fits the
    same weights but draws another key: another release, other answers."""
    from qveil.bundle.receipt import check_receipt, read_receipt

    key = (bundle / KEY_FILE).read_bytes()
    assert len(key) == KEY_BYTES
    assert stat.S_IMODE((bundle / KEY_FILE).stat().st_mode) == 0o600
    b = load_bundle(bundle)
    assert b.noise_key == key and b.card["seeded"] is False
    admin = json.loads((bundle / ADMIN_CARD_FILE).read_text())
    assert admin["key_sha256"] == hashlib.sha256(key).hexdigest() == b.card["key_sha256"]
    assert "key_sha256" not in json.loads((bundle / CARD_FILE).read_text())
    assert (
        key.hex() not in (bundle / CARD_FILE).read_text() + (bundle / ADMIN_CARD_FILE).read_text()
    )
    assert stat.S_IMODE((bundle / RECEIPT_FILE).stat().st_mode) == 0o600
    rec = read_receipt(bundle)
    assert rec is not None and rec.release_id == b.bundle_id and rec.population == "test-users"
    assert rec.epsilon == pytest.approx(b.card["epsilon"], rel=1e-9)
    assert (rec.key_sha256, rec.weights_sha256, rec.card_sha256) == (
        b.card["key_sha256"], b.card["weights_sha256"], b.card["card_sha256"],
    )  # fmt: skip
    home = bundle.parent / "qveil-home"
    r = cli("budget", "registry-key", home=home)
    assert r.returncode == 0, r.stderr
    assert rec.public_key == r.stdout.strip()
    check_receipt(bundle, release_id=b.bundle_id, key_sha256=rec.key_sha256,
                  weights_sha256=rec.weights_sha256, card_sha256=rec.card_sha256,
                  trusted=[r.stdout.strip()])  # fmt: skip
    assert not [p for p in (*bundle.parent.rglob("*"), *home.rglob("*")) if "store" in p.name]
    # the same data trained again (this test's registry): same weights, another key
    again = tmp_path / "again"
    r = cli(*_train_argv(dataset, "1", str(again)))
    assert r.returncode == 0, r.stderr
    a = load_bundle(again)
    assert a.card["weights_sha256"] == b.card["weights_sha256"]
    assert a.noise_key != b.noise_key and a.card["key_sha256"] != b.card["key_sha256"]
    assert a.bundle_id != b.bundle_id
    units = np.linspace(0.0, 1.0, 50)[:, None]
    assert (released_values(a, units) != released_values(b, units)).mean() > 0.9


def test_too_much_noise_is_refused_unless_forced(dataset: Path, tmp_path: Path) -> None:
    """At epsilon 0.01 with 300 users the noise is above the value scale (expected worse
    than random): refused with exit 2 and nothing written; --force writes it with a loud
    warning."""
    out = tmp_path / "b"
    args = _train_argv(dataset, "0.01", str(out))
    r = cli(*args)
    assert r.returncode == 2 and "WORSE THAN A RANDOM POLICY" in r.stderr
    assert "--force" in r.stderr and not out.exists()
    r = cli(*args, "--force")
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "WORSE THAN A RANDOM POLICY" in r.stderr
    assert load_bundle(out).card["noise_to_value"] > 1.0


def test_a_warning_between_half_and_one(dataset: Path, tmp_path: Path) -> None:
    r = cli(
        *_train_argv(dataset, "0.03", str(tmp_path / "b")),
    )
    card = load_bundle(tmp_path / "b").card
    assert r.returncode == 0, r.stderr
    assert 0.5 < card["noise_to_value"] <= 1.0, card["noise_to_value"]
    assert "WARNING" in r.stderr and "large part of the values" in r.stderr


def test_tampered_fqi_card_is_refused(bundle: Path, tmp_path: Path) -> None:
    """Every fqi number is recomputed on load: a card whose kappa (and checksum) were edited
    to claim less noise is refused, naming the field."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    from qveil.bundle import ADMIN_CARD_FILE, card_digest, merge_card, split_card

    card = merge_card(  # the public card.json and the admin card_admin.json
        json.loads((copy / CARD_FILE).read_text()),
        json.loads((copy / ADMIN_CARD_FILE).read_text()),
    )
    card["kappa"] = card["kappa"] / 4
    card["card_sha256"] = card_digest(card)
    public, admin = split_card(card)
    (copy / CARD_FILE).write_text(json.dumps(public))
    (copy / ADMIN_CARD_FILE).write_text(json.dumps(admin))
    with pytest.raises(IntegrityError, match="kappa"):
        load_bundle(copy)


def test_reward_relation_needs_a_dataset_that_declares_population_averages(
    dataset: Path, tmp_path: Path
) -> None:
    """The reward relation's bound holds only when each reward is already the mean of the N
    users' reward functions: on ordinary per-user rows it is refused (exit 2, nothing
    written); a dataset that declares it (collected with the flag) trains under it."""
    out = tmp_path / "refused" / "bundle"
    argv = ["train", "--mode", "fqi", "--config", CONFIG, "--epsilon", "1", "--delta", "1e-5"]
    argv += ensure_population()
    r = cli(*argv, "--dataset", str(dataset), "--neighbour", "reward", "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the reward neighbour relation assumes each sample's reward is already the mean" in (
        r.stderr
    )
    assert "Use --neighbour user" in r.stderr
    assert "--rewards-are-population-averages" in r.stderr and "Traceback" not in r.stderr
    assert not out.parent.exists()  # no bundle, no store, no ledger
    declared = tmp_path / "declared.npz"
    r = cli(
        "dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "300", "--seed", "3",
        "--out", str(declared), "--no-progress", "--rewards-are-population-averages",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = tmp_path / "accepted" / "bundle"
    r = cli(*argv, "--dataset", str(declared), "--neighbour", "reward", "--out", str(out))
    assert r.returncode == 0, r.stderr
    card = load_bundle(out).card
    assert card["neighbour"] == "reward" and card["holds"] is True
    assert "reward relation" in card["basis"]


def test_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    r = cli("train", "--mode", "fqi", "--epsilon", "1", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "--dataset" in r.stderr
    r = cli(
        "train",
        *ensure_population(),
        "--dataset",
        str(tmp_path / "nope.npz"),
        "--epsilon",
        "1",
        "--out",
        str(tmp_path / "b"),
    )
    assert r.returncode == 2 and "nope.npz" in r.stderr and not (tmp_path / "b").exists()


def test_train_records_the_release_in_its_population_ledger(bundle: Path) -> None:
    """`qveil train` records its release in the registry's ledger under the population it
    names, as one Gaussian mechanism with mu = sensitivity / sigma (the charge its receipt
    is signed for); the bundle holds its files and the receipt, nothing else (no store)."""
    from qveil.bundle.receipt import read_receipt
    from qveil.server.governance.registry import open_registry

    card = load_bundle(bundle).card
    home = bundle.parent / "qveil-home"
    r = cli("budget", "show", "test-users", "--json", home=home)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    [ev] = rep["events"]
    assert ev["release_id"] == card["bundle_id"] and ev["mode"] == "fqi"
    assert ev["epsilon"] == pytest.approx(card["epsilon"], rel=1e-9)
    assert "Gaussian privacy filter" in rep["rule"]
    with open_registry(f"sqlite:///{home / 'registry.sqlite'}") as reg:
        entry = reg.ledger.entry_for_release(card["bundle_id"])
        public_key = reg.public_key
    assert entry is not None and entry.dataset_id == "test-users"
    rec = read_receipt(bundle)
    assert rec is not None and rec.public_key == public_key
    assert (rec.epsilon, rec.delta) == (entry.event.epsilon, entry.event.delta)
    assert sorted(p.name for p in bundle.iterdir()) == sorted(
        ["weights.npz", KEY_FILE, CARD_FILE, ADMIN_CARD_FILE, "config.toml",
         "training_log.csv", "learning_curve.png", RECEIPT_FILE]
    )  # fmt: skip
