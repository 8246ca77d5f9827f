"""Noise audits: is every stored value intact, and is each stored path the claimed GP?

``qveil audit`` and the AuditService both return :func:`audit_store`'s report. For each release
and action of the sample-path store it checks

1. **integrity**: the store's own hash chain (``SamplePathStore.verify``), the insertion
   sequence (strictly increasing, no gaps, no duplicate state), the row count against
   ``count_points``, and the **high-water mark against the audit log**: every passing audit
   appends the sequence number and hash of each path's newest row to the admin audit log
   (:mod:`qveil.server.governance.audit_log`); a later audit fails if a path now ends *before* a
   recorded mark (logged rows deleted, or the log restored from an old copy) or if the row at a
   recorded mark has a different hash (a chain recomputed after an edit);
1b. **the key**: given the release's bundle, every logged value is recomputed from its key
   (:mod:`qveil.keyed`) at its grid index and must match to the bit; a log written by
   anything else fails here, whatever its statistics;
2. **the law of the stored values**: the points replayed in insertion order are whitened by the
   exact OU conditionals (``qveil.stats.whiten``; docs/privacy.md section 9), and the
   innovations, iid N(0, 1) under the claimed (sigma, beta), are tested by
   ``qveil.stats.normality_report`` (Kolmogorov-Smirnov, chi-square, mean and variance tests,
   with p-values);
3. **power**: the same test applied to the path as if its noise had sigma x 1.3 (the stored
   innovations multiplied by 1.3, which is exactly what a path drawn with 1.3 sigma and
   whitened with sigma looks like), and the exact power of the variance test alone against
   sigma x 1.3 at this path's size (a lower bound on the whole test's power), so a reader sees
   whether a pass means anything (a path of 30 points cannot tell sigma from 1.3 sigma).

**Pass level** (documented in docs/operations.md, "Audits"): a path passes when all four
p-values are >= ``level / P``, where ``level`` = ``qveil.stats.DEFAULT_PASS_LEVEL`` (0.001) and
P is the number of paths tested (Bonferroni). A healthy store then fails an audit with
probability <= 4 x 0.001 = 0.4 %, whatever its size. Paths with fewer than
:data:`MIN_POINTS` points are checked for integrity but not tested (reported as untested).
The audit also verifies the privacy ledger and the admin audit log chains.

The report holds no noise values (counts, hashes, p-values only); the optional plot and point
export do, and are for the auditor role.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import stats as sps
from sqlalchemy.engine import URL

from qveil.common import typing as t
from qveil.errors import InvalidArgument, QveilError
from qveil.json_types import JSONObject, JSONValue
from qveil.keyed import GRID_LEVELS, KeyedPaths
from qveil.server.governance import audit_log
from qveil.server.governance.admin_db import AdminDB, admin_db_for
from qveil.server.governance.audit_log import utc_now
from qveil.server.governance.ledger import Ledger
from qveil.server.store.base import SamplePathStore
from qveil.server.store.releases import ReleaseRecord
from qveil.stats import DEFAULT_PASS_LEVEL, normality_report, whiten

__all__ = [
    "MIN_POINTS",
    "POWER_FACTOR",
    "ActionAudit",
    "AuditReport",
    "ReleaseAudit",
    "audit_store",
    "export_report",
    "plot_paths",
    "service_report",
    "variance_test_power",
]

FloatArray = npt.NDArray[np.float64]

#: normality_report needs this many innovations.
MIN_POINTS = 20
#: The alternative the power is shown against: sigma x 1.3.
POWER_FACTOR = 1.3


def variance_test_power(n: int, *, factor: float, level: float) -> float:
    """Exact power of the two-sided variance test (sum z^2 ~ chi2_n, reject outside the central
    1 - level) when the innovations have standard deviation ``factor`` instead of 1."""
    if n <= 0:
        return 0.0
    lo = sps.chi2.ppf(level / 2.0, n)
    hi = sps.chi2.isf(level / 2.0, n)
    f2 = factor * factor
    return float(min(1.0, sps.chi2.sf(hi / f2, n) + sps.chi2.cdf(lo / f2, n)))


@dataclass
class ActionAudit:
    """Audit of one action's stored path."""

    action: int
    count: int = 0
    high_water_mark: int | None = None
    integrity_ok: bool = True
    problems: list[str] = field(default_factory=list)
    anchor: JSONObject | None = None
    stats: JSONObject | None = None
    power: JSONObject | None = None
    tested: bool = False
    stats_ok: bool = True
    head_hash: str | None = None
    #: every logged value was recomputed from the release's key
    key_checked: bool = False

    @property
    def passed(self) -> bool:
        return self.integrity_ok and self.stats_ok

    def to_dict(self) -> JSONObject:
        return asdict(self) | {"passed": self.passed}


