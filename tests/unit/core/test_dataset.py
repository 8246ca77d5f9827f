"""qveil.dataset: validation (array + row in every error), the npz and Minari formats (round
trips keep the fingerprint), atomic writes, and qveil.trainer.collect (seeded, any Box/Discrete
env, terminal only on termination). Real files in tmp_path, real Gymnasium envs, real Minari."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.dataset import Dataset, Transitions, load_dataset, save_dataset, validate_arrays
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.trainer.collect import collect

LW = "qveil/LineWalk-v0"


@pytest.fixture(autouse=True)
def _minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minari:ID`` locations resolve under this test's tmp_path, never the real home."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-root"))


def _arrays(n: int = 20, d: int = 1, seed: int = 0) -> dict[str, Any]:
    """A small valid dataset as raw arrays: 4 users, LineWalk-like rewards in [0, 0.5]."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0, 1, size=(n, d) if d > 1 else n)
    return {
        "user": np.repeat(np.arange(4), n // 4).astype(np.int64),
        "s": s,
        "a": rng.integers(0, 2, n).astype(np.int64),
        "r": rng.uniform(0, 0.5, n),
        "s2": rng.uniform(0, 1, size=s.shape),
        "terminal": np.zeros(n, dtype=bool),
    }


def _ds(**overrides: Any) -> Dataset:
    kw: dict[str, Any] = {**_arrays(), "n_actions": 2, "reward_range": (0.0, 0.5)}
    kw.update(overrides)
    return Dataset(**kw)


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# -- construction and validation -----------------------------------------------------------


def test_construction_normalises_and_freezes() -> None:
    raw = _arrays()
    ds = _ds(**raw, env_id=LW)
    assert (ds.n, ds.d, ds.users, len(ds)) == (20, 1, 4, 20)
    assert ds.s.shape == (20, 1) and ds.s2.shape == (20, 1)
    assert ds.user.dtype == np.int64 and ds.a.dtype == np.int64
    assert ds.s.dtype == np.float64 and ds.r.dtype == np.float64 and ds.terminal.dtype == bool
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        arr = getattr(ds, name)
        assert not arr.flags.writeable
        assert not np.shares_memory(arr, raw[name])  # the caller's arrays are not aliased
    raw["r"][0] = 99.0  # changing the caller's array changes nothing inside
    assert ds.r[0] != 99.0


def test_fingerprint_is_canonical_and_sensitive() -> None:
    raw = _arrays()
    a = _ds(**raw)
    flat_vs_column = _ds(**{**raw, "s": raw["s"].reshape(-1, 1), "s2": raw["s2"].reshape(-1, 1)})
    assert a.fingerprint() == flat_vs_column.fingerprint() and a == flat_vs_column
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a.fingerprint())
    int32 = _ds(**{**raw, "a": raw["a"].astype(np.int32), "user": raw["user"].astype(np.int32)})
    assert int32.fingerprint() == a.fingerprint()  # content, not the caller's dtypes
    seen = {a.fingerprint()}
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        arr = raw[name].copy()
        if arr.dtype == bool:
            arr[3] = ~arr[3]
        elif name == "a":
            arr[3] = 1 - arr[3]
        elif name == "user":
            arr[3] = 77
        else:
            arr[3] = arr[3] * 0.5
        seen.add(_ds(**{**raw, name: arr}).fingerprint())
    seen.add(_ds(**raw, n_actions=3).fingerprint())
    seen.add(_ds(**raw, reward_range=(0.0, 0.5000000001)).fingerprint())
    seen.add(_ds(**raw, env_id=LW).fingerprint())
    assert len(seen) == 10  # every array and every metadata field is covered


def test_summary_keys_and_counts() -> None:
    ds = _ds(env_id=LW)
    s = ds.summary()
    assert s["users"] == 4 and s["samples"] == 20 and s["d"] == 1 and s["n_actions"] == 2
    assert sum(s["actions"]) == 20 and s["actions"] == np.bincount(ds.a, minlength=2).tolist()
    assert s["reward_range"] == [0.0, 0.5]
    assert s["reward_observed"] == [float(ds.r.min()), float(ds.r.max())]
    assert s["samples_per_user"] == {"min": 5, "max": 5} and s["terminals"] == 0
    assert s["env_id"] == LW and s["fingerprint"] == ds.fingerprint()
    json.dumps(s)  # serialisable as is


