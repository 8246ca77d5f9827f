"""``qveil inspect --bundle DIR --grid N [--json]``: the un-noised released mean function.

An admin-side, local command (it reads the bundle's files; no server, no store, no noise):
the mean function L(Q_T) of an fqi release (or the clamped network of an Algorithm 1 one) on
an even grid of N points over each coordinate's interval (d coordinates: each coordinate
swept over its interval, the others at their interval's centre; [N d, d] states). Auditors
use it to check sensitivity claims: two neighbouring releases' means must differ by at most
the card's Delta in RKHS norm. It is NOT a release: ordinary clients only ever see mean + noise.

    qveil inspect --bundle bundle --grid 11 --json
    -> {"states": [[s_1, ...], ...], "mean": [[Q(s, a) for a] for s], "release_id": ...,
        "mode": ...}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from qveil.bundle import load_bundle
from qveil.cli_parser import Subcommands, add_command
from qveil.errors import InvalidArgument

__all__ = ["add_parser", "run"]


def add_parser(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "inspect",
        "admin: the un-noised released mean function of a bundle on a grid",
        __doc__,
        run,
    )
    p.add_argument("--bundle", type=Path, required=True, help="release bundle directory")
    p.add_argument("--grid", type=int, default=101, help="even grid points (>= 2)")
    p.add_argument("--json", action="store_true", help="print JSON (default: a table)")


def run(args: argparse.Namespace) -> int:

    if args.grid < 2 or args.grid > 1_000_000:
        raise InvalidArgument(f"--grid must be in [2, 1000000], got {args.grid}")
    b = load_bundle(args.bundle, verify=True)
    # d coordinates (d >= 1): sweep each coordinate over its interval, the others centred
    box = b.box
    t = np.linspace(0.0, 1.0, args.grid)
    unit = np.full((b.dims * args.grid, b.dims), 0.5)
    for j in range(b.dims):
        unit[j * args.grid : (j + 1) * args.grid, j] = t
    states = box.lo + unit * (box.hi - box.lo)
    mean = b.q_values_unit(unit)
    out = {
        "release_id": b.bundle_id,
        "mode": b.card.get("mode"),
        "states": states.tolist(),
        "mean": mean.tolist(),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"release {b.bundle_id} (mode {out['mode']}): un-noised mean, admin only")
    head = "".join(f"{'a=' + str(a):>14}" for a in range(mean.shape[1]))
    print(f"{'state':>12}{head}")
    for s, row in zip(states, mean, strict=True):
        label = ",".join(f"{v:.4g}" for v in np.atleast_1d(s))
        print(f"{label:>12}" + "".join(f"{v:>14.6f}" for v in row))
    return 0