@dataclass
class ReleaseAudit:
    """Audit of one release: its header and every action's path."""

    header: t.ReleaseHeader
    actions: list[ActionAudit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: the release's bundle was given: its logged values were checked against its key
    key_checked: bool = False

    @property
    def integrity_ok(self) -> bool:
        return not self.problems and all(a.integrity_ok for a in self.actions)

    @property
    def stats_ok(self) -> bool:
        return all(a.stats_ok for a in self.actions)

    @property
    def passed(self) -> bool:
        return self.integrity_ok and self.stats_ok

    def to_dict(self) -> JSONObject:
        return self.header.to_dict() | {
            "actions": [a.to_dict() for a in self.actions],
            "problems": list(self.problems),
            "key_checked": self.key_checked,
            "integrity_ok": self.integrity_ok,
            "stats_ok": self.stats_ok,
            "passed": self.passed,
        }


@dataclass
class AuditReport:
    """The whole audit (what ``qveil audit`` prints and exports, and AuditService returns)."""

    generated_at: str
    store: str
    level: float
    path_level: float
    releases: list[ReleaseAudit]
    ledger: JSONObject
    audit_log: JSONObject
    problems: list[str] = field(default_factory=list)
    #: Why recording this audit in the audit log failed (None: recorded, or not asked to).
    record_error: str | None = None

    @property
    def passed(self) -> bool:
        return (
            not self.problems
            and all(r.passed for r in self.releases)
            and bool(self.ledger.get("ok"))
            and bool(self.audit_log.get("ok"))
        )

    def failures(self) -> list[str]:
        """Every problem found, one line each (empty when the audit passed)."""
        out = list(self.problems)
        out += [f"ledger: {p}" for p in self.ledger.get("problems", [])]
        out += list(self.audit_log.get("problems", []))
        for r in self.releases:
            out += [f"release {r.header.release_id}: {p}" for p in r.problems]
            for a in r.actions:
                out += [f"release {r.header.release_id} action {a.action}: {p}" for p in a.problems]
        return out

    def to_dict(self) -> JSONObject:
        return {
            "kind": "qveil.audit/v1",
            "generated_at": self.generated_at,
            "store": self.store,
            "passed": self.passed,
            "pass_level": {
                "level": self.level,
                "per_path_level": self.path_level,
                "rule": "a path passes when its KS, chi-square, mean and variance p-values are "
                "all >= per_path_level = level / (paths tested) (Bonferroni); a healthy "
                "store fails with probability <= 4 x level",
                "min_points": MIN_POINTS,
            },
            "power_alternative": f"sigma x {POWER_FACTOR}",
            "releases": [r.to_dict() for r in self.releases],
            "ledger": self.ledger,
            "audit_log": self.audit_log,
            "failures": self.failures(),
            "record_error": self.record_error,
        }

    def to_json(self) -> str:
        return json.dumps(
            self.to_dict(), indent=2, sort_keys=True, allow_nan=False, default=_json_default
        )


def _json_default(o: object) -> JSONValue:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite_or_none(v: JSONValue) -> JSONValue:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ------------------------------------------------------------------------------- store access
def _records(store: SamplePathStore, release_id: str | None) -> list[ReleaseRecord]:
    if release_id is not None:
        return [store.releases.get_release(release_id)]
    return sorted(store.releases.list_releases(), key=lambda r: (str(r.created_at), r.release_id))


def _load_points(
    store: SamplePathStore, rid: str, action: int
) -> tuple[npt.NDArray[np.int64], FloatArray, FloatArray, list[str]]:
    seqs, xs, gs, hashes = [], [], [], []
    for p in store.iter_points(rid, action):
        seqs.append(int(p.seq))
        xs.append(float(p.x))
        gs.append(float(p.g))
        hashes.append(str(p.hash))
    return (
        np.asarray(seqs, dtype=np.int64),
        np.asarray(xs, dtype=np.float64),
        np.asarray(gs, dtype=np.float64),
        hashes,
    )


def _store_integrity(store: SamplePathStore, rid: str, action: int) -> list[str]:
    """The store's own verification (hash chain, gaps, duplicates) as problem lines."""
    rep = store.verify(rid, action)
    if bool(getattr(rep, "ok", False)):
        return []
    out = []
    for a in getattr(rep, "actions", ()):
        if not a.ok:
            out += [f"store verification: {p}" for p in a.problems] or ["store verification failed"]
    return out or [f"store verification failed: {rep!r}"]


def _anchors(db: AdminDB, rid: str) -> dict[int, JSONObject]:
    """The highest high-water mark per action recorded by passing audits of ``rid``."""
    best: dict[int, JSONObject] = {}
    for e in audit_log.entries(db, action="audit", target=rid):
        if e.outcome != "ok":
            continue
        for key, mark in (e.params.get("actions") or {}).items():
            try:
                a, hwm = int(key), int(mark["hwm"])
            except (KeyError, TypeError, ValueError):
                continue
            if a not in best or hwm > best[a]["hwm"]:
                best[a] = {"hwm": hwm, "hash": mark.get("hash"), "audit_seq": e.seq, "at": e.at}
    return best


def anchors_from_report(path: str | Path) -> dict[str, dict[int, JSONObject]]:
    """High-water marks per release and action from an exported audit report (``--export``).

    Marks recorded in the store's own audit log roll back with a whole-database restore; a
    report kept outside the store does not, so ``qveil audit --against OLD.json`` proves a
    restored store did not go back in time. Only a passing report can anchor.
    """
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot read audit report {str(path)!r}: {exc}") from None
    if not isinstance(d, dict) or d.get("kind") != "qveil.audit/v1":
        raise InvalidArgument(f"{str(path)!r} is not a qveil audit report (kind qveil.audit/v1)")
    if not d.get("passed"):
        raise InvalidArgument(f"audit report {str(path)!r} did not pass; it cannot anchor")
    out: dict[str, dict[int, JSONObject]] = {}
    for r in d.get("releases", []):
        for a in r.get("actions", []):
            if a.get("high_water_mark") is None:
                continue
            out.setdefault(str(r["release_id"]), {})[int(a["action"])] = {
                "hwm": int(a["high_water_mark"]),
                "hash": a.get("head_hash"),
                "audit_seq": f"in report {Path(path).name}",
                "at": d.get("generated_at"),
            }
    return out


def _merge_anchors(
    mine: dict[int, JSONObject], other: dict[int, JSONObject] | None
) -> dict[int, JSONObject]:
    """Per action, the anchor with the higher high-water mark."""
    merged = dict(mine)
    for a, anchor in (other or {}).items():
        if a not in merged or anchor["hwm"] > merged[a]["hwm"]:
            merged[a] = anchor
    return merged


# ------------------------------------------------------------------------------- the audit
def _check_key(
    a: ActionAudit, paths: KeyedPaths, path: int, xs: FloatArray, gs: FloatArray
) -> None:
    """Every logged value against the release's key: recomputed exactly at its grid index
    (:class:`qveil.keyed.KeyedPaths`), so a value that is not the release's noise (a store
    written by anything else, an edited row) is named."""
    idx = np.rint(xs * float(2**GRID_LEVELS))
    on_grid = (idx * 2.0**-GRID_LEVELS == xs) & (xs >= 0.0) & (xs <= 1.0)
    if not on_grid.all():
        a.problems.append(f"{int((~on_grid).sum())} logged state(s) are not on the release's grid")
    want = paths.path_values(path, idx[on_grid].astype(np.uint64))
    bad = int((want != gs[on_grid]).sum())
    a.key_checked = True
    if bad:
        a.problems.append(
            f"{bad} logged value(s) differ from the release's noise recomputed from its key "
            "(the log was written by something else, or edited)"
        )


def _audit_action(
    store: SamplePathStore,
    rec: ReleaseRecord,
    action: int,
    anchor: JSONObject | None,
    paths: KeyedPaths | None = None,
) -> tuple[ActionAudit, FloatArray | None]:
    a = ActionAudit(action=action)
    seqs, xs, gs, hashes = _load_points(store, rec.release_id, action)
    a.count = int(seqs.size)
    a.high_water_mark = int(seqs[-1]) if seqs.size else None
    a.head_hash = hashes[-1] if hashes else None
    counted = int(store.count_points(rec.release_id, action))
    if counted != a.count:
        a.problems.append(f"count_points says {counted} rows but {a.count} were read")
    if seqs.size:
        steps = np.diff(seqs)
        if (steps <= 0).any():
            i = int(np.flatnonzero(steps <= 0)[0])
            a.problems.append(
                f"insertion sequence out of order at seq {int(seqs[i + 1])} (after {int(seqs[i])})"
            )
        elif (steps != 1).any():
            i = int(np.flatnonzero(steps != 1)[0])
            a.problems.append(
                f"sequence gap: {int(seqs[i + 1]) - int(seqs[i]) - 1} row(s) "
                f"missing after seq {int(seqs[i])}"
            )
        if np.unique(xs).size != xs.size:
            a.problems.append("a state appears twice (one state must have one value)")
        if not np.isfinite(gs).all():
            a.problems.append("a stored value is not finite")
    a.problems += _store_integrity(store, rec.release_id, action)
    if paths is not None and xs.size and np.isfinite(gs).all():
        _check_key(a, paths, action, xs, gs)
    if anchor is not None:
        a.anchor = {"recorded_hwm": anchor["hwm"], "audit_entry": anchor["audit_seq"], "ok": True}
        if a.high_water_mark is None or a.high_water_mark < anchor["hwm"]:
            a.anchor["ok"] = False
            a.problems.append(
                f"high-water mark {a.high_water_mark} is below {anchor['hwm']} recorded by "
                f"audit-log entry {anchor['audit_seq']} ({anchor['at']}): stored rows were "
                "deleted or the store was restored from an older copy"
            )
        else:
            idx = np.flatnonzero(seqs == anchor["hwm"])
            if idx.size != 1 or hashes[int(idx[0])] != anchor["hash"]:
                a.anchor["ok"] = False
                a.problems.append(
                    f"the row at seq {anchor['hwm']} differs from the one recorded by audit-log "
                    f"entry {anchor['audit_seq']}"
                )
    a.integrity_ok = not a.problems
    z = None
    if a.count >= MIN_POINTS and np.isfinite(gs).all() and np.unique(xs).size == xs.size:
        order = np.argsort(seqs, kind="stable")
        z = whiten(xs[order], gs[order], beta=rec.path_beta(action), sigma=rec.sigma)
    return a, z


def _test_action(a: ActionAudit, z: FloatArray | None, path_level: float) -> None:
    if z is None:
        if a.count < MIN_POINTS:
            a.stats = {"n": a.count, "skipped": f"fewer than {MIN_POINTS} points: not tested"}
        else:
            a.stats = {"n": a.count, "skipped": "not tested: integrity failure"}
        return
    a.tested = True
    rep = normality_report(z, level=path_level)
    a.stats = {k: _finite_or_none(v) for k, v in rep.items()}
    alt = normality_report(z * POWER_FACTOR, level=path_level)
    a.power = {
        "alternative": f"sigma x {POWER_FACTOR}",
        "rescaled_min_p": min(alt["ks_p"], alt["chi2_p"], alt["mean_p"], alt["var_p"]),
        "rescaled_ks_p": alt["ks_p"],
        "rescaled_chi2_p": alt["chi2_p"],
        "rescaled_var_p": alt["var_p"],
        "rescaled_rejected": not alt["passed"],
        "variance_test_power": variance_test_power(
            int(z.size), factor=POWER_FACTOR, level=path_level
        ),
    }
    if not rep["passed"]:
        a.stats_ok = False
        a.problems.append(
            "stored values are not the claimed GP: whitened innovations fail the normality test "
            f"(ks_p={rep['ks_p']:.3g}, chi2_p={rep['chi2_p']:.3g}, mean_p={rep['mean_p']:.3g}, "
            f"var_p={rep['var_p']:.3g}, var={rep['var']:.4g}; pass level {path_level:.3g})"
        )


def audit_store(
    store: SamplePathStore,
    db: AdminDB,
    *,
    release_id: str | None = None,
    level: float = DEFAULT_PASS_LEVEL,
    record: bool = True,
    actor: str | None = None,
    store_label: str = "",
    external_anchors: dict[str, dict[int, JSONObject]] | None = None,
    keys: dict[str, KeyedPaths] | None = None,
) -> AuditReport:
    """Audit every release of ``store`` (or only ``release_id``); see the module docstring.

    ``record``: append one audit-log entry per release (outcome ok/failed; a passing audit's
    entry carries the high-water marks that later audits check). ``external_anchors`` (from
    :func:`anchors_from_report`): marks kept outside the store, checked as well; a release
    they name that the store lacks fails. ``keys``: release id -> its
    :class:`qveil.keyed.KeyedPaths` (from its bundle): every logged value of those releases
    is recomputed from the key and must match to the bit. Raises NotFound for an unknown
    ``release_id``; every finding is in the report, not raised.
    """
    if not 0.0 < level < 1.0:
        raise InvalidArgument(f"level must be in (0, 1), got {level!r}")
    actor = actor or audit_log.default_actor()
    recs = _records(store, release_id)
    pending: list[tuple[ReleaseAudit, list[tuple[ActionAudit, FloatArray | None]]]] = []
    for rec in recs:
        pending.append(
            _audit_release(
                store,
                db,
                rec,
                external=(external_anchors or {}).get(rec.release_id),
                paths=(keys or {}).get(rec.release_id),
            )
        )
    n_tested = sum(1 for _, items in pending for _, z in items if z is not None)
    path_level = level / max(1, n_tested)
    releases = []
    for ra, items in pending:
        for aa, z in items:
            _test_action(aa, z, path_level)
            ra.actions.append(aa)
        releases.append(ra)
    known = {r.release_id for r in recs}
    problems = [
        f"release {rid} is in the --against report but not in the store (restored "
        "from a copy older than the release?)"
        for rid in sorted(external_anchors or {})
        if rid not in known and (release_id is None or rid == release_id)
    ]
    problems += [
        f"a bundle of release {rid} was given (--bundle), but this audit has no log of that "
        "release: nothing was recomputed from its key (another release's bundle?)"
        for rid in sorted(keys or {})
        if rid not in known
    ]
    ledger = Ledger(db).verify().to_dict()
    log = audit_log.verify_audit_log(db).to_dict()
    report = AuditReport(
        generated_at=utc_now(),
        store=store_label,
        level=level,
        path_level=path_level,
        releases=releases,
        ledger=ledger,
        audit_log=log,
        problems=problems,
    )
    if record:
        try:
            _record(db, report, actor)
        except QveilError as exc:  # e.g. a read-only auditor account: the audit still stands
            report.record_error = (
                f"this audit was not recorded in the audit log ({exc}); "
                "its high-water marks will not anchor later audits"
            )
    return report


def _audit_release(
    store: SamplePathStore,
    db: AdminDB,
    rec: ReleaseRecord,
    *,
    external: dict[int, JSONObject] | None,
    paths: KeyedPaths | None = None,
) -> tuple[ReleaseAudit, list[tuple[ActionAudit, FloatArray | None]]]:
    """One release's integrity checks against its anchors (the audit log's, and the external
    ones when given) and, with ``paths``, its key; the statistical test runs later at the
    shared level."""
    ra = ReleaseAudit(header=rec.header())
    try:
        anchors = _anchors(db, rec.release_id)
    except QveilError as exc:
        anchors = {}
        ra.problems.append(f"cannot read audit-log anchors: {exc}")
    anchors = _merge_anchors(anchors, external)
    ra.key_checked = paths is not None
    items = []
    # a release of d coordinates has n_actions * d paths, path index
    # a * d + j, each a 1-D OU path with its own beta_j; for d = 1 path a is action a
    n_paths = int(getattr(rec, "n_paths", rec.n_actions))
    for action in range(n_paths):
        try:
            items.append(_audit_action(store, rec, action, anchors.get(action), paths))
        except QveilError as exc:
            aa = ActionAudit(action=action, integrity_ok=False, problems=[str(exc)])
            items.append((aa, None))
    extra = sorted(a for a in anchors if not 0 <= a < n_paths)
    if extra:
        ra.problems.append(f"audit log records actions {extra} the release does not have")
    return ra, items


def _record(db: AdminDB, report: AuditReport, actor: str) -> None:
    for r in report.releases:
        marks = {
            str(a.action): {"hwm": a.high_water_mark, "hash": a.head_hash, "count": a.count}
            for a in r.actions
            if a.high_water_mark is not None
        }
        ok = r.passed and bool(report.ledger.get("ok")) and bool(report.audit_log.get("ok"))
        audit_log.append(
            db,
            actor=actor,
            action="audit",
            target=r.header.release_id,
            outcome="ok" if ok else "failed",
            params={"passed": ok, "actions": marks, "per_path_level": report.path_level},
            detail=""
            if ok
            else "; ".join([*r.problems, *[p for a in r.actions for p in a.problems]])[:2000],
        )


def service_report(
    store: SamplePathStore,
    release_id: str,
    *,
    action: int | None = None,
    actor: str = "server (auditor role)",
    record: bool = True,
    paths: KeyedPaths | None = None,
) -> t.StatisticalReport:
    """The AuditService's GetStatisticalReport: :func:`audit_store` of one release (the same
    report as ``qveil audit --release ID``, in ``report``), with the per-action normality
    summary the proto carries (NaN p-values for untested paths)."""
    db = admin_db_for(store)
    url = getattr(store, "_url", None)  # a SQLAlchemy URL on an SQLStore, else absent
    label = url.render_as_string(hide_password=True) if isinstance(url, URL) else str(url or "")
    rep = audit_store(
        store,
        db,
        release_id=release_id,
        record=record,
        actor=actor,
        store_label=label,
        keys=None if paths is None else {release_id: paths},
    )
    ra = rep.releases[0]
    out = []
    for a in ra.actions:
        if action is not None and a.action != int(action):
            continue
        st = a.stats if a.tested and a.stats is not None else None
        nan = float("nan")
        out.append(
            t.ActionNormality(
                action=a.action,
                n=a.count,
                ks_p=nan if st is None else float(st["ks_p"]),
                chi2_p=nan if st is None else float(st["chi2_p"]),
                mean=nan if st is None else float(st["mean"]),
                var=nan if st is None else float(st["var"]),
                passed=a.passed,
            )
        )
    return t.StatisticalReport(
        release_id=ra.header.release_id, passed=rep.passed, actions=tuple(out), report=rep.to_dict()
    )


# ------------------------------------------------------------------------------- outputs
def export_report(report: AuditReport, path: str | Path) -> Path:
    """Write the report as JSON (no noise values)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(report.to_json() + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def plot_paths(
    store: SamplePathStore, report: AuditReport, path: str | Path, *, max_releases: int = 12
) -> Path:
    """PNG of stored noise against state, one panel per (release, action), with the claimed
    +-2 sigma band and the audit verdict in each title. Shows noise values: auditor only."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
    import matplotlib.pyplot as plt

    rels: Sequence[ReleaseAudit] = report.releases[:max_releases]
    if not rels:
        raise InvalidArgument("nothing to plot: the store has no releases")
    ncols = max(r.header.n_actions for r in rels)
    fig, axes = plt.subplots(
        len(rels), ncols, figsize=(4.2 * ncols, 3.0 * len(rels)), squeeze=False
    )
    for i, r in enumerate(rels):
        lo, hi = r.header.interval
        for j in range(ncols):
            ax = axes[i][j]
            if j >= r.header.n_actions:
                ax.axis("off")
                continue
            _, xs, gs, _ = _load_points(store, r.header.release_id, j)
            order = np.argsort(xs)
            states = lo + xs[order] * (hi - lo)
            ax.plot(states, gs[order], lw=0.8, marker=".", ms=2, color="tab:blue")
            for s in (-2.0, 2.0):
                ax.axhline(s * r.header.sigma, color="grey", ls="--", lw=0.7)
            ax.axhline(0.0, color="grey", lw=0.5)
            aa = r.actions[j] if j < len(r.actions) else None
            verdict = "?" if aa is None else ("pass" if aa.passed else "FAIL")
            p = (
                ""
                if aa is None or not aa.tested or aa.stats is None
                else (f", ks_p={aa.stats['ks_p']:.2g}")
            )
            ax.set_title(f"{r.header.release_id[:12]} a={j} n={xs.size} {verdict}{p}", fontsize=8)
            ax.set_xlabel("state")
            ax.set_ylabel("stored noise g")
            ax.set_xlim(lo, hi)
    fig.suptitle(
        f"stored noise vs state (dashed: +-2 sigma); audit "
        f"{'passed' if report.passed else 'FAILED'}",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