def _bad(name: str) -> tuple[dict[str, Any], str]:
    """Raw arrays broken in one way, and the regex its error must match (array and row)."""
    raw = _arrays()
    if name == "nan_s":
        raw["s"][7] = np.nan
        return raw, r"^s\[7, 0\] = nan is not finite"
    if name == "nan_r":
        raw["r"][5] = np.nan
        return raw, r"^r\[5\] = nan is not finite"
    if name == "inf_s2":
        raw["s2"][11] = -np.inf
        return raw, r"^s2\[11, 0\] = -inf is not finite"
    if name == "nan_s_2d":
        raw = _arrays(d=3)
        raw["s"][4, 2] = np.nan
        return raw, r"^s\[4, 2\] = nan is not finite"
    if name == "reward_high":
        raw["r"][17] = 0.73
        return raw, r"^r\[17\] = 0\.73 is outside the declared reward range \[0, 0\.5\]$"
    if name == "reward_low":
        raw["r"][2] = -1e-9
        return raw, r"^r\[2\] = -1e-09 is outside the declared reward range \[0, 0\.5\]$"
    if name == "action_high":
        raw["a"][9] = 2
        return raw, r"^a\[9\] = 2 is outside the env's actions \[0, 2\)$"
    if name == "action_negative":
        raw["a"][0] = -1
        return raw, r"^a\[0\] = -1 is outside the env's actions \[0, 2\)$"
    if name == "short_r":
        raw["r"] = raw["r"][:19]
        return raw, r"mismatched lengths: r has 19 rows but a has 20 \(row 19 "
    if name == "long_user":
        raw["user"] = np.append(raw["user"], 3)
        return raw, r"mismatched lengths: user has 21 rows but a has 20"
    if name == "short_s2":
        raw["s2"] = raw["s2"][:10]
        return raw, r"mismatched lengths: s2 has 10 rows but a has 20 \(row 10 "
    if name == "float_actions":
        raw["a"] = raw["a"].astype(np.float64)
        return raw, r"^a must hold integers \(int64\), got dtype float64"
    if name == "int_terminal":
        raw["terminal"] = raw["terminal"].astype(np.int64)
        return raw, r"^terminal must hold booleans, got dtype int64"
    if name == "string_rewards":
        raw["r"] = raw["r"].astype(str)
        return raw, r"^r must hold real numbers \(float64\), got dtype <U"
    if name == "d_mismatch":
        raw["s2"] = np.stack([raw["s2"], raw["s2"]], axis=1)
        return raw, r"s and s2 must have the same number of coordinates d, got s with 1 and s2 "
    if name == "s_3d":
        raw["s"] = raw["s"].reshape(20, 1, 1)
        return raw, r"^s must be \[n\] or \[n, d\], got shape \(20, 1, 1\)"
    if name == "a_2d":
        raw["a"] = raw["a"].reshape(20, 1)
        return raw, r"^a must be 1-D \[n\], got shape \(20, 1\)"
    if name == "empty":
        raw = {k: v[:0] for k, v in raw.items()}
        return raw, r"the dataset is empty"
    raise AssertionError(name)


