"""The privacy ledger on by default, with real `qveil train` / `qveil serve` processes and a
real registry: every trained release is recorded against its population, once (charging a
copy of it again records nothing more); serving charges nothing (it checks the receipt of
the recorded charge and says what it was); `qveil admin ledger` lists spending per
population and names the composition rule. Each command path runs once as a real process;
the variations run the same entry point in this process (cli_helpers.qveil_main)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import qveil_main
from server_helpers import QVEIL, REPO, charge, running

from qveil.bundle import RECEIPT_FILE, load_bundle
from qveil.privacy import E3_SETTINGS, PrivacyParams, account
from qveil.privacy.ledger import BASIC_RULE, GAUSSIAN_RULE, PrivacyEvent, compose_with_rule

CONFIG = str(REPO / "configs" / "linewalk-private.toml")


def _qveil(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QVEIL, *argv], capture_output=True, text=True, timeout=180)


def _ledger(store: str) -> list[dict]:  # type: ignore[type-arg]
    r = qveil_main("admin", "ledger", "--store", store, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "users.npz"
    r = qveil_main("dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "60",
                   "--seed", "5", "--out", str(out), "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def _train(
    dataset: Path, out: Path, epsilon: str, *, run: Callable[..., Any] = qveil_main
) -> subprocess.CompletedProcess[str]:
    """``qveil train`` charged to clinic (``run``: in this process, or :func:`_qveil`)."""
    r: subprocess.CompletedProcess[str] = run(
        "train", "--mode", "fqi", "--dataset", str(dataset), "--config", CONFIG,
        "--epsilon", epsilon, "--delta", "1e-5", "--force", "--out", str(out),
        "--population", "clinic",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r


def test_train_records_each_release_once_and_serve_charges_nothing(
    dataset: Path, tmp_path: Path
) -> None:
    r = qveil_main("budget", "create", "clinic", "--epsilon", "100", "--delta", "1e-5")
    assert r.returncode == 0, r.stderr
    store = f"sqlite:///{tmp_path / 'admin.sqlite'}"
    assert qveil_main("admin", "init-store", "--store", store).returncode == 0
    a = tmp_path / "a" / "bundle"
    out = _train(dataset, a, "4", run=_qveil).stdout
    assert "privacy: population clinic spent eps=4" in out and "receipt: release" in out, out
    b = tmp_path / "b" / "bundle"
    _train(dataset, b, "2")
    ids = [load_bundle(x).bundle_id for x in (a, b)]
    [rep] = _ledger(store)
    assert rep["dataset_id"] == "clinic" and [e["bundle_id"] for e in rep["events"]] == ids
    eps = [e["epsilon"] for e in rep["events"]]
    assert eps == [pytest.approx(4.0, rel=1e-9), pytest.approx(2.0, rel=1e-9)]
    # the population's privacy filter composes the two Gaussian releases exactly (mu-GDP):
    # tighter than the sum
    assert "Gaussian privacy filter" in rep["rule"]
    show = json.loads(qveil_main("budget", "show", "clinic", "--json").stdout)
    assert show["spent"]["epsilon"] < 4.0 + 2.0
    # serving (twice, and the other release) charges nothing: the ledger is unchanged
    for bundle in (a, a, b):
        with running(tmp_path, bundle) as srv:
            pass
        assert "charged to population clinic" in srv.output(), srv.output()
    assert _ledger(store) == [rep]
    # charging a release again (a copy re-charged in the same registry) records nothing more
    line = charge(a, population="clinic")
    assert f"release {ids[0]} charged to clinic" in line
    c = tmp_path / "c" / "bundle"
    shutil.copytree(b, c, ignore=shutil.ignore_patterns(RECEIPT_FILE))
    assert f"release {ids[1]} charged to clinic" in charge(c, population="clinic")
    assert _ledger(store) == [rep]
    text = _qveil("admin", "ledger", "--store", store).stdout
    assert "clinic" in text and "Gaussian privacy filter" in text


def test_serve_has_no_budget_flag(tmp_path: Path) -> None:
    """Serving charges nothing, so `qveil serve` has no --budget: a budget is the
    population's (`qveil budget create`), checked when `qveil train` charges."""
    r = qveil_main("serve", "--bundle", str(tmp_path), "--budget", "1")  # argparse refuses it
    assert r.returncode == 2 and "unrecognized arguments: --budget" in r.stderr, r.stderr


def test_composition_rule_names() -> None:
    """Gaussian events compose exactly (mu-GDP); an event without a mu falls back to basic
    composition, whose epsilon is the plain sum. A wrong rule (basic for Gaussians) would give
    eps_a + eps_b, which the first assertion refuses."""

    def ev(sigma: float, bid: str) -> PrivacyEvent:
        r = account(PrivacyParams(mode="output", sigma=sigma, **{**E3_SETTINGS, "actions": 2}))
        return PrivacyEvent.from_result(r, dataset_id="d", bundle_id=bid)

    a, b = ev(2.0, "a"), ev(3.0, "b")
    eps, _, rule = compose_with_rule([a, b])
    assert rule == GAUSSIAN_RULE and eps < a.epsilon + b.epsilon
    no_mu = PrivacyEvent.from_json(json.dumps({**b.to_dict(), "mu": None}))
    eps, _, rule = compose_with_rule([a, no_mu])
    assert rule == BASIC_RULE and math.isclose(eps, a.epsilon + b.epsilon)
