"""Kernel fitted-Q iteration for states with d coordinates, then subspace kernel ridge
regression onto the additive RKHS of the noise (docs/privacy.md section 2.6).

**Step 1: an averager FQI (Ormoneit & Sen 2002; Gordon 1995).** States are clipped into the
public per-coordinate box and mapped onto [0, 1]^d (public post-processing). Per action a,
on the public product grid Z = {z_k} of G points per coordinate (K = G^d anchors),

    Q_{t+1}(z_k, a) = (1/N) sum_u A_u[y](z_k),   y_i = r_i + gamma (1 - terminal_i) V_t(s'_i),  (1)

with Q_0 = 0, V_t = max_b Q_t(., b) at the anchors, multilinearly interpolated at the next
states s'_i (a convex combination of 2^d anchors), and A_u user u's vote: the mean over
u's k_u episodes e (:func:`episode_votes`) of A_{u,e}, the Nadaraya-Watson average over
episode e's samples of action a with the product Gaussian kernel

    w(z, s) = prod_j exp(-(z_j - s_j)^2 / (2 h^2)) 1{|z_j - s_j| <= R h}   (unit coordinates),

or the public default where none of the episode's samples reaches z_k. So what a user's vote
estimates does not depend on how many episodes the user has (more episodes average out
noise; pooling them into one NW average would instead raise the share of anchors a user
reaches and change the estimand: measured in docs/results.md section 9). With one episode
per user the same D_T holds (docs/privacy.md section 2.5, equations 2-3;
:func:`qveil.privacy.fqi.sup_sensitivity`): each
Q_{t+1}(z_k, a) is a convex combination of targets and public constants, user u's term
(weight 1/N, itself a mean of convex combinations) depends on u's data only, and V_t enters
through convex combinations (gamma-contraction in sup norm).
``neighbour = "reward"`` pools the NW weights over all samples of the action.

The sample's next state enters the fixed point through interpolation rather than through a
NW evaluation at every next state (the exact Ormoneit-Sen scheme): with per-user
normalisation the exact scheme costs (number of next states) x (samples within the kernel
radius), which at N = 1e5 CartPole users is ~1e11 pairs for a bandwidth wide enough for one
user's episode to cover a useful part of the box. The grid form costs (samples) x (anchors
within the radius) to build, once: equation (1) is affine in V_t, Q_{t+1}(., a) =
c_a + gamma P_a V_t with P_a sparse (K x K), built once and iterated T times.

**Step 2: the public linear map L into the additive RKHS** of
K(x, y) = sum_j exp(-beta_j |x_j - y_j|) (the noise kernel, same beta_j). Per action,

    L v = c0 + argmin_{f in S} (1/K) sum_k (f(z_k) - (v_k - c0))^2 + lam N(f)^2,           (2)

S = span{exp(-beta_j |x_j - u_jl|): coordinate j, inducing point u_jl on a per-coordinate
grid of M points} (a Nystrom-type subspace), f = sum_j sum_l alpha_jl k_j(x_j, u_jl),
N(f)^2 = sum_j alpha_j^T K_j(u_j, u_j) alpha_j >= ||f||_H^2 (docs/privacy.md 2.6), c0 the
public centre. The fit points are the public anchors, so L is fixed and public, and
||L v - L v'||_H^2 <= ||v - v'||_inf^2 / (4 lam): kappa = 1 / (4 lam) (:func:`krr_operator`,
tested by brute force).

Pure numpy/scipy: no I/O, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from scipy import sparse

from qveil.additive import StateBox
from qveil.errors import InvalidArgument
from qveil.kfqi_spec import (
    ANCHOR_LAYOUTS,
    Anchors,
    KernelFQISpec,
    anchor_grid,
    check_in_q_range,
    multilinear_weights,
)
from qveil.transitions import Transitions

__all__ = [
    "ANCHOR_LAYOUTS",
    "Anchors",
    "AveragingOperator",
    "KernelFQIOperators",
    "KernelFQIResult",
    "KernelFQISpec",
    "ShardSums",
    "add_shard_sums",
    "additive_features",
    "anchor_grid",
    "episode_votes",
    "averaging_operators_nd",
    "build_operators_nd",
    "fitted_q_nd",
    "fold_tree",
    "iterate_q_nd",
    "kernel_fqi",
    "krr_operator",
    "krr_result",
    "krr_quadratic_form_nd",
    "multilinear_weights",
    "operators_from_sums",
    "shard_denominators",
    "shard_sums",
]

FloatArray = npt.NDArray[np.float64]
T = TypeVar("T")
IntArray = npt.NDArray[np.int64]

#: Budget of (samples x candidate anchors) per chunk when building the operators.
_PAIRS = 1 << 22
#: Budget of (users x anchors) per chunk (the per-user NW denominators).
_USER_CELLS = 1 << 22


@dataclass(frozen=True)
class AveragingOperator:
    """One action's equation (1) before gamma, T and the public default are chosen:
    Q_{t+1}(., a) = c(default) + gamma P V_t on the anchors.

    ``c_sum`` and ``covered`` hold the data part of c: with per-user averaging
    c = (c_sum + (users - covered) default) / users (``covered[k]``: the vote mass reaching
    anchor k, each user's reaching episodes weighted 1 / k_u; the rest votes the default);
    pooled, c = c_sum where some sample reaches the anchor and the default elsewhere. P
    does not depend on the default."""

    c_sum: FloatArray
    covered: FloatArray
    users: int
    per_user: bool
    p: sparse.csr_matrix

    def constant(self, default: float | FloatArray) -> FloatArray:
        """c of equation (1) for the public ``default``: a constant, or one value per
        anchor (a public prior's column, :mod:`qveil.kfqi_prior`); bit-identical to a build
        with it."""
        if self.per_user:
            out: FloatArray = (self.c_sum + (self.users - self.covered) * default) / self.users
            return out
        pooled: FloatArray = np.where(self.covered > 0, self.c_sum, default)
        return pooled


def _sorted_by_vote(
    x: FloatArray,
    r: FloatArray,
    x2: FloatArray,
    terminal: npt.NDArray[np.bool_],
    vote: IntArray,
    weight: FloatArray,
) -> tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.bool_], IntArray, FloatArray]:
    order = np.argsort(vote, kind="stable")
    return x[order], r[order], x2[order], terminal[order], vote[order], weight[order]


def episode_votes(transitions: Transitions) -> tuple[IntArray, FloatArray, int]:
    """The voters of the per-user averager: each user's episodes, and the weight 1 / k_u of
    each row (k_u: user u's episode count), so that a user's weights sum to one vote.

    A user's rows are taken in their order in the arrays; a row starts a new episode when
    it is the user's first row, or the user's previous row was terminal, or its state is
    not the previous row's next state. Returns (vote index per row, dense in [0, votes) and
    increasing with the dense user index, so sorting by vote keeps each user's rows in
    order; weight per row; the vote count). It depends on each user's own rows only."""
    n = transitions.n
    uid, _ = transitions.user_index()
    s, s2, term = transitions.s, transitions.s2, transitions.terminal
    order = np.argsort(uid, kind="stable")
    su = uid[order]
    new = np.ones(n, dtype=bool)
    if n > 1:
        prev, cur = order[:-1], order[1:]
        same = su[1:] == su[:-1]
        cont = same & ~term[prev] & (s[cur] == s2[prev]).all(axis=1)
        new[1:] = ~cont
    vote = np.empty(n, dtype=np.int64)
    vote[order] = np.cumsum(new) - 1
    per_user = np.bincount(su, weights=new.astype(np.float64)) if n else np.zeros(0)
    weight: FloatArray = 1.0 / per_user[uid]
    return vote, weight, int(new.sum())


def _pooled_denominators(x: FloatArray, anchors: Anchors) -> FloatArray:
    """sum_i w(z_k, x_i) over the rows (in their order, chunk by chunk): the pooled NW
    denominators of one action."""
    step = max(1, _PAIRS // anchors.per_sample)
    den = np.zeros(anchors.count)
    for lo in range(0, len(x), step):
        _, kk, ww = anchors.pairs(x[lo : lo + step])
        den += np.bincount(kk, weights=ww, minlength=anchors.count)
    return den


def _action_sums(
    x: FloatArray,
    r: FloatArray,
    x2: FloatArray,
    terminal: npt.NDArray[np.bool_],
    vote: IntArray,
    weight: FloatArray,
    *,
    votes: int,
    anchors: Anchors,
    per_user: bool,
    den_pool: FloatArray | None,
) -> tuple[FloatArray, FloatArray, sparse.csr_matrix]:
    """One action's sums over ``votes`` whole voters (rows sorted by vote index in
    [0, votes); ``weight``: each row's voter weight, 1 / k_u): the reward sum c, the covered
    mass (per-user relation: sum over voters reaching the anchor of their weight) and P
    before the division by N. Voters are taken in chunks (each voter's NW denominators
    complete within its chunk); the chunks depend on the vote count and the anchors only."""
    k_all = anchors.count
    n = len(x)
    step = max(1, _PAIRS // anchors.per_sample)
    c = np.zeros(k_all)
    covered = np.zeros(k_all)
    p_total = sparse.csr_matrix((k_all, k_all))
    bounds = np.searchsorted(vote, np.arange(votes + 1))
    u_step = max(1, min(_USER_CELLS // k_all, votes))
    u0 = 0
    while u0 < votes and n:
        u1 = min(votes, u0 + u_step)
        lo, hi = int(bounds[u0]), int(bounds[u1])
        # keep chunks within the pair budget too
        while hi - lo > step and u1 - u0 > 1:
            u1 = u0 + max(1, (u1 - u0) // 2)
            hi = int(bounds[u1])
        if hi > lo:
            rows, kk, ww = anchors.pairs(x[lo:hi])
            if per_user:
                key = (vote[lo:hi][rows] - u0) * k_all + kk
                den = np.bincount(key, weights=ww, minlength=(u1 - u0) * k_all)
                wv = weight[lo:hi][rows]
                om = ww / den[key] * wv
                # a voter's weight is the same on all its rows: reach it once per anchor
                vw = np.zeros(u1 - u0)
                vw[vote[lo:hi] - u0] = weight[lo:hi]
                covered += ((den.reshape(u1 - u0, k_all) > 0) * vw[:, None]).sum(axis=0)
            else:
                assert den_pool is not None
                om = ww / den_pool[kk]
            c += np.bincount(kk, weights=om * r[lo:hi][rows], minlength=k_all)
            cont = om * (~terminal[lo:hi])[rows]
            wmat = sparse.csr_matrix((cont, (kk, rows)), shape=(k_all, hi - lo))
            bi, bw = anchors.interp(x2[lo:hi])
            bmat = sparse.csr_matrix(
                (bw.ravel(), (np.repeat(np.arange(hi - lo), bi.shape[1]), bi.ravel())),
                shape=(hi - lo, k_all),
            )
            p_total = p_total + wmat @ bmat
        u0 = u1
    return c, covered, sparse.csr_matrix(p_total)


def _finish_action(
    c: FloatArray,
    covered: FloatArray,
    p_sum: sparse.csr_matrix,
    *,
    users: int,
    per_user: bool,
    den_pool: FloatArray | None,
) -> AveragingOperator:
    if per_user:
        p = p_sum / users
    else:
        assert den_pool is not None
        p = p_sum
        covered = (den_pool > 0).astype(np.float64)
    return AveragingOperator(
        c_sum=c, covered=covered, users=int(users), per_user=per_user, p=sparse.csr_matrix(p)
    )


def _build_action(
    x: FloatArray,
    r: FloatArray,
    x2: FloatArray,
    terminal: npt.NDArray[np.bool_],
    vote: IntArray,
    weight: FloatArray,
    *,
    votes: int,
    users: int,
    spec: KernelFQISpec,
) -> AveragingOperator:
    """The data part of one action's (c, P) (see :class:`AveragingOperator`)."""
    anchors = Anchors(spec)
    per_user = spec.neighbour == "user"
    x, r, x2, terminal, vote, weight = _sorted_by_vote(x, r, x2, terminal, vote, weight)
    den_pool = None if per_user else _pooled_denominators(x, anchors)
    c, covered, p_sum = _action_sums(
        x, r, x2, terminal, vote, weight, votes=votes, anchors=anchors, per_user=per_user,
        den_pool=den_pool,
    )  # fmt: skip
    return _finish_action(c, covered, p_sum, users=users, per_user=per_user, den_pool=den_pool)


def averaging_operators_nd(
    unit: Transitions,
    *,
    users: int,
    spec: KernelFQISpec,
    default: float,
    vote: IntArray | None = None,
    weight: FloatArray | None = None,
) -> tuple[FloatArray, sparse.csr_matrix]:
    """(c, P) of one action: Q_{t+1}(., a) = c + gamma P V_t on the anchors (equation 1),
    from that action's rows ``unit``: states and next states on the unit box, user index
    in [0, users). The voters are the users (one episode each) unless ``vote``
    and ``weight`` (:func:`episode_votes` of the whole dataset, restricted to these rows)
    are given. Rows of [P | reward weights] are convex (tested)."""
    if vote is None or weight is None:
        vote, weight = unit.user, np.ones(unit.n)
        votes = int(users)
    else:
        votes = int(vote.max()) + 1 if len(vote) else 0
    op = _build_action(
        unit.s, unit.r, unit.s2, unit.terminal, vote, weight, votes=votes, users=users, spec=spec
    )
    return op.constant(default), op.p


def _build_key(spec: KernelFQISpec) -> tuple[object, ...]:
    """What the operators depend on (not gamma, T, the default, lam, betas' values or M)."""
    layout: tuple[object, ...] = (
        ("grid", spec.anchor_points)
        if spec.anchors == "grid"
        else ("file", spec.anchor_sha256, spec.neighbours)
        if spec.anchors == "file"
        else ("sobol", spec.anchor_count, spec.neighbours)
    )
    return (*layout, spec.bandwidth, spec.kernel_radius, spec.neighbour, spec.dims)


@dataclass(frozen=True)
class KernelFQIOperators:
    """Every action's :class:`AveragingOperator`, built once from a dataset; iterate with
    :func:`iterate_q_nd` for any gamma, T and default (a lever sweep re-uses them)."""

    actions: tuple[AveragingOperator, ...]
    key: tuple[object, ...]
    reward_range: tuple[float, float]


@dataclass(frozen=True)
class ShardSums:
    """The data part of every action's operator over one shard of whole users: sums over
    the shard's users, so two shards' sums add (:func:`add_shard_sums`) and the operators
    of the whole dataset follow from the total (:func:`operators_from_sums`). Also the
    shard's user and sample counts, and ``clipped``: its rows whose state or next state lies
    outside the box (clipped into it)."""

    users: int
    samples: int
    clipped: int
    c_sum: tuple[FloatArray, ...]
    covered: tuple[FloatArray, ...]
    p_sum: tuple[sparse.csr_matrix, ...]


def add_shard_sums(left: ShardSums, right: ShardSums) -> ShardSums:
    """The sums of two disjoint shards (elementwise ``left + right``)."""
    if len(left.c_sum) != len(right.c_sum):
        raise InvalidArgument("shard sums of different action counts do not add")
    return ShardSums(
        users=left.users + right.users,
        samples=left.samples + right.samples,
        clipped=left.clipped + right.clipped,
        c_sum=tuple(a + b for a, b in zip(left.c_sum, right.c_sum, strict=True)),
        covered=tuple(a + b for a, b in zip(left.covered, right.covered, strict=True)),
        p_sum=tuple(sparse.csr_matrix(a + b) for a, b in zip(left.p_sum, right.p_sum, strict=True)),
    )


def fold_tree(items: Iterable[T], add: Callable[[T, T], T]) -> T:
    """Sum ``items`` in a fixed binary tree that depends on their count only: adjacent
    pairs in order, then pairs of pairs (a binary counter: item i is combined as soon as its
    sibling subtree is complete, so a lazy producer can interleave the map and the
    reduction), and the leftover partial subtrees right to left. One item is returned as
    is. Whoever computes the additions (this process, or tasks on a cluster), the same
    items give the same bits."""
    stack: list[tuple[int, T]] = []
    for item in items:
        level, acc = 0, item
        while stack and stack[-1][0] == level:
            _, left = stack.pop()
            acc = add(left, acc)
            level += 1
        stack.append((level, acc))
    if not stack:
        raise InvalidArgument("nothing to reduce (no shards)")
    _, acc = stack.pop()
    while stack:
        _, left = stack.pop()
        acc = add(left, acc)
    return acc


def _prepare(
    transitions: Transitions, *, reward_range: tuple[float, float], box: StateBox
) -> tuple[Transitions, int, int]:
    """The rows on the unit box (states and next states mapped, rewards clipped into the
    range, users as the dense index), the user count and the count of rows whose state or
    next state is outside the box."""
    if transitions.n == 0:
        raise InvalidArgument("fitted_q_nd: no transitions (0 rows)")
    raw, raw2 = transitions.s, transitions.s2
    lo, hi = (float(v) for v in reward_range)
    uid, n_users = transitions.user_index()
    unit = Transitions(
        user=uid,
        s=box.to_unit(raw),
        a=transitions.a,
        r=np.clip(transitions.r, lo, hi),
        s2=box.to_unit(raw2),
        terminal=transitions.terminal,
    )
    return unit, n_users, box.rows_outside(raw, raw2)


def shard_denominators(
    transitions: Transitions, *, n_actions: int, box: StateBox, spec: KernelFQISpec
) -> FloatArray:
    """(m, K): each action's pooled NW denominators over one shard (the ``reward``
    relation's first pass; the shards' denominators add)."""
    anchors = Anchors(spec)
    out = np.zeros((int(n_actions), anchors.count))
    for act in range(int(n_actions)):
        rows = transitions.of_action(act)
        order = np.argsort(rows.user, kind="stable")
        out[act] = _pooled_denominators(box.to_unit(rows.s)[order], anchors)
    return out


def shard_sums(
    transitions: Transitions,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
    den_pool: FloatArray | None = None,
    on_build: Callable[[int], object] | None = None,
) -> ShardSums:
    """The map step: every action's sums over one shard of whole users (pure: arrays in,
    arrays out). A user's rows must all be in this shard (the caller's sharding guarantees
    it: per-user denominators are complete only then). The ``reward`` relation needs the
    dataset's pooled denominators ``den_pool`` ((m, K), :func:`shard_denominators` summed
    over every shard). The whole dataset as one shard gives exactly the single-process
    operators."""
    if box.dims != spec.dims:
        raise InvalidArgument(f"the state box has {box.dims} coordinates, betas {spec.dims}")
    per_user = spec.neighbour == "user"
    if not per_user and den_pool is None:
        raise InvalidArgument("the reward relation's shard sums need the pooled denominators")
    unit, n_users, clipped = _prepare(transitions, reward_range=reward_range, box=box)
    if per_user:
        vote, weight, votes = episode_votes(transitions)
    else:
        vote, weight, votes = unit.user, np.ones(unit.n), n_users
    anchors = Anchors(spec)
    cs, covs, ps = [], [], []
    for act in range(int(n_actions)):
        m = unit.a == act
        ua = unit.take(m)
        xa, ra, x2a, ta, va, wa = _sorted_by_vote(
            ua.s, ua.r, ua.s2, ua.terminal, vote[m], weight[m]
        )
        c, cov, p = _action_sums(
            xa, ra, x2a, ta, va, wa, votes=votes, anchors=anchors, per_user=per_user,
            den_pool=None if den_pool is None else den_pool[act],
        )  # fmt: skip
        cs.append(c)
        covs.append(cov)
        ps.append(p)
        if on_build is not None:
            on_build(act)
    return ShardSums(
        users=n_users,
        samples=unit.n,
        clipped=clipped,
        c_sum=tuple(cs),
        covered=tuple(covs),
        p_sum=tuple(ps),
    )


def operators_from_sums(
    sums: ShardSums,
    *,
    spec: KernelFQISpec,
    reward_range: tuple[float, float],
    den_pool: FloatArray | None = None,
) -> KernelFQIOperators:
    """The reduce step's end: the operators of equation (1) from the sums over every shard
    (per-user relation: P divided by N, the total user count)."""
    per_user = spec.neighbour == "user"
    ops = tuple(
        _finish_action(
            c,
            cov,
            p,
            users=sums.users,
            per_user=per_user,
            den_pool=None if den_pool is None else den_pool[act],
        )  # fmt: skip
        for act, (c, cov, p) in enumerate(zip(sums.c_sum, sums.covered, sums.p_sum, strict=True))
    )
    lo, hi = (float(v) for v in reward_range)
    return KernelFQIOperators(actions=ops, key=_build_key(spec), reward_range=(lo, hi))


def build_operators_nd(
    transitions: Transitions,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
    on_build: Callable[[int], object] | None = None,
) -> KernelFQIOperators:
    """The operators of equation (1) (the expensive part: samples x anchors within the
    radius); they depend on the anchors, bandwidth, radius and relation only. The whole
    dataset is one shard (:func:`shard_sums`); :mod:`qveil.trainer.distributed` builds the
    same operators from many shards."""
    if box.dims != spec.dims:
        raise InvalidArgument(f"the state box has {box.dims} coordinates, betas {spec.dims}")
    den_pool = None
    if spec.neighbour != "user":
        den_pool = shard_denominators(transitions, n_actions=n_actions, box=box, spec=spec)
    sums = shard_sums(
        transitions,
        n_actions=n_actions, reward_range=reward_range, box=box, spec=spec, den_pool=den_pool,
        on_build=on_build,
    )  # fmt: skip
    return operators_from_sums(sums, spec=spec, reward_range=reward_range, den_pool=den_pool)


def iterate_q_nd(
    ops: KernelFQIOperators,
    *,
    spec: KernelFQISpec,
    prior: FloatArray | None = None,
    on_iteration: Callable[[float], object] | None = None,
) -> FloatArray:
    """Q_T at the anchors, shape (K, m): ``spec.iterations`` steps of equation (1) from
    Q_0 = 0 with ``spec.gamma`` and the vote of an uncovering user: ``prior[k, a]`` (a
    public (K, m) table in the Q range, checked by :func:`qveil.kfqi_prior.check_prior`),
    else ``spec.default`` (checked against the Q range). The operators must have been
    built with the same anchors, bandwidth, radius and relation."""
    if ops.key != _build_key(spec):
        raise InvalidArgument(
            f"operators built for {ops.key!r:.80} do not match the spec {_build_key(spec)!r:.80}"
        )
    default = spec.default_value(ops.reward_range)
    if prior is None:
        consts = [op.constant(default) for op in ops.actions]
    else:
        votes = _prior_votes(prior, spec=spec, actions=len(ops.actions), rr=ops.reward_range)
        consts = [op.constant(votes[:, a]) for a, op in enumerate(ops.actions)]
    q = np.zeros((spec.anchor_total, len(ops.actions)))
    for _ in range(int(spec.iterations)):
        v = q.max(axis=1)
        nxt = np.stack(
            [cc + spec.gamma * (op.p @ v) for cc, op in zip(consts, ops.actions, strict=True)],
            axis=1,
        )
        if on_iteration is not None:
            on_iteration(float(np.abs(nxt - q).max()))
        q = nxt
    return q


def _prior_votes(
    prior: FloatArray, *, spec: KernelFQISpec, actions: int, rr: tuple[float, float]
) -> FloatArray:
    """``prior`` as (K, m) float64 after the checks D_T's proof needs: one value per anchor
    and action, each finite and in the Q range (InvalidArgument otherwise; never clipped)."""
    v = np.asarray(prior, dtype=np.float64)
    if v.shape != (spec.anchor_total, int(actions)):
        raise InvalidArgument(
            f"the prior must be ({spec.anchor_total}, {int(actions)}): one value per anchor "
            f"and action, got shape {v.shape}"
        )
    check_in_q_range(v, reward_range=rr, gamma=spec.gamma)
    return v


def fitted_q_nd(
    transitions: Transitions,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
    prior: FloatArray | None = None,
    on_iteration: Callable[[float], object] | None = None,
    on_build: Callable[[int], object] | None = None,
) -> FloatArray:
    """Q_T at the anchors, shape (K, m): T iterations of equation (1) from Q_0 = 0
    (:func:`build_operators_nd` then :func:`iterate_q_nd`, with the public ``prior``
    if given). ``on_iteration`` receives sup |Q_{t+1} - Q_t|; ``on_build`` each action
    built."""
    lo, hi = (float(v) for v in reward_range)
    spec.default_value((lo, hi))  # refuse a bad default before the expensive build
    if prior is not None:
        _prior_votes(prior, spec=spec, actions=int(n_actions), rr=(lo, hi))
    ops = build_operators_nd(
        transitions,
        n_actions=n_actions,
        reward_range=(lo, hi),
        box=box,
        spec=spec,
        on_build=on_build,
    )
    return iterate_q_nd(ops, spec=spec, prior=prior, on_iteration=on_iteration)


# ----------------------------------------------------------------------------- step 2: KRR
def inducing_grid(points: int) -> FloatArray:
    """The M inducing points of every coordinate: u_l = l / (M - 1)."""
    return np.linspace(0.0, 1.0, int(points))


def additive_features(x: FloatArray, betas: Sequence[float], inducing: FloatArray) -> FloatArray:
    """Phi (n, d M): Phi[i, (j, l)] = exp(-beta_j |x_ij - u_l|)."""
    b = np.asarray(betas, dtype=np.float64)
    feats = np.exp(-b[None, :, None] * np.abs(x[:, :, None] - inducing[None, None, :]))
    out: FloatArray = feats.reshape(len(x), -1)
    return out


def _penalty(betas: Sequence[float], inducing: FloatArray) -> FloatArray:
    """blockdiag_j K_j(u, u): N(f)^2 = alpha^T R alpha (equation 2)."""
    blocks = [np.exp(-float(bj) * np.abs(inducing[:, None] - inducing[None, :])) for bj in betas]
    m = len(inducing)
    out = np.zeros((m * len(blocks), m * len(blocks)))
    for j, blk in enumerate(blocks):
        out[j * m : (j + 1) * m, j * m : (j + 1) * m] = blk
    return out


def krr_operator(
    fit_points: npt.ArrayLike, *, betas: Sequence[float], inducing_points: int, lam: float
) -> FloatArray:
    """C (d M, n): alpha = C (v - c0) solves equation (2) at the n public fit points.

    The bound (docs/privacy.md 2.6): with f = L v, a = (f(x_i)) and the optimality of f
    against the direction f itself, (1/n) <a - v, a> + lam N(f)^2 = 0, so
    lam N(f)^2 = (1/n)(<a, v> - ||a||^2) <= ||v||_2^2 / (4 n) <= ||v||_inf^2 / 4, and
    ||f||_H <= N(f). Hence kappa = 1 / (4 lam) whatever the subspace or the fit points."""
    x = np.asarray(fit_points, dtype=np.float64)
    if not (math.isfinite(lam) and lam > 0):
        raise InvalidArgument(f"lam must be > 0, got {lam!r}")
    u = inducing_grid(inducing_points)
    phi = additive_features(x, betas, u)
    n = len(x)
    m = phi.T @ phi / n + lam * _penalty(betas, u)
    coef: FloatArray = np.asarray(np.linalg.lstsq(m, phi.T / n, rcond=None)[0], dtype=np.float64)
    return coef


def krr_quadratic_form_nd(
    fit_points: npt.ArrayLike, *, betas: Sequence[float], inducing_points: int, lam: float
) -> FloatArray:
    """A (n, n) with N(L v)^2 = v^T A v (for brute-force checks of kappa = 1 / (4 lam))."""
    coef = krr_operator(fit_points, betas=betas, inducing_points=inducing_points, lam=lam)
    a = coef.T @ _penalty(betas, inducing_grid(inducing_points)) @ coef
    sym: FloatArray = (a + a.T) / 2.0
    return sym


@dataclass(frozen=True)
class KernelFQIResult:
    """What training produces: the anchors' Q_T (K, m), and the released mean function's
    coefficients alpha (m, d, M) around the public centre c0."""

    q_anchors: FloatArray
    alpha: FloatArray
    centre: float
    inducing: FloatArray
    betas: tuple[float, ...]


def kernel_fqi(
    transitions: Transitions,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
    prior: FloatArray | None = None,
    on_iteration: Callable[[float], object] | None = None,
) -> KernelFQIResult:
    """Equations (1) then (2): the released mean function's coefficients (no noise). The
    KRR centre stays ``spec``'s default whether or not a ``prior`` gives the votes."""
    q = fitted_q_nd(
        transitions,
        n_actions=n_actions,
        reward_range=reward_range,
        box=box,
        spec=spec,
        prior=prior,
        on_iteration=on_iteration,
    )
    return krr_result(q, spec=spec, reward_range=reward_range)


def krr_result(
    q: FloatArray, *, spec: KernelFQISpec, reward_range: tuple[float, float]
) -> KernelFQIResult:
    """Equation (2) for Q_T at the anchors (K, m): the released mean's coefficients."""
    c0 = spec.default_value(reward_range)
    coef = krr_operator(
        Anchors(spec).points,
        betas=spec.betas,
        inducing_points=spec.inducing_points,
        lam=spec.lam,
    )
    alpha = (coef @ (q - c0)).T.reshape(q.shape[1], spec.dims, spec.inducing_points)
    return KernelFQIResult(
        q_anchors=q,
        alpha=alpha,
        centre=c0,
        inducing=inducing_grid(spec.inducing_points),
        betas=spec.betas,
    )


def additive_mean(
    x: FloatArray, *, alpha: FloatArray, centre: float, inducing: FloatArray, betas: Sequence[float]
) -> FloatArray:
    """f_a(x) = c0 + sum_j sum_l alpha[a, j, l] exp(-beta_j |x_j - u_l|): (n, m) at unit x."""
    phi = additive_features(np.asarray(x, dtype=np.float64), betas, inducing)
    out: FloatArray = centre + phi @ alpha.reshape(alpha.shape[0], -1).T
    return out
