"""The Minari format of datasets (qveil.dataset_minari): a round trip keeps the fingerprint
and the users and is a real Minari dataset (Minari itself loads it); terminals survive;
datasets written by Minari's own API read one user per episode, or by their infos' user key;
refusals (overwrite, bad ids, a missing or unreadable dataset, an edited file). Real Minari
files under tmp_path, never the real home."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import LW, file_names

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.dataset import load_dataset, save_dataset
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.trainer.collect import collect


@pytest.fixture(autouse=True)
def _minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minari:ID`` locations resolve under this test's tmp_path, never the real home."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-root"))


def test_minari_round_trip_keeps_fingerprint_and_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = collect(LW, 12, seed=9, episodes_per_user=3)
    target = tmp_path / "linewalk-v0"
    save_dataset(ds, target)
    assert file_names(tmp_path) == ["linewalk-v0"]
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


def test_minari_unreadable_dataset_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / ("x" * 120 + "-v0") / "data"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text('{"data_format": "hdf5"}')  # no spaces, no env spec
    with pytest.raises(InvalidArgument, match="is not a readable Minari dataset") as info:
        load_dataset(data.parent)
    assert "x" * 81 not in str(info.value)