BAD = [
    "nan_s",
    "nan_r",
    "inf_s2",
    "nan_s_2d",
    "reward_high",
    "reward_low",
    "action_high",
    "action_negative",
    "short_r",
    "long_user",
    "short_s2",
    "float_actions",
    "int_terminal",
    "string_rewards",
    "d_mismatch",
    "s_3d",
    "a_2d",
    "empty",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_data_names_array_and_row(case: str) -> None:
    raw, pattern = _bad(case)
    with pytest.raises(InvalidArgument, match=pattern):
        Dataset(**raw, n_actions=2, reward_range=(0.0, 0.5))
    with pytest.raises(InvalidArgument, match=pattern):
        validate_arrays(Transitions.of(raw), n_actions=2, reward_range=(0.0, 0.5))


@pytest.mark.parametrize("case", BAD)
def test_bad_npz_file_is_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    """A bad file written by another tool: load refuses it (array and row); and a Dataset
    corrupted behind the validator's back is refused by save_dataset, writing nothing."""
    raw, pattern = _bad(case)
    src = tmp_path / "in"
    src.mkdir()
    np.savez(src / "bad.npz", **raw, n_actions=np.int64(2), reward_low=0.0, reward_high=0.5)
    with pytest.raises(InvalidArgument, match=pattern):
        load_dataset(src / "bad.npz")
    good = _ds()
    out = tmp_path / "out"
    out.mkdir()
    for name, value in raw.items():  # bypass the frozen dataclass, as a buggy caller might
        object.__setattr__(good, name, value)
    for target in (out / "x.npz", out / "x-v0"):
        with pytest.raises(InvalidArgument, match=pattern):
            save_dataset(good, target)
    assert _files(out) == []


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"n_actions": 0}, r"n_actions must be >= 1, got 0"),
        ({"n_actions": 2.0}, r"n_actions must be an integer"),
        ({"n_actions": True}, r"n_actions must be an integer"),
        ({"reward_range": (0.5, 0.5)}, r"reward_range must be finite with low < high"),
        ({"reward_range": (0.0, np.inf)}, r"reward_range must be finite with low < high"),
        ({"reward_range": (0.0,)}, r"reward_range must be two numbers"),
        ({"reward_range": "0,1"}, r"reward_range must be two numbers"),
        ({"env_id": ""}, r"env_id must be 1 to 256 printable"),
        ({"env_id": "x" * 500}, r"env_id must be 1 to 256 printable"),
        ({"env_id": 3}, r"env_id must be a string"),
    ],
)
def test_bad_metadata(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(InvalidArgument, match=pattern) as info:
        _ds(**kwargs)
    assert len(str(info.value)) < 200  # user input echoed at most 80 characters


# -- the npz format ------------------------------------------------------------------------


def test_npz_round_trip_keeps_everything(tmp_path: Path) -> None:
    ds = collect(LW, 30, seed=5, episodes_per_user=2)
    path = tmp_path / "lw.npz"
    save_dataset(ds, path)
    assert _files(tmp_path) == ["lw.npz"]  # no temporary left behind
    back = load_dataset(path)
    assert back.fingerprint() == ds.fingerprint()
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        np.testing.assert_array_equal(getattr(back, name), getattr(ds, name))
    assert (back.n_actions, back.reward_range, back.env_id) == (2, (0.0, 0.5), LW)
    assert back.behaviour == ds.behaviour == "random"
    with np.load(path, allow_pickle=False) as z:  # the documented layout
        assert set(z.files) == {
            "user", "s", "a", "r", "s2", "terminal",
            "format", "n_actions", "reward_low", "reward_high", "env_id", "behaviour",
        }  # fmt: skip
        assert str(z["format"]) == "qveil-dataset/1" and z["user"].dtype == np.int64


def test_npz_from_another_tool_with_flat_states(tmp_path: Path) -> None:
    """Minimal file: the six arrays, s as [n], n_actions; the range comes from the caller."""
    raw = _arrays()
    np.savez(tmp_path / "ext.npz", **raw, n_actions=np.int64(2))
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        load_dataset(tmp_path / "ext.npz")
    ds = load_dataset(tmp_path / "ext.npz", reward_range=(0.0, 0.5))
    assert ds == _ds(**raw)
    np.savez(tmp_path / "declared.npz", **raw, n_actions=2, reward_low=0.0, reward_high=0.5)
    with pytest.raises(InvalidArgument, match=r"declares the reward range \[0, 0\.5\], not"):
        load_dataset(tmp_path / "declared.npz", reward_range=(0.0, 1.0))
    missing = {k: v for k, v in raw.items() if k != "terminal"}
    np.savez(tmp_path / "missing.npz", **missing, n_actions=2)
    with pytest.raises(InvalidArgument, match="lacks the array.*terminal"):
        load_dataset(tmp_path / "missing.npz", reward_range=(0.0, 0.5))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="is not an .npz file .* starts with 'not a zip'"):
        load_dataset(tmp_path / "junk.npz")
    with pytest.raises(NotFound):
        load_dataset(tmp_path / "absent.npz")
    np.savez(tmp_path / "pickled.npz", **{**raw, "r": raw["r"].astype(object)}, n_actions=2)
    with pytest.raises(InvalidArgument, match="not a readable"):  # never unpickled
        load_dataset(tmp_path / "pickled.npz", reward_range=(0.0, 0.5))


