"""``qveil admin``: retrain under the privacy ledger, list, activate, retire, budgets.

    qveil admin retrain --config FILE --dataset-id ID [--epsilon E | --sigma S] [--activate]
    qveil admin releases | activate ID | retire ID | budget [--dataset-id ID]
    qveil admin set-cap --dataset-id ID --epsilon E --delta D
    qveil admin ledger          (privacy spending per dataset, and the composition rule)
    qveil admin log [--limit N]
    qveil admin init-store
    qveil admin export-release ID --out FILE | import-release FILE

Only ``init-store`` creates a store; every other operation refuses a store that does not exist.
``export-release`` / ``import-release`` copy a release's answer log (every logged point) to
another store; the source keeps its log, and a server on either store answers the same
values, since every copy of a release answers with its key's values (docs/operations.md,
"One key per release").

Two ways to reach the releases (docs/operations.md, "Activation"):

* ``--store URL`` (or ``$QVEIL_STORE_URL``): directly on the store's database, when no server is
  running on it. ``activate`` then only records which release is active; a server started
  later serves the bundle it is started with.
* ``--target HOST:PORT --token-file F``: through a running server's AdminService (admin role),
  which loads and validates the bundle and swaps it in atomically while it keeps answering.
  ``releases``, ``activate``, ``retire`` and ``budget`` go to the server (AdminService
  GetBudget reads the ledger in the server's registry); ``retrain``, ``set-cap`` and ``log``
  always need ``--store`` (training runs here, not in the server, and writes to the ledger);
  ``retrain --activate`` then activates the new bundle through the server.

Every operation is appended to the admin audit log (who, what, when, outcome). Exit codes: 0
done, 2 refused or failed (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from qveil.bundle import load_bundle, value_scale_warning
from qveil.cli_parser import Subcommands, add_command, add_no_progress
from qveil.client.channel import TLSConfig, read_token_file
from qveil.client.sync import AdminClient
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject, JSONValue
from qveil.server.commands.flags import call_with_flags

if TYPE_CHECKING:  # for annotations only: the server modules load when an operation runs
    from qveil.server.governance.admin import AdminContext

__all__ = ["add_parser", "run"]


# The flags every operation takes: (flag, metavar, help). Suppressed when absent, so that one
# given before the operation's name is not reset by the operation's own parser.
_WHERE = (
    (
        "--store",
        "URL",
        "store URL (sqlite:///ABS/PATH or postgresql+psycopg://...); default $QVEIL_STORE_URL",
    ),
    (
        "--registry",
        "URL",
        "the registry (population ledger, receipts); default $QVEIL_REGISTRY, "
        "else $QVEIL_HOME/registry.sqlite",
    ),
    ("--target", "HOST:PORT", "a running server: go through its AdminService"),
    ("--token-file", "F", "file holding the admin token (with --target)"),
    ("--tls-ca", "PEM", "CA of the server certificate (with --target; enables TLS)"),
    ("--tls-cert", "PEM", "client certificate for mutual TLS (with --tls-ca)"),
    ("--tls-key", "PEM", "client key for mutual TLS (with --tls-ca)"),
)


def _common() -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(add_help=False)
    g = c.add_argument_group("where")
    for flag, metavar, help_ in _WHERE:
        g.add_argument(flag, metavar=metavar, default=argparse.SUPPRESS, help=help_)
    g.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    return c


def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    common = _common()
    p = add_command(
        sub,
        "admin",
        "retrain under the privacy ledger; list, activate, retire releases; budgets",
        __doc__,
        run,
        parents=[common],
    )
    ops = p.add_subparsers(dest="admin_command", metavar="OPERATION", required=True)

    r = ops.add_parser("retrain", parents=[common], help="train a new release under the ledger")
    r.add_argument("--config", required=True, metavar="FILE", help="training config (TOML)")
    r.add_argument("--dataset-id", required=True, help="dataset whose budget pays")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--epsilon", type=float, help="target epsilon (sigma calibrated)")
    g.add_argument("--sigma", type=float, help="noise scale sigma")
    r.add_argument("--delta", type=float, help="delta of the guarantee")
    r.add_argument("--mode", choices=("paper", "gdp", "output"), help="accounting mode")
    r.add_argument(
        "--out-dir",
        metavar="DIR",
        help="where the bundle directory goes (default: beside a SQLite store)",
    )
    r.add_argument("--activate", action="store_true", help="activate the new release")
    r.add_argument(
        "--budget",
        type=float,
        metavar="EPS",
        help="refuse the retrain if it would push the dataset past this epsilon",
    )
    r.add_argument("--seed", type=int, help="tests only: seeded training (card says seeded)")
    add_no_progress(r)

    ops.add_parser("releases", parents=[common], help="list releases")
    a = ops.add_parser("activate", parents=[common], help="activate a release (rollback too)")
    a.add_argument("release_id", metavar="ID")
    a.add_argument("--bundle-path", help="with --target: the bundle directory on the server")
    t = ops.add_parser("retire", parents=[common], help="retire a release for good")
    t.add_argument("release_id", metavar="ID")
    b = ops.add_parser("budget", parents=[common], help="spent, remaining and events")
    b.add_argument("--dataset-id", help="one dataset (default: all)")
    ops.add_parser(
        "ledger", parents=[common], help="privacy spending per dataset and the composition rule"
    )
    c = ops.add_parser("set-cap", parents=[common], help="set a dataset's privacy cap")
    c.add_argument("--dataset-id", required=True)
    c.add_argument("--epsilon", type=float, required=True)
    c.add_argument("--delta", type=float, required=True)
    lg = ops.add_parser("log", parents=[common], help="show the admin audit log")
    lg.add_argument("--limit", type=int, default=50)
    ops.add_parser("init-store", parents=[common], help="create a store")
    x = ops.add_parser(
        "export-release", parents=[common], help="write a release's answer log to a file"
    )
    x.add_argument("release_id", metavar="ID")
    x.add_argument("--out", required=True, metavar="FILE", help="JSON Lines file to write")
    m = ops.add_parser(
        "import-release", parents=[common], help="load an exported answer log into this store"
    )
    m.add_argument("path", metavar="FILE")
    return p


def _store_url(args: argparse.Namespace, *, required: bool) -> str | None:
    url = getattr(args, "store", None) or os.environ.get("QVEIL_STORE_URL")
    if required and not url:
        raise InvalidArgument(
            f"qveil admin {args.admin_command} needs --store URL "
            "(or $QVEIL_STORE_URL): the ledger lives in the store's database"
        )
    return url


def _admin_client(args: argparse.Namespace) -> AdminClient:
    tf = getattr(args, "token_file", None)
    ca = getattr(args, "tls_ca", None)
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if (cert is None) != (key is None):
        raise InvalidArgument("give both --tls-cert and --tls-key (mutual TLS), or neither")
    tls = TLSConfig(ca=ca, cert=cert, key=key) if (ca or cert) else None
    return AdminClient(args.target, token=read_token_file(tf) if tf else None, tls=tls)


def _finite(obj: JSONValue) -> JSONValue:
    """``obj`` with every non-finite number as None (JSON null; "-" in tables): a path that
    was never exercised is not reported as NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _print(args: argparse.Namespace, obj: JSONValue, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(_finite(obj), indent=2, sort_keys=True, default=str, allow_nan=False))
    else:
        print(text)


