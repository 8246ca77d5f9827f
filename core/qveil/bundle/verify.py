"""A loaded bundle's verification: the card and weights checksums, the model against the card
(the kernel model's betas, the network's Lipschitz bound), and the privacy numbers recomputed
by the accountant from the card's own ``privacy_params`` (non-negotiable 6)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from qveil.bundle.card import (
    FQI_RESULT_FIELDS,
    RESULT_FIELDS,
    card_digest,
    is_kernel_card,
    jsonable,
    nonprivate_privacy,
    reward_bound,
)
from qveil.bundle.layout import ADMIN_CARD_FILE, CARD_FILE, WEIGHTS_FILE
from qveil.bundle.models import kernel_arrays, lipschitz_bound
from qveil.errors import IntegrityError
from qveil.json_types import JSONMapping, JSONObject, JSONValue
from qveil.privacy import PrivacyParams, account
from qveil.privacy.events import account_params

__all__ = ["check_digests", "check_model", "verify_privacy"]


def check_digests(card: JSONMapping, weights_sha256: str, *, where: str) -> None:
    """The card's ``card_sha256`` against its content and ``weights_sha256`` against the
    weights file's digest (checksums against accidental or careless edits, not signatures)."""
    digest = card_digest(card)
    if digest != card["card_sha256"]:
        raise IntegrityError(
            f"{where}: {CARD_FILE} or {ADMIN_CARD_FILE} was modified (card_sha256 "
            f"{card['card_sha256']!r}, content hashes to {digest!r})"
        )
    if weights_sha256 != card["weights_sha256"]:
        raise IntegrityError(
            f"{where}: {WEIGHTS_FILE} sha256 {weights_sha256} does not match "
            f"the card's weights_sha256 {card['weights_sha256']}"
        )


def check_model(card: JSONMapping, weights: Mapping[str, np.ndarray], *, where: str) -> None:
    """The model against the card, then the privacy numbers against the accountant: a kernel
    model's betas are the noise's, a network is within the Lipschitz bound L its privacy
    rests on (fqi grid models need no bound)."""
    if is_kernel_card(card):
        kb = kernel_arrays(weights)[1]
        if not _same(kb.tolist(), card.get("betas")):
            raise IntegrityError(
                f"{where}: the model's betas {kb.tolist()} are not the noise's "
                f"{card.get('betas')!r} (the release map must be in the noise kernel's RKHS)"
            )
    elif card.get("mode") != "fqi":
        declared = float(card["privacy_params"]["lipschitz"])
        bound = lipschitz_bound(weights)
        if bound > declared * (1 + 1e-9):
            raise IntegrityError(
                f"{where}: network Lipschitz bound {bound:.6g} "
                f"exceeds the L={declared:g} the privacy rests on"
            )
    verify_privacy(card)


