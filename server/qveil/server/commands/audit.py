"""``qveil audit --store URL [--bundle DIR] [--release ID] [--plot FILE.png] [--export FILE]``.

Audits every release of the store's answer log (or one): integrity (hash chains, counts,
sequence gaps, high-water marks against the admin audit log), with ``--bundle DIR`` every logged
value of that release recomputed from its key (a mismatch fails), the statistical test of each
action's stored path (whitened innovations against N(0, 1), with p-values, the pass level and
the power against sigma x 1.3), the privacy ledger and the audit log chains. ``--plot`` draws
stored noise against state per action (PNG); ``--export`` writes the full report as JSON (the
same report the AuditService returns); ``--export-points DIR`` also exports each release's
stored points (JSONL, holds noise values: auditor only). Exit 0 when the audit passes, 1 when it
fails, 2 on a usage or access error. See docs/operations.md, "Audits"."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from qveil.cli_parser import Subcommands, add_command
from qveil.errors import InvalidArgument

if TYPE_CHECKING:  # for annotations only: this CLI module loads no server module
    from qveil.server.governance.audit import AuditReport

__all__ = ["add_parser", "run"]


def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    p = add_command(
        sub, "audit", "verify stored noise: integrity and statistical tests", __doc__, run
    )
    p.add_argument("--store", metavar="URL", help="store URL (default $QVEIL_STORE_URL)")
    p.add_argument("--release", metavar="ID", help="one release (default: every release)")
    p.add_argument("--plot", metavar="FILE.png", help="plot stored noise vs state per action")
    p.add_argument("--export", metavar="FILE", help="write the report as JSON")
    p.add_argument(
        "--export-points",
        metavar="DIR",
        help="also export each release's stored points (JSONL; noise values)",
    )
    p.add_argument(
        "--against",
        metavar="REPORT.json",
        help="also check the high-water marks of an earlier exported report kept "
        "OUTSIDE the store (catches a whole-store restore from an older copy, "
        "which rolls the in-store audit log back too)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--bundle",
        action="append",
        default=[],
        metavar="DIR",
        help="a release bundle (repeatable): every logged value of its release is "
        "recomputed from its key and must match to the bit",
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="do not append this audit (and its high-water marks) to the audit log",
    )
    return p


def _summary(report: AuditReport) -> str:
    d = report.to_dict()
    lines = [
        f"audit of {d['store']} at {d['generated_at']}: {'PASSED' if d['passed'] else 'FAILED'}",
        f"pass level: every p-value >= {d['pass_level']['per_path_level']:.3g} "
        f"(= {d['pass_level']['level']:g} / paths tested); power against "
        f"{d['power_alternative']}",
    ]
    for r in report.releases:
        lines.append(
            f"release {r.header.release_id} [{r.header.status}] sigma={r.header.sigma:.4g} "
            f"beta={r.header.beta:.4g}: {'pass' if r.passed else 'FAIL'}"
            + (
                "; every logged value recomputed from its key"
                if r.key_checked
                else "; values not recomputed (give its --bundle)"
            )
        )
        for a in r.actions:
            if a.tested and a.stats is not None and a.power is not None:
                s, pw = a.stats, a.power
                stat = (
                    f"ks_p={s['ks_p']:.3g} chi2_p={s['chi2_p']:.3g} "
                    f"mean_p={s['mean_p']:.3g} var_p={s['var_p']:.3g} var={s['var']:.3f}; "
                    f"x{1.3}: min_p={pw['rescaled_min_p']:.2g} "
                    f"{'rejected' if pw['rescaled_rejected'] else 'NOT rejected'}, "
                    f"var-test power={pw['variance_test_power']:.3f}"
                )
            else:
                stat = (a.stats or {}).get("skipped", "not tested")
            lines.append(
                f"  action {a.action}: n={a.count} hwm={a.high_water_mark} "
                f"integrity={'ok' if a.integrity_ok else 'BROKEN'}; {stat}"
            )
    lines.append(
        f"ledger: {'ok' if d['ledger']['ok'] else 'BROKEN'} "
        f"({d['ledger']['count']} rows); audit log: "
        f"{'ok' if d['audit_log']['ok'] else 'BROKEN'} "
        f"({d['audit_log']['count']} entries)"
    )
    for f in d["failures"]:
        lines.append(f"FAIL: {f}")
    if d.get("record_error"):
        lines.append(f"warning: {d['record_error']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.bundle import load_bundle
    from qveil.server.governance.admin_db import admin_db_for

    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance.audit import (
        anchors_from_report,
        audit_store,
        export_report,
        plot_paths,
    )

    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance.audit_log import default_actor

    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.store import open_store
    from qveil.server.store.export import export_release

    url = args.store or os.environ.get("QVEIL_STORE_URL")
    if not url:
        raise InvalidArgument("qveil audit needs --store URL (or $QVEIL_STORE_URL)")
    external = anchors_from_report(args.against) if args.against else None
    keys = {}
    for d in args.bundle:
        b = load_bundle(d, verify=True)
        keys[b.bundle_id] = b.noise_paths
    store = open_store(url, create=False)
    try:
        db = admin_db_for(store, url)
        try:
            report = audit_store(
                store,
                db,
                release_id=args.release,
                record=not args.no_record,
                actor=f"{default_actor()} (cli)",
                store_label=_redact(url),
                external_anchors=external,
                keys=keys,
            )
            if args.export:
                export_report(report, args.export)
            if args.plot:
                plot_paths(store, report, args.plot)
            if args.export_points:
                out = Path(args.export_points)
                out.mkdir(parents=True, exist_ok=True)
                for r in report.releases:
                    export_release(store, r.header.release_id, out / f"{r.header.release_id}.jsonl")
        finally:
            db.close()
    finally:
        store.close()
    print(report.to_json() if args.json else _summary(report))
    if args.export:
        print(f"report written to {args.export}", file=sys.stderr)
    if args.plot:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0 if report.passed else 1


def _redact(url: str) -> str:
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
