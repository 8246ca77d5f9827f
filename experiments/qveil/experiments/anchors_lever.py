"""``qveil experiments anchors-lever``: do anchors placed where the users are move CartPole's
private kernel fqi release at N = 1e4 users, epsilon 1 (docs/results.md 9.4)?

Under per-user averaging Q(z, a) = default + share(z, a) x (value - default): an anchor few
users reach has a diluted action gap that the noise swamps. The lever puts the K anchors
where public simulated random-policy episodes go (``anchors = "file"``,
:mod:`qveil.kfqi_anchors`): :func:`qveil.kfqi_anchors.visitation_points` (k-means, the public seed
``VISITATION_SEED``) on at most ``VISITATION_STATES`` states (the same seed) of the
``PUBLIC_USERS`` users of CartPole's own dynamics, collection seed ``PUBLIC_SEED`` (never a
seed of the private datasets: the random-policy visitation of a published simulator is
public), in the unit box of configs/cartpole-private.toml. The same anchors for every seed.

Rows: the config (the 6^4 grid, today), then the visitation layout for each K of
``COUNTS`` and each (neighbours, bandwidth) of ``TUNING`` on the tuning seed (1); on the
report seed (0) the config and, for each K, the pair that did best on seed 1. Measured as
:mod:`qveil.experiments.multid_levers` measures (the accountant's sigma, which does not
depend on the anchors; seeded in-process noise of the exact law; common episodes and noise
seeds; bootstrap CIs). "fraction" is against each row's own non-private fit and the
common random policy; "fraction_vs_config" puts the row's private return against the
config's non-private fit instead (a layout moves its own non-private fit too). The tuning
picks the pair of best private return. Datasets and anchor files are cached in
``QVEIL_LEVERS_CACHE``.

Seeds are for experiments only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qveil.additive import StateBox
from qveil.experiments._util import write_csv
from qveil.experiments.ceiling import cache_tag
from qveil.experiments.ceiling import dataset as ceiling_dataset
from qveil.experiments.multid_levers import (
    EPSILON,
    GRID,
    Sweep,
    cache_dir,
    dataset,
    load_config,
    row,
)
from qveil.experiments.prior_lever import PUBLIC_SEED
from qveil.json_types import JSONMapping, JSONObject
from qveil.kfqi_anchors import (
    VISITATION_SEED,
    VISITATION_STATES,
    read_anchors,
    visitation_points,
    write_anchors,
)

if TYPE_CHECKING:  # matplotlib loads only when a plot is drawn
    from matplotlib.artist import Artist

__all__ = ["COLUMNS", "COUNTS", "TUNING", "anchor_file", "line", "run", "visitation_config"]

USERS = 10_000
PUBLIC_USERS = 100_000
TUNE_SEED = 1
REPORT_SEED = 0
#: K of the visitation layout.
COUNTS = (256, 1296, 4096)
#: (neighbours, bandwidth) tried on the tuning seed for each K.
TUNING = ((32, 0.2), (128, 0.2), (512, 0.2))
COLUMNS = (
    "seed",
    "label",
    "anchors",
    "anchor_count",
    "neighbours",
    "bandwidth",
    "anchor_sha256",
    "users",
    "sigma",
    "releases",
    "episodes",
    "private",
    "private_lo",
    "private_hi",
    "non_private",
    "random",
    "fraction",
    "fraction_lo",
    "fraction_hi",
    "fraction_vs_config",
    "release_min",
    "release_max",
)


def anchor_file(
    count: int,
    cfg: JSONMapping,
    *,
    public_users: int = PUBLIC_USERS,
    max_states: int = VISITATION_STATES,
    env_id: str = "CartPole-v1",
    behaviour: tuple[str, float] | None = None,
) -> Path:
    """The visitation anchor file of K = ``count`` for ``cfg``'s box (cached; built from
    the public collection of ``env_id`` only, collection seed ``PUBLIC_SEED``, random-policy
    users or ``behaviour`` = (name, epsilon) users: k-means of at most ``max_states`` of its
    states)."""
    more = "" if max_states == VISITATION_STATES else f"-n{max_states}"
    env = env_id.replace("/", "_")
    who = f"{public_users}-s{PUBLIC_SEED}{cache_tag(behaviour)}"
    path = cache_dir() / f"anchors-{env}-{who}-K{count}-a{VISITATION_SEED}{more}.npz"
    if path.exists():
        return path
    ds = ceiling_dataset(env_id, public_users, PUBLIC_SEED, behaviour=behaviour)
    box = StateBox.of(cfg["state_intervals"])
    x = box.to_unit(np.asarray(ds.s, dtype=np.float64))
    pts = visitation_points(x, count, max_states=max_states)
    policy = "random-policy" if behaviour is None else f"{behaviour[0]} (epsilon {behaviour[1]:g})"
    origin = (
        f"visitation_points (k-means, seed {VISITATION_SEED}, at most {max_states} "
        f"states) of the {len(x)} states of {public_users} simulated {policy} "
        f"{env_id} users, collection seed {PUBLIC_SEED}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_anchors(path, points=pts, state_intervals=cfg["state_intervals"], origin=origin)
    return path
    ds = ceiling_dataset(env_id, public_users, PUBLIC_SEED)
    box = StateBox.of(cfg["state_intervals"])
    x = box.to_unit(np.asarray(ds.s, dtype=np.float64))
    pts = visitation_points(x, count, max_states=max_states)
    origin = (
        f"visitation_points (k-means, seed {VISITATION_SEED}, at most {max_states} "
        f"states) of the {len(x)} states of {public_users} simulated random-policy "
        f"{env_id} users, collection seed {PUBLIC_SEED}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_anchors(path, points=pts, state_intervals=cfg["state_intervals"], origin=origin)
    return path


def visitation_config(path: Path, neighbours: int, bandwidth: float) -> JSONObject:
    """The 6^4-grid config (:data:`qveil.experiments.multid_levers.GRID`) with the anchors of
    ``path``."""
    file = {"anchors": "file", "anchor_file": str(path), "neighbours": neighbours}
    return load_config(**{**GRID, **file, "bandwidth": bandwidth})


def _row(
    seed: int, label: str, cfg: JSONObject, sweep: Sweep, *, releases: int, episodes: int
) -> JSONObject:
    r = row(label, cfg, sweep, seed=seed, epsilon=EPSILON, releases=releases, episodes=episodes)
    is_file = cfg.get("anchors") == "file"
    return {
        **r,
        "anchors": cfg.get("anchors", "grid"),
        "anchor_count": (
            len(read_anchors(cfg["anchor_file"]).points)
            if is_file
            else cfg["anchor_points"] ** len(cfg["betas"])
        ),
        "neighbours": cfg["neighbours"] if is_file else "",
        "anchor_sha256": read_anchors(cfg["anchor_file"]).sha256 if is_file else "",
    }


def line(r: JSONMapping, width: int = 28) -> str:
    """One row in words (the progress line of a run)."""
    return (
        f"seed {r['seed']} {r['label']:<{width}} sigma {r['sigma']:.3g} private {r['private']:.0f} "
        f"[{r['private_lo']:.0f}, {r['private_hi']:.0f}] non-private {r['non_private']:.0f} "
        f"random {r['random']:.0f} fraction {r['fraction']:.2f} "
        f"[{r['fraction_lo']:.2f}, {r['fraction_hi']:.2f}]"
    )


def _vs(r: JSONMapping, ref: JSONMapping) -> float:
    """The row's private return as a fraction of the way from random to the CONFIG's
    non-private return (a layout moves its own non-private fit too)."""
    return float((r["private"] - ref["random"]) / (ref["non_private"] - ref["random"]))


def _label(k: int, nb: int, h: float) -> str:
    return f"visitation K={k} k={nb} h={h:g}"


def run(*, out: Path, quick: bool = False, **_: object) -> dict[str, Path]:
    """Tuning seed (R x E = 10 x 20) then report seed (20 x 30). ``--quick``: 200 private
    users, 300 public users, K = 16, seed 0, 2 x 2 (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"anchors-lever [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    base = load_config(**GRID)
    counts: tuple[int, ...]
    tuning: tuple[tuple[int, float], ...]
    if quick:
        users, public, counts, tuning = 200, 300, (16,), ((8, 0.2),)
        plan: list[tuple[int, int, int]] = [(REPORT_SEED, 2, 2)]
    else:
        users, public, counts, tuning = USERS, PUBLIC_USERS, COUNTS, TUNING
        plan = [(TUNE_SEED, 10, 20), (REPORT_SEED, 20, 30)]
    files = {k: anchor_file(k, base, public_users=public) for k in counts}
    for k, f in files.items():
        say(f"anchors K={k}: sha256 {read_anchors(f).sha256}")
    rows: list[JSONObject] = []
    best: dict[int, tuple[int, float]] = {}
    for seed, rel, eps in plan:
        sweep = Sweep(dataset(users, seed), progress=say)
        kw = {"releases": rel, "episodes": eps}
        rows.append(_row(seed, "config (6^4 grid)", base, sweep, **kw))
        ref = rows[-1]
        ref["fraction_vs_config"] = ref["fraction"]
        say(line(rows[-1]))
        tuned = seed == TUNE_SEED or quick
        for k in counts:
            # k nearest of K anchors: k > K reaches them all, as k = K does
            pairs = (
                tuple(dict.fromkeys((min(nb, k), h) for nb, h in tuning)) if tuned else (best[k],)
            )
            got = []
            for nb, h in pairs:
                rows.append(_row(seed, _label(k, nb, h), visitation_config(files[k], nb, h),
                                 sweep, **kw))  # fmt: skip
                rows[-1]["fraction_vs_config"] = _vs(rows[-1], ref)
                got.append((rows[-1]["private"], (nb, h)))
                say(line(rows[-1]))
            if tuned:
                best[k] = max(got)[1]
    paths = {"csv": write_csv(out / "anchors_lever.csv", rows, COLUMNS)}
    paths["png"] = _plot(rows, out / "anchors_lever.png")
    say(f"{len(rows)} rows")
    return paths


def _plot(rows: list[JSONObject], path: Path) -> Path:
    """Private return against k (neighbours), one line per K, beside the config's band;
    one panel per collection seed (tuning, then report)."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    seeds = sorted({int(r["seed"]) for r in rows}, key=lambda s: s != TUNE_SEED)
    fig, axes = plt.subplots(1, len(seeds), figsize=(5.5 * len(seeds), 4.2), squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=True):
        rs = [r for r in rows if int(r["seed"]) == seed]
        for r in (r for r in rs if r["anchors"] != "file"):
            ax.axhspan(r["private_lo"], r["private_hi"], color="0.85", label="config 95% CI")
            ax.axhline(r["private"], color="0.3", ls="--", label="config (6^4 grid)")
            ax.axhline(r["non_private"], color="0.3", ls=":", label="config non-private")
        counts = sorted({int(r["anchor_count"]) for r in rs if r["anchors"] == "file"})
        for i, k in enumerate(counts):
            sel = sorted(
                (r for r in rs if r["anchors"] == "file" and int(r["anchor_count"]) == k),
                key=lambda r: int(r["neighbours"]),
            )
            x = np.array([int(r["neighbours"]) for r in sel], dtype=float)
            y = np.array([r["private"] for r in sel])
            lo = np.array([r["private_lo"] for r in sel])
            hi = np.array([r["private_hi"] for r in sel])
            ax.errorbar(x, y, yerr=np.stack([y - lo, hi - y]), marker="osd^v"[i % 5],
                        capsize=3, label=f"visitation anchors, K = {k}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k, nearest anchors a sample reaches (bandwidth 0.2)")
        ax.set_ylabel("private return, 95% CI (CartPole-v1, max 500)")
        ax.set_title(f"collection seed {seed} ({'tuning' if seed == TUNE_SEED else 'report'})")
        ax.grid(alpha=0.3)
    uniq: dict[str, Artist] = {}  # legend label -> its handle
    for ax in axes[0]:
        for hh, ll in zip(*ax.get_legend_handles_labels(), strict=True):
            uniq.setdefault(ll, hh)
    fig.legend(uniq.values(), uniq.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle("CartPole-v1, 1e4 users, epsilon 1: anchors where public simulated users go")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
