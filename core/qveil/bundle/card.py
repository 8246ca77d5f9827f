"""The privacy card: its required keys, the public allow-list and the public/admin split, its
checksum, and the builders that copy every privacy number from the accountant's result."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from qveil.additive import StateBox
from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject, JSONValue
from qveil.noise import StateInterval
from qveil.privacy.accountant import theorem5_beta
from qveil.privacy.rkhs import optimal_beta

__all__ = [
    "CARD_KEYS",
    "CLIPPING",
    "FQI_CARD_KEYS",
    "FQI_RESULT_FIELDS",
    "KERNEL_CARD_KEYS",
    "PUBLIC_CARD_KEYS",
    "RESULT_FIELDS",
    "build_card",
    "build_kernel_fqi_card",
    "card_betas",
    "card_box",
    "card_digest",
    "is_kernel_card",
    "jsonable",
    "merge_card",
    "non_public_paths",
    "nonprivate_privacy",
    "privacy_dict",
    "public_card_of",
    "reward_bound",
    "split_card",
    "value_scale_warning",
]

#: The release's identity and what may be queried, first in every card.
_RELEASE_KEYS = ("bundle_id", "env_id", "state_interval", "actions", "hyperparameters")
#: The accountant's guarantee, in every card and every privacy result.
_GUARANTEE_KEYS = ("epsilon", "delta", "delta_total", "holds", "basis", "reason")
#: The record of the release's files and code.
_RECORD_KEYS = ("weights_sha256", "key_sha256", "created_at", "code_version", "seeded")

#: Keys every card has (CONTRACTS.md), plus ``network``, ``noise`` and ``card_sha256``.
CARD_KEYS = (
    *_RELEASE_KEYS,
    *("sigma", "beta", "k", "J", "mode"),
    *_GUARANTEE_KEYS,
    *("privacy", "privacy_params", "q_bound", "lipschitz", "assumptions", "env_fingerprint"),
    *_RECORD_KEYS,
    *("network", "card_sha256"),
)

#: Keys every fqi card has, besides the common ones.
FQI_CARD_KEYS = (
    *_RELEASE_KEYS,
    *("mode", "neighbour", "users", "reward_bound", "reward_range", "gamma", "iterations"),
    *("sup_sensitivity", "kappa", "beta", "sensitivity", "sigma"),
    *_GUARANTEE_KEYS,
    *("noise_to_value", "privacy", "privacy_params", "dataset_fingerprint", "model"),
    *_RECORD_KEYS,
    "card_sha256",
)

#: Keys a kernel estimator (fqi, d >= 1 coordinates) card has besides FQI_CARD_KEYS. Its
#: ``state_interval`` is null (``state_intervals`` names every coordinate's, d = 1 included).
KERNEL_CARD_KEYS = ("state_intervals", "betas", "dims", "clipping")

#: What ordinary clients may see: an ALLOW-LIST, the one place that says
#: what is public. A bare key is public with its whole value; ``key.sub`` makes only that
#: sub-field of a mapping public. Every entry must be a purely public parameter: a function of
#: the training configuration, the environment, the accountant, the release's random id and
#: time, and NEVER of the trained weights (tests/unit/core/test_bundle_card.py trains twice
#: and perturbs weights to check). Absent keys are skipped, so a mode whose card carries more public
#: parameters (the fqi mode: users, reward_bound, gamma, iterations, sup_sensitivity, kappa,
#: sensitivity, ...) only has to be listed here.
PUBLIC_CARD_KEYS = (
    # identity of the release: random id and time
    "bundle_id",
    "created_at",
    # what may be queried: from the configuration
    "env_id",
    "state_interval",
    "actions",
    "q_bound",
    # the accountant's result and its inputs (declared, not measured: a client can rerun it)
    "mode",
    *_GUARANTEE_KEYS,
    "neighbour",
    "sigma",
    "beta",
    "k",
    "J",
    "privacy",
    "privacy_params",
    "assumptions",
    # the declared Lipschitz bound L (an input of the accountant), never the measured ones
    "lipschitz.bound",
    "lipschitz.with_respect_to",
    "lipschitz.raw_state_bound",
    # provenance: which code, which environment, whether the noise was seeded
    "env_fingerprint",
    "code_version",
    "seeded",
    # fqi: public parameters only. Not dataset_fingerprint: a hash of the private data would
    # let anyone holding a candidate dataset confirm it exactly (it stays in the admin view).
    "users",
    "reward_bound",
    "reward_range",
    "gamma",
    "iterations",
    "sup_sensitivity",
    "kappa",
    "sensitivity",
    "noise_to_value",
    "model",
    "estimator",  # the fqi estimator's public configuration (gamma, grid, bandwidths, ...)
    # kernel estimator (d coordinates): public parameters
    "state_intervals",
    "betas",
    "dims",
    "clipping",
    # how the noise is evaluated: the keyed grid construction's public parameters
    "noise_path",
)

#: The one out-of-interval rule of every release, stated on every card (``clipping``).
CLIPPING = (
    "each state coordinate outside its public interval is clipped into it before the model "
    "and the noise see it (public post-processing)"
)

#: Top-level fqi card fields that must equal the fqi accountant's result.
FQI_RESULT_FIELDS = (
    *("mode", "neighbour"),
    *_GUARANTEE_KEYS,
    *("sigma", "beta", "kappa", "sup_sensitivity", "sensitivity", "noise_to_value"),
)


def _split_allow(keys: Sequence[str]) -> dict[str, set[str] | None]:
    """``PUBLIC_CARD_KEYS`` as {key: None (whole value) | set of public sub-keys}."""
    out: dict[str, set[str] | None] = {}
    for k in keys:
        top, _, sub = k.partition(".")
        if not sub:
            out[top] = None
        elif out.get(top, set()) is not None:
            subs = out.setdefault(top, set())
            assert subs is not None
            subs.add(sub)
    return out


def split_card(card: JSONMapping) -> tuple[JSONObject, JSONObject]:
    """(public, admin): the allow-listed part of ``card`` and everything else. A key public
    only in some sub-fields is split (e.g. lipschitz.bound public, lipschitz.measured admin).
    :func:`merge_card` (admin over public) gives the card back."""
    allow = _split_allow(PUBLIC_CARD_KEYS)
    pub: JSONObject = {}
    adm: JSONObject = {}
    for k, v in card.items():
        if k not in allow:
            adm[k] = v
        elif allow[k] is None:
            pub[k] = v
        elif isinstance(v, Mapping):
            subs = allow[k] or set()
            p = {s: x for s, x in v.items() if s in subs}
            a = {s: x for s, x in v.items() if s not in subs}
            if p:
                pub[k] = p
            if a:
                adm[k] = a
        else:
            adm[k] = v  # a value not of the allowed shape is not known to be public
    return json.loads(json.dumps(pub)), json.loads(json.dumps(adm))


def non_public_paths(card: JSONMapping) -> list[str]:
    """Fields of ``card`` the allow-list does not make public (``key`` or ``key.sub``)."""
    pub, adm = split_card(card)
    out = []
    for k, v in adm.items():
        if k in pub and isinstance(v, Mapping):
            out += [f"{k}.{s}" for s in v]
        else:
            out.append(k)
    return sorted(out)


def public_card_of(card: JSONMapping) -> JSONObject:
    """The public projection of a (full) card: :func:`split_card`'s first half."""
    return split_card(card)[0]


