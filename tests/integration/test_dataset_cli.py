"""`qveil dataset collect|info|convert`: output, determinism, exit code 2 with a message naming
the array and row for bad data and flags, and nothing written. The documented commands, bad
flags, a bad file and progress off a terminal run as real subprocesses; the other variations
run the same entry point in this process (cli_helpers.qveil_main)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main

from qveil.dataset import load_dataset, save_dataset
from qveil.trainer.collect import collect

LW = "qveil/LineWalk-v0"


def qveil(*argv: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``qveil dataset ARGV`` as a real subprocess (``root``: its MINARI_DATASETS_PATH)."""
    env = dict(os.environ)
    if root is not None:
        env["MINARI_DATASETS_PATH"] = str(root)
    return subprocess.run(
        [sys.executable, "-m", "qveil.cli", "dataset", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def dataset(*argv: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``qveil dataset ARGV`` through the same entry point in this process: the commands'
    variations, whose documented forms the first tests run as real subprocesses."""
    env = None if root is None else {"MINARI_DATASETS_PATH": str(root)}
    return qveil_main("dataset", *argv, env=env)


def _collect(out: Path, *extra: str, env: str = LW, users: str = "20") -> None:
    r = dataset("collect", "--env", env, "--users", users, "--seed", "4", "--out", str(out), *extra)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: ")


def test_the_documented_commands_with_relative_paths(tmp_path: Path) -> None:
    """docs/datasets.md's first block, run as written (relative paths, a fresh directory):
    every command succeeds, Minari datasets included (their parent directory is created)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    block = doc.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].split() for ln in block.splitlines()]
    commands = [c for c in commands if c and c[0] == "qveil"]
    assert any(c[1:3] == ["dataset", "convert"] for c in commands), commands
    for argv in commands:
        r = subprocess.run(
            [sys.executable, "-m", "qveil.cli", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert r.returncode == 0, (argv, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr
    assert (
        load_dataset(tmp_path / "data" / "lw-v0").fingerprint()
        == load_dataset(tmp_path / "lw.npz").fingerprint()
    )


def test_collect_then_info(tmp_path: Path) -> None:
    out = tmp_path / "lw.npz"
    _collect(out)
    ds = load_dataset(out)
    assert (ds.users, ds.n, ds.env_id) == (20, 1000, LW)
    r = dataset("info", str(out))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    counts = np.bincount(ds.a, minlength=2)
    assert "users        20\n" in text
    assert "samples      1000 (50 to 50 per user), d = 1" in text
    assert f"actions      2: 0: {counts[0]} (" in text and f", 1: {counts[1]} (" in text
    assert "reward       declared [0, 0.5], observed [" in text
    assert f"fingerprint  {ds.fingerprint()}" in text
    j = json.loads(dataset("info", str(out), "--json").stdout)
    assert j == json.loads(json.dumps(ds.summary() | {"reward_signal": True}))
    assert j["actions"] == counts.tolist() and j["reward_range"] == [0.0, 0.5]
    assert "WARNING" not in text


def test_data_without_any_reward_signal_is_said_plainly(tmp_path: Path) -> None:
    """Random-policy MountainCar never reaches the goal: every reward is -1 and no episode
    terminates, so no fit can tell the actions apart. collect and info say so (info's JSON:
    reward_signal false); CartPole's constant reward is not such a case (its terminal states
    carry the signal)."""
    mc = tmp_path / "mc.npz"
    r = dataset("collect", "--env", "MountainCar-v0", "--users", "3", "--seed", "4",
                "--reward-range=-1,0", "--out", str(mc))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "WARNING: every reward is -1 and no episode reaches a terminal state" in r.stderr
    r = dataset("info", str(mc))
    assert r.returncode == 0, r.stderr
    assert "WARNING      every reward is -1" in r.stdout and "beat a random policy" in r.stdout
    assert json.loads(dataset("info", str(mc), "--json").stdout)["reward_signal"] is False
    cp = tmp_path / "cp.npz"
    r = dataset("collect", "--env", "CartPole-v1", "--users", "3", "--seed", "4",
                "--reward-range", "0,1", "--out", str(cp))  # fmt: skip
    assert r.returncode == 0 and "WARNING" not in r.stderr, r.stderr
    assert json.loads(dataset("info", str(cp), "--json").stdout)["reward_signal"] is True


def test_collect_declares_population_averages_and_info_prints_it(tmp_path: Path) -> None:
    plain, declared = tmp_path / "plain.npz", tmp_path / "declared.npz"
    _collect(plain)
    _collect(declared, "--rewards-are-population-averages")
    assert load_dataset(plain).rewards_are_population_averages is False
    ds = load_dataset(declared)
    assert ds.rewards_are_population_averages is True
    assert ds == load_dataset(plain)  # the same rows: the declaration is not in the fingerprint
    r = dataset("info", str(plain))
    assert "rewards      not declared population averages (fqi refuses" in r.stdout
    r = dataset("info", str(declared))
    assert "rewards      declared population averages (fqi accepts" in r.stdout
    assert json.loads(dataset("info", str(declared), "--json").stdout)[
        "rewards_are_population_averages"
    ]
    # convert keeps it
    r = dataset("convert", str(declared), str(tmp_path / "declared-v0"), root=tmp_path)
    assert r.returncode == 0, r.stderr
    assert load_dataset(tmp_path / "declared-v0").rewards_are_population_averages is True


def test_collect_is_deterministic_and_k_episodes(tmp_path: Path) -> None:
    _collect(tmp_path / "a.npz")
    _collect(tmp_path / "b.npz")
    _collect(tmp_path / "k.npz", "--episodes-per-user", "3")
    a, b, k = (load_dataset(tmp_path / f"{x}.npz") for x in "abk")
    assert a.fingerprint() == b.fingerprint()
    assert k.users == 20 and k.n == 3000


def test_collect_cartpole_needs_and_takes_a_reward_range(tmp_path: Path) -> None:
    r = dataset("collect", "--env", "CartPole-v1", "--users", "5", "--seed", "0", "--out",
                str(tmp_path / "cp.npz"))  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert "declares no reward range; give one (--reward-range LO,HI" in r.stderr
    r = dataset("collect", "--env", "CartPole-v1", "--users", "5", "--seed", "0", "--out",
                str(tmp_path / "cp.npz"), "--reward-range", "0,0.5")  # fmt: skip
    assert r.returncode == 2
    assert "r[0] = 1 is outside the declared reward range [0, 0.5]" in r.stderr
    assert list(tmp_path.iterdir()) == []
    _collect(tmp_path / "cp.npz", "--reward-range", "0,1", env="CartPole-v1", users="8")
    ds = load_dataset(tmp_path / "cp.npz")
    assert ds.d == 4 and ds.users == 8 and ds.terminal.sum() == 8


# (the command's own flag checks, each: tests/unit/core/test_commands_dataset.py)
BAD_FLAGS = [
    (["--reward-range", "a,b"], "--reward-range must be LO,HI (two numbers), got 'a,b'"),
    (["--env", "qveil/NoSuch-v0"], "cannot make env 'qveil/NoSuch-v0'"),
    (["--env", "Pendulum-v1", "--reward-range", "-17,0"], "need Discrete actions"),
    (["--env", "FrozenLake-v1", "--reward-range", "0,1"], "need a Box"),
    (["--out", "{tmp}/x.txt"], "unknown dataset location"),
    (["--out", "{tmp}/noversion"], "a Minari dataset directory is named NAME-vN"),
    (["--out", "minari:../x-v0"], "bad Minari dataset id"),
]


def _collect_argv(tmp_path: Path, argv: list[str]) -> list[str]:
    base = {"--env": LW, "--users": "3", "--seed": "1", "--out": str(tmp_path / "x.npz")}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1].replace("{tmp}", str(tmp_path))
    return [f"{k}={v}" for k, v in base.items()]  # "=" keeps "-17,0" a value


@pytest.mark.parametrize(("argv", "message"), BAD_FLAGS)
def test_collect_bad_flags_exit_2_and_write_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "root"))
    r = dataset("collect", *_collect_argv(tmp_path, argv))
    code, out, err = r.returncode, r.stdout, r.stderr
    assert code == 2 and out == ""
    assert err.startswith("qveil dataset: error: ") and message in err, err
    assert [p.name for p in tmp_path.iterdir() if p.name != "root"] == []


def test_bad_flags_in_a_real_process(tmp_path: Path) -> None:
    for argv, message in (BAD_FLAGS[0], BAD_FLAGS[2]):
        r = qveil("collect", *_collect_argv(tmp_path, argv))
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.startswith("qveil dataset: error: ") and message in r.stderr
    r = qveil("collect", "--env", LW, "--users", "x", "--seed", "1", "--out", "o.npz")
    assert r.returncode == 2 and "--users: invalid int value: 'x'" in r.stderr  # argparse
    assert list(tmp_path.iterdir()) == []


def test_long_input_is_echoed_at_most_80_characters(tmp_path: Path) -> None:
    r = dataset("collect", "--env", "E" * 500, "--users", "2", "--seed", "0", "--out",
                str(tmp_path / "x.npz"))  # fmt: skip
    assert r.returncode == 2 and "EEEE" in r.stderr
    assert max(len(run) for run in re.findall("E+", r.stderr)) <= 80
    r = dataset("info", str(tmp_path / ("d" * 300 + ".npz")))
    assert r.returncode == 2 and "d" * 80 not in r.stderr


def test_existing_out_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "lw.npz"
    _collect(out)
    before = out.read_bytes()
    r = dataset("collect", "--env", LW, "--users", "3", "--seed", "9", "--out", str(out))
    assert r.returncode == 2 and "exists; pass --force" in r.stderr
    assert out.read_bytes() == before
    _collect(out, "--force", users="3")
    assert load_dataset(out).users == 3


BAD_FILES = [
    ("nan", "s[13, 0] = nan is not finite"),
    ("reward", "r[17] = 0.73 is outside the declared reward range [0, 0.5]"),
    ("action", "a[21] = 5 is outside the env's actions [0, 2)"),
    ("length", "mismatched lengths: terminal has 98 rows but a has 100 (row 98"),
]


def _bad_file(tmp_path: Path, case: str) -> Path:
    good = tmp_path / "good.npz"
    save_dataset(collect(LW, 2, seed=0), good)
    with np.load(good) as z:
        arrays = {k: z[k].copy() for k in z.files}
    good.unlink()
    arrays["s"] = arrays["s"].reshape(-1)  # a file may hold s as [n] for d = 1
    if case == "nan":
        arrays["s"][13] = np.nan
    elif case == "reward":
        arrays["r"][17] = 0.73
    elif case == "action":
        arrays["a"][21] = 5
    else:
        arrays["terminal"] = arrays["terminal"][:-2]
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    return bad


@pytest.mark.parametrize(("case", "message"), BAD_FILES)
def test_bad_file_info_and_convert_exit_2_and_write_nothing(
    tmp_path: Path, case: str, message: str
) -> None:
    bad = _bad_file(tmp_path, case)
    out = tmp_path / "out"
    out.mkdir()
    for argv in (
        ["info", str(bad)],
        ["info", str(bad), "--json"],
        ["convert", str(bad), str(out / "c.npz")],
        ["convert", str(bad), str(out / "c-v0")],
    ):
        r = dataset(*argv)
        code, stdout, err = r.returncode, r.stdout, r.stderr
        assert code == 2 and stdout == "" and message in err, err
    assert list(out.iterdir()) == []
    if case == BAD_FILES[0][0]:  # and once through a real process
        r = qveil("info", str(bad))
        assert r.returncode == 2 and r.stdout == "" and message in r.stderr, r.stderr


def test_convert_npz_minari_npz_keeps_fingerprint(tmp_path: Path) -> None:
    src = tmp_path / "lw.npz"
    _collect(src, "--episodes-per-user", "2")
    fp = load_dataset(src).fingerprint()
    for argv in (
        [str(src), str(tmp_path / "lw-v0")],
        [str(tmp_path / "lw-v0"), "minari:qveil/lw-v3"],
        ["minari:qveil/lw-v3", str(tmp_path / "back.npz")],
    ):
        r = dataset("convert", *argv, root=tmp_path / "root")
        assert r.returncode == 0, r.stderr
        assert r.stdout.rstrip().endswith(fp)
    r = dataset("info", "minari:qveil/lw-v3", "--json", root=tmp_path / "root")
    assert (
        json.loads(r.stdout)["fingerprint"]
        == fp
        == load_dataset(tmp_path / "back.npz").fingerprint()
    )
    assert json.loads(r.stdout)["users"] == 20
    r = dataset("convert", str(src), str(tmp_path / "lw-v0"))  # never overwrites a Minari dataset
    assert r.returncode == 2 and "never overwritten" in r.stderr


def test_collect_writes_minari_directly(tmp_path: Path) -> None:
    _collect(tmp_path / "walk-v0", users="6")
    ds = load_dataset(tmp_path / "walk-v0")
    assert ds.users == 6 and ds.env_id == LW


def test_collect_takes_the_reward_range_from_the_config_and_clips_on_request(
    tmp_path: Path,
) -> None:
    """Without --reward-range, `collect --config` declares the config's reward_range
    (CartPole: [0, 1]); --clip-rewards clips every reward into the declared range (LunarLander's
    rewards have no hard bound; its config declares [-100, 100])."""
    configs = Path(__file__).resolve().parents[2] / "configs"
    out = tmp_path / "cp.npz"
    r = dataset("collect", "--env", "CartPole-v1", "--users", "5", "--seed", "1",
                "--config", str(configs / "cartpole-private.toml"), "--out", str(out),
                "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert load_dataset(out).reward_range == (0.0, 1.0)
    pytest.importorskip("Box2D", reason="gymnasium[box2d] is not installed")
    lunar = tmp_path / "ll.npz"
    r = dataset("collect", "--env", "LunarLander-v3", "--users", "20", "--seed", "1",
                "--config", str(configs / "lunarlander-private.toml"), "--clip-rewards",
                "--out", str(lunar), "--no-progress")  # fmt: skip
    assert r.returncode == 0, r.stderr
    ds = load_dataset(lunar)
    assert ds.d == 8 and ds.n_actions == 4 and ds.reward_range == (-100.0, 100.0)
    assert ds.r.min() >= -100.0 and ds.r.max() <= 100.0


def test_collect_shows_progress_off_a_terminal(tmp_path: Path) -> None:
    """stderr is a pipe here (as in a log file or CI): a line per tenth of the users and at
    the end, not silence; --no-progress turns them off."""
    r = qveil("collect", "--env", LW, "--users", "500", "--seed", "1", "--out",
              str(tmp_path / "a.npz"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("collect: user ")]
    done = [int(ln.split()[2].split("/")[0]) for ln in lines]
    assert len(lines) >= 10 and done[-1] == 500, r.stderr
    steps = np.diff([0, *done])
    assert (steps > 0).all() and (steps <= 50).all(), r.stderr  # no tenth is silent
    assert lines[-1].startswith("collect: user 500/500 done (")
    r = dataset("collect", "--env", LW, "--users", "100", "--seed", "1", "--out",
                str(tmp_path / "b.npz"), "--no-progress")  # fmt: skip
    assert r.returncode == 0 and "collect: " not in r.stderr, r.stderr


def test_the_documented_table_recipes(tmp_path: Path) -> None:
    """docs/datasets.md, "Tables": its Python block (pandas, pyarrow, Polars, CSV) run as
    written on CartPole users, then its commands as written (info, train, convert)."""
    pytest.importorskip("polars")
    from server_helpers import ensure_population

    doc = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    section = doc.split("\n## Tables", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    prelude = (
        "from qveil.trainer.collect import collect\n"
        "ds = collect('CartPole-v1', 40, 1, reward_range=(0.0, 1.0))\n"
        "user, a, r, terminal, s, s2, d = ds.user, ds.a, ds.r, ds.terminal, ds.s, ds.s2, ds.d\n"
    )
    r = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    ensure_population("cartpole")
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    repo = Path(__file__).resolve().parents[2]
    for line in block.splitlines():
        argv = line.split("#", 1)[0].split()
        if not argv:
            continue
        argv = [str(repo / w) if w.startswith("configs/") else w for w in argv]
        r = subprocess.run([sys.executable, "-m", "qveil.cli", *argv[1:]], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, (argv, r.stderr[-2000:])
    twin = load_dataset(tmp_path / "cp.csv", reward_range=(0.0, 1.0), n_actions=2)
    assert load_dataset(tmp_path / "cp-qveil.parquet") == load_dataset(tmp_path / "cp.parquet")
    assert load_dataset(tmp_path / "cp.parquet").fingerprint() == twin.fingerprint()
    assert (tmp_path / "bundle" / "card.json").is_file()


def test_collect_with_a_public_behaviour_policy_records_it(tmp_path: Path) -> None:
    """--policy NAME --policy-epsilon E: the episodes of the epsilon-greedy heuristic, the
    policy recorded in the file (npz and Parquet) and printed by info; an unknown name or a
    heuristic for another env: a message, exit 2, nothing written."""
    for out in (tmp_path / "mc.npz", tmp_path / "mc.parquet"):
        r = dataset("collect", "--env", "MountainCar-v0", "--users", "3", "--seed", "4",
                    "--reward-range=-1,0", "--policy", "mountaincar-energy",
                    "--policy-epsilon", "0.3", "--out", str(out), "--no-progress")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "behaviour policy mountaincar-energy (epsilon 0.3)" in r.stdout
        info = dataset("info", str(out))
        assert "behaviour    mountaincar-energy (epsilon 0.3)" in info.stdout, info.stdout
        assert json.loads(dataset("info", str(out), "--json").stdout)["behaviour"] == (
            "mountaincar-energy (epsilon 0.3)"
        )
    assert load_dataset(tmp_path / "mc.npz") == load_dataset(tmp_path / "mc.parquet")
    assert int(load_dataset(tmp_path / "mc.npz").terminal.sum()) >= 1  # the goal is reached
    bad = tmp_path / "bad.npz"
    for flags, message in (
        (["--policy", "greedy"], "unknown behaviour policy 'greedy'"),
        (["--policy", "cartpole-balance"], "is for 4 coordinates and 2 actions"),
    ):
        r = dataset("collect", "--env", "MountainCar-v0", "--users", "2", "--seed", "4",
                    "--reward-range=-1,0", "--out", str(bad), *flags)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, (flags, r.stderr)
        assert "Traceback" not in r.stderr and not bad.exists()
