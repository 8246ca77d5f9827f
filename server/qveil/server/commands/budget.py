"""``qveil budget create NAME --epsilon E --delta D`` / ``qveil budget show [NAME]`` /
``qveil budget registry-key``

A population (the people whose data releases use) is declared once with one budget in the
registry (``--registry URL``, else ``QVEIL_REGISTRY``, else ``$QVEIL_HOME/registry.sqlite``).
Every ``qveil train --population NAME`` is recorded against it, whatever its output
directory, and refused before any data is read when the population's privacy filter would
not let it through. ``show`` prints the budget, what is spent, what one more release may
still have, every release with its time, and with ``--plot PNG`` the spending over time.
``registry-key`` prints the registry's public key: what a server of another registry (a
replica) is given with ``qveil serve --trust-registry-key`` to accept this registry's
receipts. Exit codes: 0 done, 2 refused (message on stderr).
"""

from __future__ import annotations

import argparse
import json

from qveil.cli_parser import Subcommands, add_command
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.server.governance import population

__all__ = ["add_parser", "run"]


def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    p = add_command(
        sub, "budget", "declare a population's privacy budget, or show its spending", __doc__, run
    )
    ops = p.add_subparsers(dest="budget_command", metavar="OP", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--registry", metavar="URL", help="the registry (default above)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    c = ops.add_parser("create", parents=[common], help="declare a population and its budget")
    c.add_argument("name", metavar="NAME")
    c.add_argument("--epsilon", type=float, required=True, help="the population's epsilon")
    c.add_argument("--delta", type=float, required=True, help="the population's delta")
    s = ops.add_parser("show", parents=[common], help="budget, spending and releases")
    s.add_argument("name", metavar="NAME", nargs="?", help="one population (default: all)")
    s.add_argument("--plot", metavar="PNG", help="with NAME: plot spending over time")
    ops.add_parser(
        "registry-key",
        parents=[common],
        help="print the registry's public key (for qveil serve --trust-registry-key)",
    )
    return p


def _spent(rep: JSONObject) -> str:
    """What the population has spent, in words: nothing yet, or its (eps, delta) and, under
    the Gaussian filter, the share of the budget in its own unit (mu adds up as a root sum
    of squares, which epsilons do not)."""
    if not rep["events"]:
        return "nothing yet (no release charged)"
    text = f"eps={rep['spent']['epsilon']:.6g} at delta={rep['spent']['delta']:.3g}"
    if rep["mu_budget"]:
        text += f" (Gaussian-DP mu {rep['mu_spent']:.6g} of the budget's {rep['mu_budget']:.6g})"
    return text


def _text(rep: JSONObject) -> str:
    lines = [
        f"population {rep['population']} (declared {rep['declared_at']} by {rep['declared_by']})",
        f"  budget:    eps={rep['budget']['epsilon']:g} delta={rep['budget']['delta']:g}",
        f"  spent:     {_spent(rep)}",
        f"  remaining: one more release may have eps <= {rep['remaining']['epsilon']:.6g} "
        f"at delta={rep['remaining']['delta']:.3g}",
        f"  rule:      {rep['rule']}",
        f"  releases:  {len(rep['events'])}",
    ]
    for e in rep["events"]:
        lines.append(
            f"    {e['at']}  {e['release_id']}  {e['mode']}  eps={e['epsilon']:.6g} "
            f"delta={e['delta']:.3g}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: loads sqlalchemy only when this runs
    from qveil.server.governance.registry import open_registry

    with open_registry(args.registry) as reg:
        if args.budget_command == "registry-key":
            key = {"registry_id": reg.registry_id, "public_key": reg.public_key}
            print(json.dumps(key, indent=2) if args.json else reg.public_key)
            return 0
        if args.budget_command == "create":
            reps = [population.create(reg, args.name, epsilon=args.epsilon, delta=args.delta)]
        elif args.name:
            reps = [population.report(reg, args.name)]
            if args.plot:
                population.plot_spending(reps[0], args.plot)
        else:
            if args.plot:
                raise InvalidArgument("--plot needs a population NAME")
            reps = [population.report(reg, n) for n in reg.ledger.datasets() if reg.ledger.cap(n)]
    if args.json:
        print(json.dumps(reps if not args.name else reps[0], indent=2, sort_keys=True))
    else:
        print("\n\n".join(_text(r) for r in reps) if reps else "(no populations declared)")
    return 0