def _releases_table(rows: list[JSONObject]) -> str:
    if not rows:
        return "(no releases)"
    head = (
        f"{'release':34} {'status':8} {'sigma':>10} {'beta':>10} {'epsilon':>10} "
        f"{'points':>8}  dataset"
    )
    lines = [head]
    for r in map(_finite, rows):
        eps = r.get("epsilon")
        lines.append(
            f"{r['release_id'][:34]:34} {r['status']:8} {r['sigma']:10.4g} "
            f"{r['beta']:10.4g} {('-' if eps is None else f'{eps:.4g}'):>10} "
            f"{r.get('points', '-')!s:>8}  {r.get('dataset_id') or '-'}"
        )
    return "\n".join(lines)


def _budget_text(reports: list[JSONObject]) -> str:
    """Budget reports (``BudgetReport.to_dict()``, local or from GetBudget) as text."""
    if not reports:
        return "(no datasets in the ledger)"
    out = []
    for d in reports:
        cap, spent = d["cap"], d["spent"]
        out.append(
            f"dataset {d['dataset_id']}: spent eps={spent['epsilon']:.6g} "
            f"delta={spent['delta']:.3g}"
            + (
                ""
                if cap is None
                else f"; cap eps={cap['epsilon']:.6g} delta={cap['delta']:.3g}; remaining "
                f"eps={d['remaining']['epsilon']:.6g} delta={d['remaining']['delta']:.3g}"
            )
            + (" (memory store: not persistent)" if d.get("ephemeral") else "")
        )
        for e in d["events"]:
            out.append(
                f"  #{e['seq']} {e['created_at']} release={e['release_id']} mode={e['mode']} "
                f"eps={e['epsilon']:.6g} delta={e['delta']:.3g}"
            )
    return "\n".join(out)


