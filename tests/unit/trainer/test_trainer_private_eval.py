"""The private off-policy evaluation: the release's policy computed in process (the same
actions a real server gives) and `qveil evaluate --private DIR` end to end: no server, no
store, nothing of the held-out users' states kept anywhere. The estimate and its accountant
alone: tests/unit/core/test_ope.py and test_privacy_ope.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import QVEIL, REPO, ensure_population, fresh_bundle, registry_home

from qveil.ope import policy_value

CONFIG = str(REPO / "configs" / "linewalk-private.toml")


def _cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QVEIL, *argv], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def linewalk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.npz and held.npz (300 LineWalk users each, seeds 1 and 2) and a release
    ``rel/bundle`` trained by `qveil train` on train.npz at epsilon 1 (in a registry of the
    module's own: each test charges a :func:`fresh_bundle` copy in its own)."""
    d = tmp_path_factory.mktemp("linewalk")
    for name, seed in (("train.npz", "1"), ("held.npz", "2")):
        r = qveil_main("dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "300",
                       "--seed", seed, "--out", str(d / name), "--no-progress")  # fmt: skip
        assert r.returncode == 0, r.stderr
    with registry_home(d / "home"):
        r = qveil_main("train", "--mode", "fqi", "--dataset", str(d / "train.npz"), "--config",
                       CONFIG, "--epsilon", "1", "--delta", "1e-5", "--out",
                       str(d / "rel" / "bundle"), *ensure_population())  # fmt: skip
    assert r.returncode == 0, r.stderr
    return d


def _files(*roots: Path) -> set[Path]:
    return {p for root in roots for p in root.rglob("*") if p.is_file()}


def test_evaluate_private_end_to_end(linewalk: Path, tmp_path: Path) -> None:
    """A private evaluation of a LineWalk release on 300 held-out users, with NO server: an
    estimate with its 95% interval, its scale and what the interval does not cover, charged
    to the population (the ledger shows it) and recorded in the registry's audit log under
    the release. No store is created by it (no file appears in the bundle, beside it, in the
    datasets' directory, the working directory or QVEIL_HOME but the registry's own).
    `--private --target` is refused (exit 2: held-out states never go to a server); a second
    evaluation past the budget is refused before any data is read."""
    pop = ensure_population()
    b = fresh_bundle(linewalk / "rel" / "bundle", tmp_path / "rel" / "bundle")
    held = str(linewalk / "held.npz")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    home = Path(os.environ["QVEIL_HOME"])
    roots = (tmp_path, linewalk, home)
    before = _files(*roots)
    r = _cli("evaluate", "--private", str(b), "--dataset", held, "--config", CONFIG,
             "--epsilon", "1", *pop, "--json", cwd=cwd)  # fmt: skip
    assert r.returncode == 0, r.stderr
    new = _files(*roots) - before
    assert all(p.parent == home and p.name.startswith("registry.sqlite") for p in new), new
    assert not [p for p in _files(*roots) if "store" in p.name], "a store was created"
    assert not (b.parent / "qveil-store.sqlite").exists() and not (home / "store.sqlite").exists()
    rep = json.loads(r.stdout)
    assert rep["release_id"] == json.loads((b / "card.json").read_text())["bundle_id"]
    lo, hi = rep["interval95"]
    assert lo < rep["estimate"] < hi and rep["epsilon"] == pytest.approx(1.0, rel=1e-6)
    # the discounted value of a good LineWalk policy from a random start: positive and
    # below r0 / (1 - gamma)
    assert 0.0 < rep["estimate"] < 0.5 / (1 - 0.5) + 3 * rep["sigma"]
    # it names its scale (a discounted value at the config's gamma, not a return) and
    # what its interval does not cover (the evaluation's bias)
    assert rep["gamma"] == 0.3 and rep["scale"].startswith("discounted value (gamma 0.3)")
    assert "not the episode return" in rep["scale"]
    assert "bias" in rep["interval_does_not_cover"] and rep["seeded"] is False
    events = rep["population_budget"]["events"]
    assert len(events) == 2 and events[-1]["release_id"] is None
    # a server target is refused, whatever else is right, and so is a missing bundle
    r = qveil_main("evaluate", "--private", str(b), "--target", "127.0.0.1:1", "--dataset",
                   held, "--config", CONFIG, "--epsilon", "1", *pop)  # fmt: skip
    assert r.returncode == 2 and "never sends held-out states to a server" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = qveil_main("evaluate", "--private", "--dataset", held, "--config", CONFIG,
                   "--epsilon", "1", *pop)  # fmt: skip
    assert r.returncode == 2 and "--private needs a bundle DIR" in r.stderr, r.stderr
    r = qveil_main("budget", "create", "tiny", "--epsilon", "0.5", "--delta", "1e-5")
    assert r.returncode == 0, r.stderr
    r = qveil_main("evaluate", "--private", str(b), "--dataset", str(tmp_path / "nope.npz"),
                   "--config", CONFIG, "--epsilon", "1", "--population", "tiny")  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "nope.npz" in r.stderr  # the dataset is looked at only after the budget
    r = qveil_main("evaluate", "--private", str(b), "--dataset", held, "--config", CONFIG,
                   "--epsilon", "1", *pop)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "scale: discounted value (gamma 0.3)" in r.stdout
    assert "the interval does NOT cover the bias of the fitted-Q evaluation" in r.stdout
    from qveil.server.governance import audit_log
    from qveil.server.governance.registry import open_registry

    with open_registry() as reg:
        ev = audit_log.entries(reg.db, action="private-evaluation")
    assert len(ev) == 2 and ev[0].target == rep["release_id"]
    assert ev[0].params["estimate"] == rep["estimate"] and ev[0].params["gamma"] == 0.3
    # the admin card of the release shows it (AdminService.GetAdminCard's handler)
    from qveil.server.serving.services import Services
    from qveil.server.store import open_store

    with open_store("memory://") as st:
        h = Services.create(store=st).releases
        h.start(b)
        _, public, admin = h.admin_card()
    shown, _second = admin["private_evaluations"]
    assert shown["estimate"] == rep["estimate"] and shown["interval95"] == rep["interval95"]
    assert "private_evaluations" not in public


