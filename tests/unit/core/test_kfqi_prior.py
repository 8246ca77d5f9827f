"""The public prior of the kernel fqi estimator (qveil.kfqi_prior): the file round trip and
its hash, the refusals (another anchor layout, other state intervals, another action count,
a value outside the Q range or not finite: refused, never clipped), the estimator with a
prior (bit for bit the same through the one-build path; a prior table equal to the default
is the default), and the accountant's record of it. D_T with a prior: the adversarial and
brute-force tests of test_kfqi.py, parametrised over PRIORS."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.errors import InvalidArgument
from qveil.kfqi import Anchors, KernelFQISpec, build_operators_nd, fitted_q_nd, iterate_q_nd
from qveil.kfqi_prior import check_prior, read_prior, values_sha256, write_prior
from qveil.privacy.events import account_params
from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi
from qveil.transitions import Transitions

SPEC = KernelFQISpec(gamma=0.5, iterations=4, betas=(2.0, 2.0), anchor_points=4, bandwidth=0.3)
INTERVALS = [[-1.0, 1.0], [0.0, 2.0]]
RR = (0.0, 1.0)  # Q range [0, 2] at gamma 0.5


def _values(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, 2.0, (SPEC.anchor_total, 2))


def _write(tmp_path: Path, values: np.ndarray, name: str = "p.npz", **changes: object) -> Path:
    kw: dict[str, object] = {
        "values": values,
        "anchors": Anchors(SPEC).points,
        "state_intervals": INTERVALS,
        "reward_range": RR,
        "gamma": SPEC.gamma,
        "origin": "test values",
        **changes,
    }
    write_prior(tmp_path / name, **kw)  # type: ignore[arg-type]
    return tmp_path / name


def test_round_trip_and_the_hash_is_of_the_values(tmp_path: Path) -> None:
    v = _values()
    p = read_prior(_write(tmp_path, v))
    assert np.array_equal(p.values, v) and p.origin == "test values"
    assert p.state_intervals == ((-1.0, 1.0), (0.0, 2.0)) and p.gamma == 0.5
    # the same values written again (another file, another origin): the same hash
    again = read_prior(_write(tmp_path, v.copy(), "q.npz", origin="elsewhere"))
    assert again.sha256 == p.sha256 == values_sha256(v)
    assert read_prior(_write(tmp_path, _values(1), "r.npz")).sha256 != p.sha256
    assert p.record() == {"sha256": p.sha256, "origin": "test values", "anchors": 16, "actions": 2}
    votes = check_prior(p, spec=SPEC, state_intervals=INTERVALS, actions=2, reward_range=RR)
    assert np.array_equal(votes, v)
    with pytest.raises(InvalidArgument, match="already exists"):
        _write(tmp_path, v)


@pytest.mark.parametrize("bad", [2.0 + 1e-9, -1e-9, float("nan"), float("inf")])
def test_a_value_outside_the_q_range_is_refused_not_clipped(tmp_path: Path, bad: float) -> None:
    """Writing refuses it (nothing written); a file holding one (written for a wider range)
    is refused by a config whose Q range it leaves; the estimator refuses the table too."""
    v = _values()
    v[5, 1] = bad
    with pytest.raises(InvalidArgument, match=r"Q range \[0, 2\].*anchor 5 action 1"):
        _write(tmp_path, v)
    assert list(tmp_path.iterdir()) == []
    if np.isfinite(bad):
        wide = read_prior(_write(tmp_path, v, reward_range=(-1.0, 2.0)))  # range [-2, 4]
        with pytest.raises(InvalidArgument, match="anchor 5 action 1"):
            check_prior(wide, spec=SPEC, state_intervals=INTERVALS, actions=2, reward_range=RR)
    u, s, a, r, s2, term = _data()
    with pytest.raises(InvalidArgument, match="anchor 5 action 1"):
        fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **_kw(), prior=v)


def test_a_prior_of_another_config_is_refused(tmp_path: Path) -> None:
    p = read_prior(_write(tmp_path, _values()))
    kw = {"state_intervals": INTERVALS, "actions": 2, "reward_range": RR}
    with pytest.raises(InvalidArgument, match="16 anchors"):
        check_prior(p, spec=dataclasses.replace(SPEC, anchor_points=5), **kw)  # type: ignore[arg-type]
    sobol = dataclasses.replace(SPEC, anchors="sobol", anchor_count=16, neighbours=4)
    with pytest.raises(InvalidArgument, match="anchors are not the config's"):
        check_prior(p, spec=sobol, **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="state intervals"):
        check_prior(p, spec=SPEC, **{**kw, "state_intervals": [[-1.0, 1.0], [0.0, 3.0]]})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="the data has 3"):
        check_prior(p, spec=SPEC, **{**kw, "actions": 3})  # type: ignore[arg-type]
    u, s, a, r, s2, term = _data()
    with pytest.raises(InvalidArgument, match=r"must be \(16, 2\)"):
        fitted_q_nd(
            Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **_kw(), prior=_values()[:8]
        )
    (tmp_path / "x.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="not a readable prior file"):
        read_prior(tmp_path / "x.npz")


def _data() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(3)
    u = np.repeat(np.arange(20), 5)
    s = rng.uniform(0, 1, (len(u), 2))
    s2 = np.clip(s + rng.normal(0, 0.1, s.shape), 0, 1)
    return u, s, rng.integers(0, 2, len(u)), rng.uniform(0, 1, len(u)), s2, np.zeros(len(u), bool)


def _kw(spec: KernelFQISpec = SPEC) -> dict[str, object]:
    return {"n_actions": 2, "reward_range": RR, "box": StateBox.of([[0.0, 1.0]] * 2), "spec": spec}


@pytest.mark.parametrize("neighbour", ["user", "reward"])
def test_the_estimator_with_a_prior(neighbour: str) -> None:
    """The one-build path (operators built once, then iterated with the prior) equals a fresh
    fit bit for bit; a prior table equal to the constant default gives the default's Q_T bit
    for bit; a non-constant prior moves Q_T only through the uncovered votes (so not at all
    when every anchor is reached)."""
    spec = dataclasses.replace(SPEC, neighbour=neighbour, default=0.0)
    u, s, a, r, s2, term = _data()
    prior = _values(4)
    fresh = fitted_q_nd(
        Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **_kw(spec), prior=prior
    )
    ops = build_operators_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **_kw(spec))  # type: ignore[arg-type]
    assert np.array_equal(iterate_q_nd(ops, spec=spec, prior=prior), fresh)
    flat = np.zeros_like(prior)
    assert np.array_equal(iterate_q_nd(ops, spec=spec, prior=flat), iterate_q_nd(ops, spec=spec))
    # per user, most users miss most anchors: the prior is voted; pooled, some sample
    # reaches every anchor of this toy, so the prior is never voted
    moved = not np.array_equal(fresh, iterate_q_nd(ops, spec=spec))
    assert moved == (neighbour == "user")


def test_the_accountant_records_the_prior_without_changing_a_number() -> None:
    kw = dict(
        neighbour="user", users=1000, reward_range=RR, gamma=0.5, iterations=4, actions=2,
        dims=2, betas=(2.0, 2.0), lam=0.2, anchor_points=4, inducing_points=4, delta=1e-5,
    )  # fmt: skip
    plain = calibrate_kernel_fqi(KernelFQIPrivacyParams(**kw), epsilon=1.0)  # type: ignore[arg-type]
    h = values_sha256(_values())
    with_prior = calibrate_kernel_fqi(
        KernelFQIPrivacyParams(**kw, prior_sha256=h),  # type: ignore[arg-type]
        epsilon=1.0,
    )
    for f in ("sigma", "epsilon", "sup_sensitivity", "sensitivity", "kappa"):
        assert getattr(with_prior, f) == getattr(plain, f), f
    assert h in with_prior.basis and "public prior" in with_prior.basis
    assert "prior" not in plain.basis and "prior_sha256" not in plain.params.to_dict()
    again = account_params(with_prior.params.to_dict())
    assert again.basis == with_prior.basis and again.sigma == with_prior.sigma
    with pytest.raises(InvalidArgument, match="64 hex digits"):
        KernelFQIPrivacyParams(**kw, prior_sha256="abc")  # type: ignore[arg-type]