def test_npz_overwrite_is_atomic(tmp_path: Path) -> None:
    a, b = collect(LW, 3, seed=1), collect(LW, 4, seed=2)
    path = tmp_path / "d.npz"
    save_dataset(a, path)
    save_dataset(b, path)
    assert load_dataset(path) == b and _files(tmp_path) == ["d.npz"]
    with pytest.raises(NotFound):
        save_dataset(a, tmp_path / "nope" / "d.npz")
    with pytest.raises(InvalidArgument, match="unknown dataset location"):
        save_dataset(a, tmp_path / "d.txt")
    with pytest.raises(InvalidArgument, match="reads CSV but does not write it"):
        save_dataset(a, tmp_path / "d.csv")


# -- the declared rewards_are_population_averages --------------------------------------------


def test_population_averages_declaration_defaults_false_and_is_validated() -> None:
    assert _ds().rewards_are_population_averages is False
    assert _ds().summary()["rewards_are_population_averages"] is False
    for ok, want in ((True, True), (np.bool_(True), True), (np.array(False), False)):
        got = _ds(rewards_are_population_averages=ok).rewards_are_population_averages
        assert got is want
    for bad in (1, 0, "yes", None, 1.0, np.array([True]), np.array(1), np.array("True")):
        with pytest.raises(InvalidArgument, match="rewards_are_population_averages must be a bool"):
            _ds(rewards_are_population_averages=bad)


def test_population_averages_declaration_is_not_in_the_fingerprint() -> None:
    """A declaration about the data, not data: the ledger keys a dataset on its fingerprint,
    so declaring it must not make the same rows a new dataset with a fresh budget."""
    declared = _ds(rewards_are_population_averages=True)
    assert declared.fingerprint() == _ds().fingerprint()


@pytest.mark.parametrize("flag", [True, False])
def test_population_averages_declaration_round_trips(tmp_path: Path, flag: bool) -> None:
    ds = _ds(env_id=LW, rewards_are_population_averages=flag)
    save_dataset(ds, tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as z:  # absent when False: old files read the same
        assert ("rewards_are_population_averages" in z.files) is flag
    back = load_dataset(tmp_path / "d.npz")
    assert back.rewards_are_population_averages is flag and back == ds
    save_dataset(back, tmp_path / "d-v0")  # Minari: under the qveil metadata key
    meta = json.loads((tmp_path / "d-v0" / "data" / "metadata.json").read_text())
    assert meta["qveil"]["rewards_are_population_averages"] is flag
    again = load_dataset(tmp_path / "d-v0")
    assert again.rewards_are_population_averages is flag and again == ds
    save_dataset(again, tmp_path / "e.npz")
    assert load_dataset(tmp_path / "e.npz").rewards_are_population_averages is flag


def test_population_averages_declaration_of_the_wrong_type_in_a_file_is_refused(
    tmp_path: Path,
) -> None:
    np.savez(
        tmp_path / "d.npz",
        **_arrays(),
        n_actions=2,
        reward_low=0.0,
        reward_high=0.5,
        rewards_are_population_averages=1,
    )
    with pytest.raises(InvalidArgument, match="rewards_are_population_averages must be a bool"):
        load_dataset(tmp_path / "d.npz")


# -- the declared population ------------------------------------------------------------------


@pytest.mark.parametrize("name", [None, "clinic-2026"])
def test_declared_population_round_trips_and_is_read_from_metadata_alone(
    tmp_path: Path, name: str | None
) -> None:
    """npz and Minari keep the declaration; ``declared_population`` reads it without the rows;
    it is not in the fingerprint (a declaration, not data)."""
    from qveil.dataset import declared_metadata

    ds = _ds(env_id=LW, population=name)
    assert ds.fingerprint() == _ds(env_id=LW).fingerprint()
    assert ds.summary()["population"] == name
    save_dataset(ds, tmp_path / "d.npz")
    assert declared_metadata(tmp_path / "d.npz").population == name
    assert load_dataset(tmp_path / "d.npz").population == name
    save_dataset(ds, tmp_path / "d-v0")
    assert declared_metadata(tmp_path / "d-v0").population == name
    assert load_dataset(tmp_path / "d-v0").population == name


@pytest.mark.parametrize("bad", ["", " x", "x ", "a\nb", "p" * 201, 3])
def test_a_bad_population_name_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="population name"):
        _ds(population=bad)