def _same(a: JSONValue, b: JSONValue) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return bool(a == b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return fa == fb or math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-300)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _diff(a: JSONValue, b: JSONValue, prefix: str = "") -> list[str]:
    """Paths where a and b differ (for error messages)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{prefix}{k}")
            else:
                out += _diff(a[k], b[k], f"{prefix}{k}.")
        return out
    return [] if _same(a, b) else [prefix.rstrip(".") + f" (card {a!r}, recomputed {b!r})"]


def verify_privacy(card: JSONMapping) -> JSONObject:
    """Recompute the card's privacy numbers with the accountant; raise IntegrityError on any
    difference. Returns the recomputed ``PrivacyResult.to_dict()`` (for a sigma = 0 bundle:
    :func:`nonprivate_privacy`)."""
    pp = card.get("privacy_params")
    if not isinstance(pp, Mapping):
        raise IntegrityError("card: privacy_params is not an object")
    if pp.get("mode") == "fqi":
        return _verify_fqi_privacy(card, pp)
    try:
        if pp.get("sigma") == 0:
            fresh = nonprivate_privacy(pp)
        else:
            fresh = jsonable(account(PrivacyParams.from_dict(pp)).to_dict())
    except (TypeError, ValueError, KeyError) as exc:
        raise IntegrityError(f"card: privacy_params cannot be accounted: {exc}") from None
    bad = _diff(card.get("privacy"), fresh, "privacy.")
    for ck, rk in RESULT_FIELDS.items():
        if not _same(card.get(ck), fresh.get(rk)):
            bad.append(f"{ck} (card {card.get(ck)!r}, recomputed {fresh.get(rk)!r})")
    if not _same(card.get("J"), card["privacy_params"].get("resets")):
        bad.append(
            f"J (card {card.get('J')!r}, privacy_params.resets "
            f"{card['privacy_params'].get('resets')!r})"
        )
    if fresh.get("mode") == "output":
        want = fresh.get("bound")
        if want is None:
            pp = card["privacy_params"]
            want = float(pp["reward_bound"]) / (1.0 - float(pp["gamma"]))
        if not _same(card.get("q_bound"), want):
            bad.append(f"q_bound (card {card.get('q_bound')!r}, recomputed {want!r})")
    elif card.get("q_bound") is not None:
        bad.append(f"q_bound (card {card.get('q_bound')!r}, must be null outside output mode)")
    if bad:
        raise IntegrityError(
            "privacy card does not match the accountant's recomputation: " + "; ".join(bad)
        )
    return fresh


def _verify_fqi_privacy(card: JSONMapping, pp: JSONMapping) -> JSONObject:
    """verify_privacy for an fqi card: every number recomputed by the fqi accountant (kappa
    from the map's parameters, D_T from the relation, epsilon from sigma)."""
    kernel = pp.get("estimator") == "kernel"
    try:
        fresh: JSONObject = jsonable(account_params(pp).to_dict())
    except (TypeError, ValueError, KeyError) as exc:
        raise IntegrityError(f"card: privacy_params cannot be accounted: {exc}") from None
    recorded = card.get("privacy")
    if isinstance(recorded, Mapping):  # calibration's target is a record, not a result
        recorded = {k: v for k, v in recorded.items() if k != "target"}
    bad = _diff(recorded, fresh, "privacy.")
    for key in FQI_RESULT_FIELDS:
        if not _same(card.get(key), fresh.get(key)):
            bad.append(f"{key} (card {card.get(key)!r}, recomputed {fresh.get(key)!r})")
    for key, want in (
        ("users", pp["users"]),
        ("gamma", pp["gamma"]),
        ("iterations", pp["iterations"]),
        ("actions", pp["actions"]),
        ("reward_range", list(pp["reward_range"])),
        ("reward_bound", reward_bound(pp)),
    ):
        if not _same(card.get(key), want):
            bad.append(f"{key} (card {card.get(key)!r}, privacy_params {want!r})")
    model = card.get("model")
    if kernel:
        for key, want in (("betas", list(pp["betas"])), ("dims", pp["dims"])):
            if not _same(card.get(key), want):
                bad.append(f"{key} (card {card.get(key)!r}, privacy_params {want!r})")
        si = card.get("state_intervals")
        if not isinstance(si, list) or len(si) != pp["dims"]:
            bad.append("state_intervals (not one [lo, hi] per coordinate)")
        if not isinstance(model, Mapping) or any(
            model.get(k) != pp[k] for k in ("inducing_points", "anchor_points", "lam")
        ):
            bad.append("model (inducing_points, anchor_points or lam differ from privacy_params)")
    # a grid card (the retired 1-D fit; bundles an earlier version wrote still verify)
    elif not isinstance(model, Mapping) or model.get("grid_points") != pp["grid_points"]:
        bad.append("model.grid_points (differs from privacy_params.grid_points)")
    if bad:
        raise IntegrityError(
            "privacy card does not match the accountant's recomputation: " + "; ".join(bad)
        )
    return fresh
