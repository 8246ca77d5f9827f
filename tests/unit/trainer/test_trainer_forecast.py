"""qveil.trainer.forecast (`qveil privacy --forecast`, `qveil train --forecast`): the same
estimator on simulated public data of N users, before any private data is read; no privacy
spent (nothing recorded, no key drawn for it, nothing stored). Each command path runs once as
a real process; the variations run the same entry point in this process."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import qveil_main
from config_helpers import mountaincar_config
from server_helpers import REPO, ensure_population, qveil

from qveil.dataset import save_dataset
from qveil.errors import InvalidArgument
from qveil.kfqi_config import load_fqi_config
from qveil.trainer.collect import collect
from qveil.trainer.forecast import MEASURED_ERROR, NEAR_RANDOM, Forecast, forecast

CONFIG = REPO / "configs" / "linewalk-private.toml"


def test_linewalk_forecast_is_useful_at_300_users_and_worse_than_random_at_10() -> None:
    """LineWalk at eps 1: N = 300 users forecast close to non-private (served: 20.3 +- 0.2 of
    20.7, docs/results.md); N = 10 at eps 0.05 forecast below random (the noise swamps a
    non-private fit that does beat random), with the warning that says so and a refusal."""
    cfg = load_fqi_config(CONFIG)
    good = forecast(cfg, users=300, epsilon=1.0, releases=4, episodes=12)
    assert good.fraction_lo > 0.5 and good.non_private > good.random
    assert not good.near_random and "WARNING" not in good.text() and good.refusal is None
    bad = forecast(cfg, users=10, epsilon=0.05, releases=10, episodes=30)
    assert bad.sigma > 50 * good.sigma
    assert bad.fraction_hi < NEAR_RANDOM and bad.near_random and bad.fraction < 0
    assert not bad.random_level and bad.worse_than_random and bad.refusal is not None
    assert "WORSE THAN A RANDOM POLICY" in bad.text()


def test_the_forecast_states_its_own_error() -> None:
    """Every forecast says what its interval covers and how far it was from served
    releases of its env (or that this was not measured); the JSON carries the number."""
    cfg = load_fqi_config(CONFIG)
    fc = forecast(cfg, users=300, epsilon=1.0, releases=2, episodes=6)
    err = MEASURED_ERROR["qveil/LineWalk-v0"]
    assert f"off by at most {err[0]:.2f} of the way" in fc.text()
    assert "covers the simulated noise and episodes only" in fc.text()
    assert fc.to_dict()["measured_error"] == {"max_abs": err[0], "sizes": err[1]}
    other = dataclasses.replace(fc, env_id="Acrobot-v1")
    assert "not measured for Acrobot-v1" in other.text()
    assert other.to_dict()["measured_error"] is None


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
    for run, users in ((qveil, "2000"), (qveil_main, "200")):
        r = run(*argv, "--users", users)
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
    only the trained release) nor writes anything for it: the output directory holds the
    one bundle, with its one key and receipt, and no store."""
    r = qveil("privacy", "--mode", "fqi", "--config", str(CONFIG), "--users", "300",
              "--epsilon", "1", "--delta", "1e-5", "--forecast", "--forecast-releases", "2",
              "--forecast-episodes", "6", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fc = json.loads(r.stdout)["forecast"]
    assert fc["users"] == 300 and 0.0 < fc["fraction"] and "near_random" in fc
    r = qveil_main("privacy", "--mode", "fqi", "--config", str(CONFIG), "--users", "300",
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
    r = qveil_main("budget", "show", "test-users", "--json")
    assert len(json.loads(r.stdout)["events"]) == 1  # the release only
    assert sorted(p.name for p in out.parent.iterdir()) == ["bundle"]
    assert {"noise.key", "receipt.json"} <= {p.name for p in out.iterdir()}


def test_random_level_data_is_said_plainly_and_train_refuses_it(tmp_path: Path) -> None:
    """MountainCar-v0 under the random behaviour policy never reaches the goal: every reward
    is -1, the non-private fit returns what random does. The forecast says the data cannot
    support any policy better than random (no "nan", no advice that a larger epsilon would
    help; JSON carries the fraction as null); `qveil train --forecast` refuses the release
    before reading the data, unless --force."""
    cfg = mountaincar_config(tmp_path)
    plan = ("privacy", "--mode", "fqi", "--config", str(cfg), "--users", "20", "--epsilon", "1",
            "--forecast", "--forecast-releases", "2", "--forecast-episodes", "6")  # fmt: skip
    r = qveil_main(*plan, "--json")
    assert r.returncode == 0, r.stderr
    fc = json.loads(r.stdout)["forecast"]
    assert fc["random_level"] is True and fc["fraction"] is None
    assert fc["non_private"] == fc["random"] and fc["worse_than_random"] is False
    r = qveil_main(*plan)
    assert r.returncode == 0, r.stderr
    assert "CANNOT SUPPORT ANY POLICY BETTER THAN RANDOM" in r.stdout
    assert "nan" not in r.stdout and "NEAR RANDOM" not in r.stdout
    data = tmp_path / "mc.npz"
    save_dataset(collect("MountainCar-v0", 20, 4, reward_range=(-1.0, 0.0)), data)
    out = tmp_path / "rel" / "bundle"
    train = ("train", "--mode", "fqi", "--dataset", str(data), "--config", str(cfg),
             "--epsilon", "1", "--out", str(out), "--forecast", *ensure_population())  # fmt: skip
    r = qveil_main(*train)
    assert r.returncode == 2, r.stderr
    assert "refusing: the forecast says the data cannot support any policy better" in r.stderr
    assert "--force" in r.stderr and not out.exists()
    r = qveil_main(*train, "--force")
    assert r.returncode == 0, r.stderr
    assert "CANNOT SUPPORT" in r.stdout and out.exists()


def test_the_forecast_simulates_the_configs_behaviour_policy(tmp_path: Path) -> None:
    """behaviour_policy / behaviour_epsilon: the forecast's users are simulated with that
    public policy (the energy heuristic reaches MountainCar's goal, so 10 users of it support
    a policy better than random, where random-policy users are random-level); an unknown
    name or an epsilon outside [0, 1] is refused."""
    keys = {"gamma": "0.5", "iterations": "4", "lam": "0.02", "default_value": "-2.0",
            "anchor_points": "12", "bandwidth": "0.1"}  # fmt: skip
    cfg = load_fqi_config(
        mountaincar_config(
            tmp_path,
            "energy",
            **keys,
            behaviour_policy='"mountaincar-energy"',
            behaviour_epsilon="0.3",
        )  # fmt: skip
    )
    fc = forecast(cfg, users=10, epsilon=1.0, releases=1, episodes=3)
    assert "users of behaviour policy mountaincar-energy (epsilon 0.3)" in fc.source
    assert not fc.random_level and fc.non_private > fc.random
    with pytest.raises(InvalidArgument, match="unknown behaviour policy 'greedy'"):
        forecast(cfg.replace(behaviour_policy="greedy"), users=20, epsilon=1.0)
    with pytest.raises(InvalidArgument, match=r"behaviour_epsilon must be in \[0, 1\]"):
        load_fqi_config(mountaincar_config(tmp_path, "bad", behaviour_epsilon="1.5"))


def _forecast(**changes: float) -> Forecast:
    base = dict(env_id="e", users=10, epsilon=1.0, sigma=0.1, fraction=0.6, fraction_lo=0.4,
                fraction_hi=0.8, private=16.0, non_private=20.0, random=10.0, releases=2,
                episodes=6, source="s", gain_lo=5.0)  # fmt: skip
    return Forecast(**(base | changes))  # type: ignore[arg-type]


def test_a_release_worse_than_random_is_said_plainly() -> None:
    """A useful non-private fit and a release below random (fraction < 0): the forecast
    says WORSE THAN A RANDOM POLICY and `qveil train --forecast` refuses it; a useful one
    is not refused, a near-random one warns without refusing."""
    worse = _forecast(fraction=-0.43, fraction_lo=-1.29, fraction_hi=0.17, private=6.0)
    assert worse.worse_than_random and not worse.random_level
    assert "WORSE THAN A RANDOM POLICY" in worse.text() and "NEAR RANDOM" not in worse.text()
    assert worse.refusal is not None and "WORSE THAN A RANDOM POLICY" in worse.refusal
    good = _forecast()
    assert good.refusal is None and "WARNING" not in good.text()
    near = _forecast(fraction=0.05, fraction_lo=-0.1, fraction_hi=0.15)
    assert near.refusal is None and "NEAR RANDOM" in near.text()
    level = _forecast(gain_lo=0.0)
    assert level.random_level and level.refusal is not None and not level.worse_than_random
