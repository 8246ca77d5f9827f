"""Fitted-Q evaluation of a public policy with the fqi mode's per-user averager: the
estimate of the private off-policy evaluation (its accountant: :mod:`qveil.privacy.ope`).

On the public anchors of a :class:`qveil.kfqi.KernelFQISpec` (d >= 1; a 1-D grid config maps
onto it with its grid as the anchors), with Q_0 = 0 and the fqi operators (c_a, P_a) of the
held-out data (:func:`qveil.kfqi.build_operators_nd`, user relation):

    Q_{t+1}(., a) = c_a + gamma P_a V_t,   V_t(z) = Q_t(z, pi(z)),

T times; then each user's value at its first state s0_u, a convex combination of anchors
(:meth:`qveil.kfqi.Anchors.interp`) at the policy's action there, clipped into the Q range;
the estimate is their mean. The policy pi is public (the release's greedy actions, post-
processing of the release). Pure numpy: no I/O, no randomness (the noise is the caller's).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from qveil.additive import StateBox
from qveil.errors import InvalidArgument
from qveil.kfqi import Anchors, KernelFQISpec, build_operators_nd
from qveil.kfqi_spec import q_range
from qveil.transitions import Transitions

__all__ = ["policy_value"]

FloatArray = npt.NDArray[np.float64]
Policy = Callable[[FloatArray], npt.NDArray[np.int64]]


def policy_value(
    transitions: Transitions,
    *,
    policy: Policy,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
) -> tuple[float, FloatArray]:
    """(J, per-user values): the clipped mean over the users of the held-out ``transitions``
    of Q^pi_T at their first states (:meth:`~qveil.transitions.Transitions.first_rows`; the
    module docstring). ``policy`` maps unit states (n, d) to actions (n,)."""
    if spec.neighbour != "user":
        raise InvalidArgument("the private evaluation uses the user relation")
    rr = (float(reward_range[0]), float(reward_range[1]))
    ops = build_operators_nd(
        transitions,
        n_actions=n_actions,
        reward_range=rr,
        box=box,
        spec=spec,
    )
    anchors = Anchors(spec)
    pi_z = _actions(policy(anchors.points), anchors.count, n_actions)
    default = spec.default_value(rr)
    consts = [op.constant(default) for op in ops.actions]
    q = np.zeros((anchors.count, int(n_actions)))
    rows = np.arange(anchors.count)
    for _ in range(int(spec.iterations)):
        v = q[rows, pi_z]
        q = np.stack(
            [c + spec.gamma * (op.p @ v) for c, op in zip(consts, ops.actions, strict=True)],
            axis=1,
        )
    x0 = box.to_unit(transitions.first_rows().s, clip=True)
    a0 = _actions(policy(x0), len(x0), n_actions)
    idx, w = anchors.interp(x0)
    per_user = (w * q[idx, a0[:, None]]).sum(axis=1)
    qlo, qhi = q_range(rr, spec.gamma)
    per_user = np.clip(per_user, qlo, qhi)
    return float(per_user.mean()), per_user


def _actions(a: npt.ArrayLike, n: int, n_actions: int) -> npt.NDArray[np.int64]:
    out = np.asarray(a, dtype=np.int64).reshape(-1)
    if len(out) != n or (out < 0).any() or (out >= n_actions).any():
        raise InvalidArgument(f"the policy must return {n} actions in [0, {n_actions})")
    return out