def test_the_evaluated_policy_is_the_served_policy(linewalk: Path, tmp_path: Path) -> None:
    """The policy evaluated in process is the one a real server of the release plays: J from
    the actions of a real server's GetBestActions (LocalServer: gRPC over loopback) on the
    held-out data is bit for bit the J inside the private estimate (estimate = J + sigma z,
    z from a seeded normal source)."""
    from qveil.bundle import load_bundle
    from qveil.client import ValueClient
    from qveil.dataset import load_dataset
    from qveil.kfqi_config import load_fqi_config
    from qveil.rng import seeded_rng
    from qveil.server.governance.release_records import open_release_records
    from qveil.server.local import LocalServer
    from qveil.trainer.private_eval import estimator_of, private_evaluation

    pop = ensure_population()[1]
    b = fresh_bundle(linewalk / "rel" / "bundle", tmp_path / "rel" / "bundle")
    bundle = load_bundle(b)
    data = load_dataset(linewalk / "held.npz")
    cfg = load_fqi_config(CONFIG)
    with open_release_records(None, actor="tests") as rec:
        rep = private_evaluation(bundle=bundle, dataset=data, config=cfg, epsilon=1.0,
                                 delta=1e-5, population=pop, records=rec,
                                 noise=seeded_rng(7))  # fmt: skip
    assert rep["seeded"] is True
    spec, box, _env, rr = estimator_of(cfg, data)
    lo = np.array([iv.lo for iv in box.intervals])
    hi = np.array([iv.hi for iv in box.intervals])
    asked: list[int] = []
    with LocalServer(b, f"sqlite:///{tmp_path / 'served.sqlite'}") as srv:
        with ValueClient(srv.target, timeout=60) as client:

            def served(unit: np.ndarray) -> np.ndarray:
                states = lo + unit.reshape(len(unit), -1) * (hi - lo)
                asked.append(len(states))
                return np.asarray(client.best_actions(states), dtype=np.int64).reshape(-1)

            j, _ = policy_value(data.transitions,
                                policy=served, n_actions=int(data.n_actions),
                                reward_range=rr, box=box, spec=spec)  # fmt: skip
    assert sum(asked) > 300  # the held-out first states and the anchors were asked
    z = float(seeded_rng(7).standard_normal())
    assert rep["estimate"] == float(j + rep["sigma"] * z)