# -- Minari --------------------------------------------------------------------------------


def test_minari_round_trip_keeps_fingerprint_and_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = collect(LW, 12, seed=9, episodes_per_user=3)
    target = tmp_path / "linewalk-v0"
    save_dataset(ds, target)
    assert _files(tmp_path) == ["linewalk-v0"]
    back = load_dataset(target)
    assert back.fingerprint() == ds.fingerprint() and back.users == 12
    # it is a real Minari dataset: Minari itself loads it from its root, 36 episodes
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    m = minari.load_dataset("linewalk-v0")
    assert (m.total_episodes, m.total_steps) == (36, ds.n)
    ep = next(m.iterate_episodes())
    assert ep.observations.shape == (51, 1) and ep.infos["user"][0] == 0
    # the minari:ID form resolves under the same root, namespaces included
    save_dataset(ds, "minari:qveil/lw-v1")
    assert load_dataset("minari:qveil/lw-v1") == ds
    assert (tmp_path / "qveil" / "lw-v1" / "data" / "metadata.json").is_file()


def test_minari_cartpole_terminals_survive(tmp_path: Path) -> None:
    ds = collect("CartPole-v1", 15, seed=4, reward_range=(0.0, 1.0))
    save_dataset(ds, tmp_path / "cp-v0")
    back = load_dataset(tmp_path / "cp-v0")
    assert back == ds and back.d == 4 and back.terminal.sum() == ds.terminal.sum() > 0


def test_minari_foreign_dataset_one_user_per_episode(tmp_path: Path) -> None:
    """A dataset written by Minari's own API (no qveil metadata, no user key): each episode
    is one user, the env id comes from its env spec, the range must be given."""
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    space = gym.spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float64)
    (tmp_path / "foreign-v0").mkdir()
    storage = MinariStorage.new(
        tmp_path / "foreign-v0" / "data",
        observation_space=space,
        action_space=gym.spaces.Discrete(2),
        env_spec=gym.spec(LW),
    )
    rng = np.random.default_rng(0)
    lengths = [3, 5, 4]
    storage.update_episodes(
        [
            EpisodeBuffer(
                id=k,
                observations=rng.uniform(0, 1, (t + 1, 1)),
                actions=rng.integers(0, 2, t),
                rewards=rng.uniform(0, 0.5, t),
                terminations=np.zeros(t, bool),
                truncations=np.arange(t) == t - 1,
            )
            for k, t in enumerate(lengths)
        ]
    )
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        load_dataset(tmp_path / "foreign-v0")
    ds = load_dataset(tmp_path / "foreign-v0", reward_range=(0.0, 0.5))
    assert ds.users == 3 and ds.n == 12 and ds.env_id == LW
    np.testing.assert_array_equal(ds.user, np.repeat([0, 1, 2], lengths))
    np.testing.assert_array_equal(ds.s[1:3], ds.s2[0:2])  # consecutive observations
    with pytest.raises(InvalidArgument, match=r"r\[\d+\] = .* outside the declared reward range"):
        load_dataset(tmp_path / "foreign-v0", reward_range=(0.0, 0.1))


