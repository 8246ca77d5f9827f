"""One Algorithm 1 training run (qveil.trainer.train): the env checked before anything is
trained or written, its fingerprint, the accountant's numbers for the run (a sigma, a target
epsilon, the non-private sigma = 0), the output refused when it exists, and the bundle
written and verified (output mode trains without noise and releases with its sigma; an
adaptive optimizer voids paper mode's guarantee)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.privacy import account
from qveil.trainer.config import TrainConfig
from qveil.trainer.train import (
    code_version,
    env_fingerprint,
    main_summary,
    make_env,
    privacy_for,
    run_training,
)
from qveil.version import __version__

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _quick_config(**changes: Any) -> TrainConfig:
    """configs/linewalk-quick.toml at 100 samples and 2 noise paths, with ``changes``."""
    cfg = TrainConfig.from_toml(CONFIGS / "linewalk-quick.toml")
    return dataclasses.replace(cfg, samples=100, resets=2, **changes)


def test_sigma_zero_bundle_says_no_guarantee(tmp_path: Path) -> None:
    cfg = _quick_config(sigma=0.0)
    out = run_training(cfg, tmp_path / "z", seed=None)
    b = load_bundle(out.path)
    assert b.card["holds"] is False and b.card["epsilon"] is None and b.sigma == 0.0
    assert b.card["seeded"] is False
    assert b.card["release_noise"]["source"] == "OS entropy"


def test_output_mode_trains_without_noise_and_releases_with_its_sigma(tmp_path: Path) -> None:
    cfg = _quick_config(mode="output", epsilon=2.0)
    card = run_training(cfg, tmp_path / "out", seed=1).card
    assert card["training_noise"]["sigma"] == 0.0 and card["training_noise"]["points"] == 0
    assert card["sigma"] == card["privacy"]["sigma"] > 0 and card["holds"] is True
    assert card["epsilon"] <= 2.0 and card["q_bound"] == pytest.approx(0.5 / (1 - 0.9))
    assert card["beta"] == card["privacy"]["beta"]


def test_adaptive_optimizer_card_says_holds_false_in_paper_mode(tmp_path: Path) -> None:
    cfg = _quick_config(optimizer="rmsprop", sigma=1.0)
    card = run_training(cfg, tmp_path / "rms", seed=1).card
    assert card["holds"] is False and "not plain SGD" in card["reason"]
    assert card["privacy_params"]["plain_sgd"] is False
    assert any(a.startswith("VIOLATED") for a in card["assumptions"]["assumed"])


def test_make_env_checks_the_spaces() -> None:
    info = make_env(_quick_config())
    try:
        assert (info.interval.lo, info.interval.hi, info.n_actions) == (0.0, 1.0, 2)
        assert info.fingerprint == env_fingerprint(_quick_config(), info.env, info.interval)
    finally:
        info.env.close()
    for change, message in (
        ({"env_id": "qveil/NoSuch-v0"}, "unknown environment 'qveil/NoSuch-v0'"),
        ({"env_kwargs": {"no_such_kwarg": 1}}, "rejects env_kwargs"),
        ({"env_id": "CartPole-v1", "env_kwargs": {}}, "needs a 1-D Box"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            make_env(_quick_config(**change))


def test_the_fingerprint_covers_the_env_kwargs() -> None:
    a, b = make_env(_quick_config()), make_env(_quick_config(env_kwargs={"episode_length": 20}))
    try:
        assert a.fingerprint.startswith("sha256:") and a.fingerprint != b.fingerprint
    finally:
        a.env.close()
        b.env.close()


def test_code_version_starts_with_the_package_version() -> None:
    assert code_version().startswith(__version__)


def test_privacy_for_a_sigma_a_target_and_none() -> None:
    with pytest.raises(InvalidArgument, match="give either a noise scale"):
        privacy_for(_quick_config(sigma=None, epsilon=None), n_actions=2)
    result, cfg = privacy_for(_quick_config(sigma=1.0), n_actions=2)
    assert not isinstance(result, dict) and result.params.actions == 2
    assert result.params.steps == cfg.planned_updates and result.sigma == 1.0
    target, tuned = privacy_for(_quick_config(mode="output", sigma=None, epsilon=2.0), n_actions=2)
    assert not isinstance(target, dict) and target.holds and target.epsilon <= 2.0
    assert account(target.params).to_dict() == target.to_dict()  # what load_bundle recomputes
    none, _ = privacy_for(_quick_config(sigma=0.0), n_actions=2)
    assert isinstance(none, dict) and none["sigma"] == 0 and none["epsilon"] is None


def test_an_existing_output_is_refused_before_training(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "kept").write_text("x")
    with pytest.raises(InvalidArgument, match="already exists and is not empty"):
        run_training(_quick_config(sigma=1.0), out)
    assert [p.name for p in out.iterdir()] == ["kept"]


def test_main_summary(tmp_path: Path) -> None:
    outcome = run_training(_quick_config(sigma=1.0), tmp_path / "b", seed=2)
    text = main_summary(outcome)
    lines = text.splitlines()
    assert lines[0] == f"bundle {outcome.card['bundle_id']} written to {outcome.path}"
    assert "mode=paper" in lines[1] and "seeded=True" in lines[1]
    assert lines[2].startswith("  holds=") and "updates on" in lines[3]
    assert load_bundle(outcome.path).card["seeded"] is True
