"""qveil.trainer.forecast (`qveil privacy --forecast`, `qveil train --forecast`): the same
estimator on simulated public data of N users, before any private data is read; no privacy
spent (nothing recorded, bound or stored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_helpers import REPO, ensure_population, qveil

from qveil.dataset import save_dataset
from qveil.errors import InvalidArgument
from qveil.kfqi_config import load_fqi_config
from qveil.trainer.collect import collect
from qveil.trainer.forecast import NEAR_RANDOM, forecast

CONFIG = REPO / "configs" / "linewalk-private.toml"


def test_linewalk_forecast_is_useful_at_300_users_and_near_random_at_10() -> None:
    """LineWalk at eps 1: N = 300 users forecast close to non-private (served: 20.3 +- 0.2 of
    20.7, docs/results.md); N = 10 at eps 0.05 forecast near random, with the warning."""
    cfg = load_fqi_config(CONFIG)
    good = forecast(cfg, users=300, epsilon=1.0, releases=4, episodes=12)
    assert good.fraction_lo > 0.5 and good.non_private > good.random
    assert not good.near_random and "WARNING" not in good.text()
    bad = forecast(cfg, users=10, epsilon=0.05, releases=10, episodes=30)
    assert bad.sigma > 50 * good.sigma
    assert bad.fraction_hi < NEAR_RANDOM and bad.near_random
    assert "NEAR RANDOM" in bad.text()


def test_a_public_dataset_replaces_the_simulation(tmp_path: Path) -> None:
    pub = collect("qveil/LineWalk-v0", 200, 9)
    fc = forecast(load_fqi_config(CONFIG), users=200, epsilon=1.0, dataset=pub, releases=2,
                  episodes=6)  # fmt: skip
    assert fc.source.startswith("the public dataset") and fc.users == 200
    with pytest.raises(InvalidArgument, match="epsilon > 0"):
        forecast(load_fqi_config(CONFIG), users=200, epsilon=0.0)


def test_a_public_dataset_is_released_with_the_noise_of_users(tmp_path: Path) -> None:
    """`qveil privacy --forecast --public-dataset P --users N`: the public dataset (200
    users) is fitted, and its simulated releases carry the noise of the N = 2000 users the
    plan is for (the sigma printed above the forecast), not of the dataset's 200."""
    pub = tmp_path / "public.npz"
    save_dataset(collect("qveil/LineWalk-v0", 200, 9), pub)
    argv = ("privacy", "--mode", "fqi", "--config", str(CONFIG), "--epsilon", "1", "--delta",
            "1e-5", "--forecast", "--public-dataset", str(pub), "--forecast-releases", "2",
            "--forecast-episodes", "6", "--json")  # fmt: skip
    sigmas = {}
    for users in ("2000", "200"):
        r = qveil(*argv, "--users", users)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["forecast"]["sigma"] == pytest.approx(out["sigma"], rel=1e-12), users
        assert out["forecast"]["users"] == int(users)
        assert "200 users" in out["forecast"]["source"]
        sigmas[users] = out["sigma"]
    assert sigmas["2000"] < sigmas["200"] / 5


def test_cli_forecast_spends_no_privacy(tmp_path: Path) -> None:
    """`qveil privacy --forecast` prints (and --json carries) the forecast; `qveil train
    --forecast` prints it before training; neither records anything for it (the ledger holds
    only the trained release), binds or creates a store for the forecast."""
    r = qveil("privacy", "--mode", "fqi", "--config", str(CONFIG), "--users", "300",
              "--epsilon", "1", "--delta", "1e-5", "--forecast", "--forecast-releases", "2",
              "--forecast-episodes", "6", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fc = json.loads(r.stdout)["forecast"]
    assert fc["users"] == 300 and 0.0 < fc["fraction"] and "near_random" in fc
    r = qveil("privacy", "--mode", "fqi", "--config", str(CONFIG), "--users", "300",
              "--sigma", "0.1", "--forecast")  # fmt: skip
    assert r.returncode == 2 and "--forecast needs --epsilon" in r.stderr
    data = tmp_path / "users.npz"
    save_dataset(collect("qveil/LineWalk-v0", 300, 4), data)
    out = tmp_path / "rel" / "bundle"
    r = qveil("train", "--mode", "fqi", "--dataset", str(data), "--config", str(CONFIG),
              "--epsilon", "1", "--delta", "1e-5", "--out", str(out), "--forecast",
              *ensure_population())  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.index("forecast (") < r.stdout.index("bundle ")
    r = qveil("budget", "show", "test-users", "--json")
    assert len(json.loads(r.stdout)["events"]) == 1  # the release only
    assert sorted(p.name for p in out.parent.iterdir() if p.is_dir()) == ["bundle"]