def test_minari_refusals(tmp_path: Path) -> None:
    ds = collect(LW, 3, seed=1)
    save_dataset(ds, tmp_path / "a-v0")
    before = sorted(p.name for p in (tmp_path / "a-v0").rglob("*"))
    with pytest.raises(FailedPrecondition, match="never overwritten"):
        save_dataset(collect(LW, 4, seed=2), tmp_path / "a-v0")
    assert sorted(p.name for p in (tmp_path / "a-v0").rglob("*")) == before
    assert load_dataset(tmp_path / "a-v0") == ds
    with pytest.raises(InvalidArgument, match="named NAME-vN"):
        save_dataset(ds, tmp_path / "noversion")
    with pytest.raises(InvalidArgument, match="bad Minari dataset id"):
        save_dataset(ds, "minari:../../etc-v0")
    with pytest.raises(InvalidArgument, match="bad Minari dataset id"):
        save_dataset(ds, "minari:/abs/etc-v0")
    with pytest.raises(NotFound, match="nothing is downloaded"):
        load_dataset(tmp_path / "absent-v0")
    # the qveil key's fingerprint catches an edited file
    meta_path = tmp_path / "a-v0" / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["qveil"]["reward_range"] = [0.0, 0.75]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IntegrityError, match="changed after it was written"):
        load_dataset(tmp_path / "a-v0")


# -- collection ----------------------------------------------------------------------------


def test_collect_is_deterministic_by_seed() -> None:
    a, b, c = collect(LW, 40, seed=7), collect(LW, 40, seed=7), collect(LW, 40, seed=8)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    # each user's data depends on (seed, user) only: a smaller run is a prefix
    small = collect(LW, 10, seed=7)
    assert small.n == 500
    np.testing.assert_array_equal(small.s, a.s[:500])
    np.testing.assert_array_equal(small.a, a.a[:500])


def test_collect_linewalk_shape() -> None:
    ds = collect(LW, 25, seed=3, episodes_per_user=2)
    assert (ds.users, ds.n, ds.d, ds.n_actions) == (25, 25 * 2 * 50, 1, 2)
    assert ds.reward_range == (0.0, 0.5) and ds.env_id == LW
    assert not ds.terminal.any()  # LineWalk only truncates (a time limit), never terminates
    np.testing.assert_array_equal(np.bincount(ds.user), np.full(25, 100))
    # within an episode the chain is consistent, and the policy is roughly uniform
    same_ep = np.ones(ds.n - 1, bool)
    same_ep[49::50] = False
    np.testing.assert_array_equal(ds.s[1:][same_ep], ds.s2[:-1][same_ep])
    assert abs(ds.a.mean() - 0.5) < 0.05  # 2500 fair coins: 5 standard deviations


def test_collect_cartpole_d4_terminal_only_on_termination() -> None:
    ds = collect("CartPole-v1", 30, seed=11, reward_range=(0.0, 1.0))
    assert ds.d == 4 and ds.users == 30 and np.all(ds.r == 1.0)
    # a random policy drops the pole long before the 500-step limit: every episode terminates,
    # exactly once, on its last row
    ends = np.flatnonzero(np.diff(ds.user))
    assert ds.terminal.sum() == 30 and ds.terminal[-1] and ds.terminal[ends].all()


def test_collect_truncation_is_not_terminal() -> None:
    """CartPole under a 5-step time limit: episodes that reach it are truncated, not terminal."""
    import gymnasium as gym

    if "qveil-test/CartPole5-v0" not in gym.registry:
        gym.register(
            id="qveil-test/CartPole5-v0",
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=5,
        )
    ds = collect("qveil-test/CartPole5-v0", 20, seed=0, reward_range=(0.0, 1.0))
    assert ds.n == 100 and not ds.terminal.any()