def merge_card(public: JSONMapping, admin: JSONMapping) -> JSONObject:
    """The full card from its two files (mappings present in both are merged one level)."""
    out = dict(public)
    for k, v in admin.items():
        if k in out and isinstance(out[k], Mapping) and isinstance(v, Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


class _ToDict(Protocol):
    def to_dict(self) -> JSONObject: ...


#: What a card builder copies the privacy numbers from: an accountant's result (its
#: ``to_dict``), or that dict as recorded.
PrivacyResult = _ToDict | JSONMapping

#: Top-level card fields that must equal the accountant's result (card key -> result key).
RESULT_FIELDS = {k: k for k in ("mode", *_GUARANTEE_KEYS, "sigma", "beta", "k")}


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def card_digest(card: JSONMapping) -> str:
    """sha256 of the card's canonical JSON without its own ``card_sha256`` field."""
    return hashlib.sha256(
        _canonical({k: v for k, v in card.items() if k != "card_sha256"})
    ).hexdigest()


def jsonable(obj: object) -> JSONValue:
    """Tuples -> lists, numpy scalars -> Python, recursively (what json.loads gives back)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def build_card(
    *,
    env_id: str,
    interval: tuple[float, float] | StateInterval,
    actions: int,
    hyperparameters: JSONMapping,
    privacy_result: PrivacyResult,
    lipschitz: float,
    seeded: bool,
    env_fingerprint: str = "",
    code_version: str = "",
    network: JSONMapping | None = None,
    assumptions: Mapping[str, Sequence[str]] | None = None,
    extra: JSONMapping | None = None,
) -> JSONObject:
    """A card from the accountant's result (``qveil.privacy.PrivacyResult``); the privacy
    numbers are copied from it, never typed. ``write_bundle`` adds bundle_id, created_at,
    weights_sha256, the measured Lipschitz constant and card_sha256."""
    pr = privacy_dict(privacy_result)
    pp = pr["params"]
    iv = interval if isinstance(interval, StateInterval) else StateInterval(*interval)
    q_bound = None
    if pr["mode"] == "output":
        q_bound = pr.get("bound")
        if q_bound is None:
            q_bound = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
    card: JSONObject = {
        "env_id": env_id,
        "state_interval": [iv.lo, iv.hi],
        "clipping": CLIPPING,
        "actions": int(actions),
        "hyperparameters": jsonable(dict(hyperparameters)),
        **{ck: pr.get(rk) for ck, rk in RESULT_FIELDS.items()},
        "J": int(pp["resets"]),
        "privacy": pr,
        "privacy_params": pp,
        "q_bound": q_bound,
        "lipschitz": {
            "bound": float(lipschitz),
            "with_respect_to": "unit state x in [0, 1]",
            "raw_state_bound": float(lipschitz) / iv.width,
        },
        "assumptions": jsonable(dict(assumptions or {"enforced": [], "assumed": []})),
        "env_fingerprint": env_fingerprint,
        "code_version": code_version,
        "seeded": bool(seeded),
        "neighbour": (
            "reward functions r, r' of one environment with ||r - r'||_inf <= "
            f"{float(pp.get('reward_sensitivity', 1.0)):g}"
        ),
        "network": jsonable(
            dict(network or {"activation": "relu", "input": "unit state x in [0, 1]"})
        ),
    }
    if extra:
        card.update(jsonable(dict(extra)))
    return card


def value_scale_warning(card: JSONMapping) -> str | None:
    """A loud warning when the release noise sigma exceeds the value scale r0 / (1 - gamma)
    (the largest |Q| a reward bound r0 allows): every answer is then mostly noise and a
    greedy policy read from the release is no better than a random one. None otherwise (or
    when the card has no reward bound / gamma)."""
    pp = card.get("privacy_params") or {}
    try:
        sigma, r0, gamma = float(card["sigma"]), float(pp["reward_bound"]), float(pp["gamma"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (0 <= gamma < 1) or r0 <= 0:
        return None
    scale = r0 / (1.0 - gamma)
    if not sigma > scale:
        return None
    return (
        f"WARNING: the release noise sigma = {sigma:.4g} exceeds the value scale "
        f"r0/(1-gamma) = {r0:g}/(1-{gamma:g}) = {scale:.4g} ({sigma / scale:.3g}x): every "
        "released Q value is mostly noise, and actions chosen from this release will be no "
        "better than random. Raise epsilon (or delta), train on more data (more samples or "
        "users), or accept that this release is for demonstration only."
    )


def nonprivate_privacy(params: JSONMapping) -> JSONObject:
    """The privacy entry of a sigma = 0 bundle (the non-private baseline): no noise, so no
    guarantee; no epsilon is shown. The accountant's ``PrivacyParams`` refuses sigma = 0, so
    ``params`` is the same field set as a plain dict. beta (needed only by a server that
    would add zero noise anyway) comes from the accountant's own formulas: Theorem 5's
    B / (4 alpha (k+1)) in paper/gdp mode, the sensitivity-minimising L / M in output mode.
    """
    pp = jsonable(dict(params))
    if pp.get("sigma") != 0:
        raise InvalidArgument(f"nonprivate_privacy needs sigma = 0, got {pp.get('sigma')!r}")
    if pp["mode"] == "output":
        bound = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
        beta = optimal_beta(sup_bound=2.0 * bound, lip_bound=2.0 * float(pp["lipschitz"]))
    else:
        bound = None
        beta = theorem5_beta(lr=float(pp["lr"]), k=float(pp["k"]), batch_size=int(pp["batch_size"]))
    d: JSONObject = {
        "mode": pp["mode"],
        "epsilon": None,
        "delta": pp["delta"],
        "delta_total": None,
        "holds": False,
        "sigma": 0.0,
        "beta": beta,
        "k": pp["k"],
        "basis": "none: sigma = 0 adds no noise (the non-private baseline)",
        "reason": "sigma = 0: no noise, hence no differential privacy",
        "params": pp,
    }
    if bound is not None:
        d["bound"] = bound
    return d


def privacy_dict(result: PrivacyResult) -> JSONObject:
    d: JSONObject = jsonable(result if isinstance(result, Mapping) else result.to_dict())
    return d


def _fqi_card_common(
    pr: JSONObject,
    hyperparameters: JSONMapping,
    dataset_fingerprint: str,
    *,
    code_version: str,
    seeded: bool,
) -> JSONObject:
    """The card fields every fqi estimator (grid or kernel) shares, copied from the
    accountant's result ``pr`` and its params."""
    pp = pr["params"]
    lo, hi = pp["reward_range"]
    return {
        "actions": int(pp["actions"]),
        "hyperparameters": jsonable(dict(hyperparameters)),
        # public: the config's values, never the data's (so a client can rerun the estimator)
        "estimator": jsonable(dict(hyperparameters)),
        **{k: pr.get(k) for k in FQI_RESULT_FIELDS},
        "users": int(pp["users"]),
        "reward_range": [float(lo), float(hi)],
        "reward_bound": reward_bound(pp),
        "gamma": float(pp["gamma"]),
        "iterations": int(pp["iterations"]),
        "privacy": pr,
        "privacy_params": pp,
        "dataset_fingerprint": str(dataset_fingerprint),
        "code_version": code_version,
        "seeded": bool(seeded),
    }


def build_kernel_fqi_card(
    *,
    env_id: str,
    state_intervals: Sequence[Sequence[float]],
    privacy_result: PrivacyResult,
    dataset_fingerprint: str,
    hyperparameters: JSONMapping,
    seeded: bool,
    code_version: str = "",
    extra: JSONMapping | None = None,
) -> JSONObject:
    """The card of a d-coordinate fqi release (kernel estimator), its privacy numbers
    copied from the kernel accountant's result (``qveil.privacy.kfqi``), never typed."""
    pr = privacy_dict(privacy_result)
    pp = pr["params"]
    box = StateBox.of([list(iv) for iv in state_intervals])
    if box.dims != int(pp["dims"]):
        raise InvalidArgument(f"{box.dims} state intervals for a d = {pp['dims']} release")
    card: JSONObject = {
        "env_id": env_id,
        "state_interval": None,
        "state_intervals": box.to_list(),
        "dims": int(pp["dims"]),
        "betas": [float(b) for b in pp["betas"]],
        "clipping": CLIPPING,
        **_fqi_card_common(
            pr, hyperparameters, dataset_fingerprint, code_version=code_version, seeded=seeded
        ),
        "model": {
            "kind": "additive",
            "dims": int(pp["dims"]),
            "inducing_points": int(pp["inducing_points"]),
            "anchor_points": int(pp["anchor_points"]),
            "lam": float(pp["lam"]),
            "input": "unit state x in [0, 1]^d (each coordinate clipped to its interval)",
        },
    }
    if extra:
        card.update(jsonable(dict(extra)))
    return card


def reward_bound(pp: JSONMapping) -> float:
    """r0 of the card: the reward scale D_T is linear in (user: max(hi,0) - min(lo,0);
    reward: hi - lo)."""
    lo, hi = (float(v) for v in pp["reward_range"])
    return max(hi, 0.0) - min(lo, 0.0) if pp["neighbour"] == "user" else hi - lo


def card_box(card: JSONMapping) -> StateBox:
    """The public per-coordinate intervals of a card: its ``state_intervals``, or the one
    ``state_interval`` of a card that names a single interval (a box of d = 1)."""
    ivs = card.get("state_intervals")
    if ivs is None:
        return StateBox((StateInterval(*card["state_interval"]),))
    return StateBox.of(ivs)


def card_betas(card: JSONMapping) -> tuple[float, ...]:
    """beta_j of the release noise, one per coordinate: the card's ``betas``, or its one
    ``beta`` for a card that names a single interval."""
    bs = card.get("betas")
    return tuple(float(b) for b in (bs if bs is not None else (card["beta"],)))


def is_kernel_card(card: JSONMapping) -> bool:
    """True for a d-coordinate (kernel estimator) fqi card."""
    pp = card.get("privacy_params")
    return card.get("mode") == "fqi" and isinstance(pp, Mapping) and pp.get("estimator") == "kernel"