def _ledger_text(reports: list[JSONObject]) -> str:
    """``qveil admin ledger``: one line per dataset (releases, spent, cap) and the rule the
    accountant composed its releases with."""
    if not reports:
        return "(the ledger is empty)"
    lines = [f"{'dataset':40} {'releases':>8} {'epsilon':>10} {'delta':>9} {'cap eps':>8}  rule"]
    for d in reports:
        cap = d.get("cap")
        cap_eps = "-" if cap is None else f"{cap['epsilon']:.4g}"
        lines.append(
            f"{str(d['dataset_id'])[:40]:40} {len(d['events']):>8} "
            f"{d['spent']['epsilon']:>10.6g} {d['spent']['delta']:>9.3g} "
            f"{cap_eps:>8}  {d.get('rule') or '-'}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin, audit_log

    cmd = args.admin_command
    target = getattr(args, "target", None)
    if target and cmd in ("releases", "activate", "retire", "budget", "ledger"):
        return _run_remote(args, cmd)
    url = _store_url(args, required=True)
    assert url is not None
    op = _LOCAL.get(cmd)
    if op is None:  # pragma: no cover - argparse restricts the choices
        raise InvalidArgument(f"unknown operation {cmd!r}")
    with admin.open_admin(
        url, actor=f"{audit_log.default_actor()} (cli)", new_ok=cmd == "init-store"
    ) as ctx:
        ctx.registry_url = getattr(args, "registry", None)
        op(ctx, args, url)
    return 0


# The operations run directly on the store, one per command: (context, flags, store URL).
# The server modules are imported when an operation runs (``qveil --help`` stays light).
def _init_store(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    d: JSONObject = {"store": url, "store_id": ctx.store.releases.store_id}
    _print(args, d, f"store {ctx.store.releases.store_id} ready")


def _export_release(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    d = admin.export_release(ctx, args.release_id, args.out)
    _print(
        args,
        d,
        f"release {d['release_id']}: {d['points']} logged points written to {d['out']} "
        f"(a copy: load it elsewhere with qveil admin import-release {d['out']} --store URL)",
    )


def _import_release(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    d = admin.import_release(ctx, args.path)
    _print(
        args,
        d,
        f"release {d['release_id']} imported with {d['points']} points into store "
        f"{d['store_id']} (staged)",
    )


def _retrain(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance.retrain import retrain

    target = getattr(args, "target", None)
    res = call_with_flags(  # config, dataset_id, epsilon, sigma, ...: the flags of those names
        retrain,
        args,
        ctx,
        activate_after=bool(args.activate and not target),
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    d = res.to_dict()
    if args.activate and target:
        with _admin_client(args) as client:
            rel, prev = client.activate(res.release_id, bundle_path=str(res.bundle_path))
        d["activated"] = True
        d["previous_release_id"] = prev
    e = res.ledger_entry.event
    _print(
        args,
        d,
        f"release {res.release_id} ({res.bundle_path}) recorded in the "
        f"ledger of {res.dataset_id}: eps={e.epsilon:.6g} delta={e.delta:.3g}; "
        f"dataset spent eps={res.budget.spent[0]:.6g}"
        + ("; activated" if d["activated"] else "; staged"),
    )
    warn = value_scale_warning(load_bundle(res.bundle_path, verify=False).card)
    if warn:
        print("\n" + "!" * 78 + f"\n{warn}\n" + "!" * 78, file=sys.stderr)


def _releases(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    rows = [r.to_dict() for r in admin.releases(ctx)]
    _print(args, rows, _releases_table(rows))


def _activate(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    info = admin.activate(ctx, args.release_id)
    _print(
        args,
        info.to_dict(),
        f"release {info.header.release_id} is active (store only: "
        "a running server must be told with --target)",
    )


def _retire(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    info = admin.retire(ctx, args.release_id)
    _print(args, info.to_dict(), f"release {info.header.release_id} retired")


def _budget(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    reps = [b.to_dict() for b in admin.budget(ctx, args.dataset_id)]
    _print(args, reps, _budget_text(reps))


def _ledger(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    reps = [b.to_dict() for b in admin.budget(ctx, None)]
    _print(args, reps, _ledger_text(reps))


def _set_cap(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import admin

    cap = admin.set_cap(ctx, args.dataset_id, epsilon=args.epsilon, delta=args.delta)
    _print(
        args, cap.to_dict(), f"cap of {cap.dataset_id}: eps={cap.epsilon:.6g} delta={cap.delta:.3g}"
    )


def _log(ctx: AdminContext, args: argparse.Namespace, url: str) -> None:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance import audit_log

    ents = audit_log.entries(ctx.db, limit=args.limit)
    _print(
        args,
        [e.to_dict() for e in ents],
        "\n".join(
            f"#{e.seq} {e.at} {e.actor} {e.action} {e.target} -> {e.outcome}"
            + (f" ({e.detail})" if e.detail else "")
            for e in ents
        )
        or "(empty)",
    )


_LOCAL: dict[str, Callable[[AdminContext, argparse.Namespace, str], None]] = {
    "init-store": _init_store,
    "export-release": _export_release,
    "import-release": _import_release,
    "retrain": _retrain,
    "releases": _releases,
    "activate": _activate,
    "retire": _retire,
    "budget": _budget,
    "ledger": _ledger,
    "set-cap": _set_cap,
    "log": _log,
}


def _run_remote(args: argparse.Namespace, cmd: str) -> int:
    with _admin_client(args) as client:
        if cmd == "releases":
            rels, active = client.list_releases()
            rows = [
                {
                    "release_id": r.release_id,
                    "status": r.status,
                    "sigma": r.sigma,
                    "beta": r.beta,
                    "epsilon": r.epsilon,
                    "mode": r.mode,
                }
                for r in rels
            ]
            _print(
                args,
                {"releases": rows, "active_release_id": active},
                _releases_table(rows) + f"\nactive: {active or '-'}",
            )
        elif cmd == "activate":
            bundle_path = getattr(args, "bundle_path", None) or ""
            url = _store_url(args, required=False)
            if not bundle_path and url:
                # here, not at the top: loads sqlalchemy only when this runs
                from qveil.server.governance import admin

                with admin.open_admin(url, create=False) as ctx:
                    bundle_path = admin.release_bundle_path(ctx, args.release_id) or ""
            rel, prev = client.activate(args.release_id, bundle_path=bundle_path)
            _print(
                args,
                {"release_id": rel.release_id, "previous_release_id": prev},
                f"release {rel.release_id} is active on {args.target} (previous: {prev or '-'})",
            )
        elif cmd == "budget":
            reps = client.budget(args.dataset_id or "")
            _print(args, reps, _budget_text(reps))
        elif cmd == "ledger":
            reps = client.budget("")
            _print(args, reps, _ledger_text(reps))
        else:
            rel = client.retire(args.release_id)
            _print(
                args,
                {"release_id": rel.release_id, "status": rel.status},
                f"release {rel.release_id} retired on {args.target}",
            )
    return 0