def test_collect_refusals() -> None:
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        collect("CartPole-v1", 3, seed=0)
    with pytest.raises(InvalidArgument, match=r"r\[0\] = 1 is outside the declared reward range"):
        collect("CartPole-v1", 3, seed=0, reward_range=(0.0, 0.5))
    with pytest.raises(InvalidArgument, match="need Discrete actions"):
        collect("Pendulum-v1", 2, seed=0, reward_range=(-17.0, 0.0))
    with pytest.raises(InvalidArgument, match="need a Box"):
        collect("FrozenLake-v1", 2, seed=0, reward_range=(0.0, 1.0))
    with pytest.raises(NotFound, match="cannot make env"):
        collect("qveil/NoSuchEnv-v0", 2, seed=0)
    for kwargs in ({"users": 0}, {"seed": -1}, {"episodes_per_user": 0}, {"users": 2.5}):
        args: dict[str, Any] = {"users": 2, "seed": 0, **kwargs}
        with pytest.raises(InvalidArgument):
            collect(LW, **args)


def test_minari_infos_user_key_groups_episodes(tmp_path: Path) -> None:
    """Three episodes written by Minari's API whose infos carry ``user``: episodes 0 and 2
    belong to user 7, so the dataset has 2 users, not 3."""
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    (tmp_path / "grouped-v0").mkdir()
    storage = MinariStorage.new(
        tmp_path / "grouped-v0" / "data",
        observation_space=gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float64),
        action_space=gym.spaces.Discrete(3, start=1),  # actions 1..3 become 0..2
    )
    rng = np.random.default_rng(1)
    owners, lengths = [7, 9, 7], [4, 2, 3]
    storage.update_episodes(
        [
            EpisodeBuffer(
                id=k,
                observations=rng.uniform(0, 1, (t + 1, 2)),
                actions=rng.integers(1, 4, t),
                rewards=rng.uniform(-1, 1, t),
                terminations=np.arange(t) == t - 1,
                truncations=np.zeros(t, bool),
                infos={"user": np.full(t + 1, owners[k])},
            )
            for k, t in enumerate(lengths)
        ]
    )
    ds = load_dataset(tmp_path / "grouped-v0", reward_range=(-1.0, 1.0))
    assert ds.users == 2 and ds.n == 9 and ds.d == 2 and ds.n_actions == 3
    np.testing.assert_array_equal(ds.user, np.repeat(owners, lengths))
    assert ds.a.min() >= 0 and ds.a.max() <= 2 and ds.terminal.sum() == 3
    assert ds.env_id is None


def test_public_surface() -> None:
    import qveil.dataset
    import qveil.trainer.collect

    assert qveil.dataset.__all__ == sorted(qveil.dataset.__all__)
    assert {"Dataset", "load_dataset", "save_dataset", "validate_arrays"} <= set(
        qveil.dataset.__all__
    )
    assert qveil.trainer.collect.__all__ == ["collect", "env_reward_range"]
    fields = [f for f in Dataset.__dataclass_fields__ if not f.startswith("_")]
    assert fields == [
        "user", "s", "a", "r", "s2", "terminal", "n_actions", "reward_range", "env_id",
        "rewards_are_population_averages", "population", "behaviour",
    ]  # fmt: skip


def test_dataset_module_imports_numpy_only() -> None:
    """qveil.dataset must not pull gymnasium or torch (the server and client import it)."""
    import subprocess
    import sys

    code = (
        "import sys, qveil.dataset; "
        "bad = [m for m in ('gymnasium', 'torch', 'minari', 'h5py') if m in sys.modules]; "
        "print(bad)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_minari_unreadable_dataset_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / ("x" * 120 + "-v0") / "data"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text('{"data_format": "hdf5"}')  # no spaces, no env spec
    with pytest.raises(InvalidArgument, match="is not a readable Minari dataset") as info:
        load_dataset(data.parent)
    assert "x" * 81 not in str(info.value)


def test_collect_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    collect(LW, 5, seed=0, progress=True)
    err = capsys.readouterr().err
    assert "collect" in err and "5/5" in err and "user" in err
    collect(LW, 5, seed=0)
    assert capsys.readouterr().err == ""
