"""``qveil query``: released values, best actions or the card from a running server.

    qveil query --target 127.0.0.1:50051 --state 0.3 --state 0.7 [--action 1] [--json]
    qveil query --target HOST:PORT --best --state 0.3
    qveil query --target HOST:PORT --card
    qveil query --target HOST:PORT --state 0.1,0.2,0.3,0.4     (a release of d = 4 coordinates)

The numbers of the --state flags are whole states of the release's d coordinates, in
order: for d = 4, ``--state 0.1,0.2,0.3,0.4`` is one state; for a 1-D release each number is
a state. The release's d comes from GetRelease; states outside the intervals are clipped by
the server (the card's ``clipping``).
Light: imports only the client SDK (no torch, no SQLAlchemy)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys

from qveil.cli_parser import Subcommands
from qveil.client import TLSConfig, ValueClient
from qveil.client.channel import read_token_file
from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONValue

#: Arguments argparse must read as values, not options: anything starting with "-" and a
#: digit (or "-." and a digit), so that ``--state -0.01,0.1`` is a state. (argparse's own
#: pattern accepts only a single negative number; query has no option spelt like a number.)
NEGATIVE_VALUE = re.compile(r"^-\.?\d")


#: what the card's less obvious fields mean, printed beside them by ``qveil query --card``
CARD_WORDS = {
    "delta_total": "the delta of the whole guarantee",
    "sigma": "standard deviation of the noise on every value",
    "beta": "rate of the noise: nearby states get correlated noise",
    "betas": "the noise's rate per state coordinate",
    "seeded": "whether the noise key came from a seed (tests only), not from OS entropy",
    "value_grid": "answers are rounded to multiples of it",
    "dims": "state coordinates",
}


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "query",
        help="query released values from a qveil server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # argparse reads this pattern per parser (it has no public hook for it)
    p._negative_number_matcher = NEGATIVE_VALUE
    p.add_argument("--target", required=True, help="server address HOST:PORT")
    p.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="S",
        help="a state (repeat, or comma-separated list); d > 1: one state's d coordinates",
    )
    p.add_argument(
        "--action",
        action="append",
        type=int,
        default=[],
        metavar="A",
        help="an action (repeat); default: every action",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--best", action="store_true", help="best action per state")
    mode.add_argument("--card", action="store_true", help="print the release's public card")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--token-file", help="file holding the bearer token")
    p.add_argument("--tls", action="store_true", help="TLS with the system roots")
    p.add_argument("--tls-ca", help="CA certificate (PEM) that signed the server certificate")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", help="client private key (PEM) for mutual TLS")
    p.add_argument("--tls-server-name", help="name to check the server certificate against")
    p.add_argument("--timeout", type=float, default=30.0, help="per-call deadline, seconds")
    p.set_defaults(func=run)


def _numbers(item: str) -> list[float]:
    out: list[float] = []
    for part in item.split(","):
        part = part.strip()
        if not part:
            raise InvalidArgument(
                f"--state {echo(item)} has an empty value (numbers separated by single commas)"
            )
        try:
            out.append(float(part))
        except ValueError:
            raise InvalidArgument(f"--state {part!r} is not a number") from None
    return out


def _states(raw: list[str], dims: int) -> list[list[float]]:
    """The states of the --state flags for a release of ``dims`` coordinates: each flag holds
    one or more states, their coordinates comma-separated in order (d = 1: each number is a
    state, so ``--state 0.1,0.5`` is two states)."""
    out: list[list[float]] = []
    for item in raw:
        nums = _numbers(item)
        if len(nums) % dims:
            raise InvalidArgument(
                f"--state {echo(item)} has {len(nums)} coordinate(s); this release has {dims} "
                "(give whole states, their coordinates comma-separated)"
            )
        out += [nums[i : i + dims] for i in range(0, len(nums), dims)]
    return out


def _label(s: list[float]) -> str:
    return f"{s[0]:.6g}" if len(s) == 1 else ",".join(f"{v:.4g}" for v in s)


def _jsonable(obj: object) -> JSONValue:
    """Plain JSON values; a number that is not finite (a field the release does not have, an
    untested statistic) becomes null, never NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def human(v: object) -> str:
    """A value as people read it: floats to 6 significant digits (7.999999999999996 -> 8,
    0.7999999999999998 -> 0.8), lists element-wise; ``--json`` keeps full precision."""
    if isinstance(v, float):
        return "n/a" if v != v else f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(human(x) for x in v) + "]"
    return str(v)


def run(args: argparse.Namespace) -> int:
    if not (args.timeout > 0 and args.timeout < float("inf")):
        raise InvalidArgument(f"--timeout must be a number of seconds > 0, got {args.timeout!r}")
    token = read_token_file(args.token_file) if args.token_file else None
    tls: TLSConfig | bool | None = None
    if args.tls_ca or args.tls_cert or args.tls_key or args.tls_server_name:
        tls = TLSConfig(
            ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name
        )
    elif args.tls:
        tls = True
    with ValueClient(args.target, token=token, tls=tls, timeout=args.timeout) as client:
        if args.card:
            if args.state or args.action:
                raise InvalidArgument("--card takes no --state or --action (it prints the card)")
            rel = client.release()
            if args.json:
                print(json.dumps(_jsonable(rel), indent=2, sort_keys=True, allow_nan=False))
            else:
                for k, v in _jsonable(rel).items():
                    if k != "card":
                        words = f"  ({CARD_WORDS[k]})" if k in CARD_WORDS else ""
                        print(f"{k:>15}: {'n/a' if v is None else human(v)}{words}")
            return 0
        if not args.state:
            raise InvalidArgument("give at least one --state (or --card)")
        release = client.release()
        dims, m = release.dims, release.n_actions
        states = _states(args.state, dims)
        bad = [a for a in args.action if not 0 <= a < m]
        if bad:
            raise InvalidArgument(
                f"--action {bad[0]} is out of range: this release has actions 0..{m - 1}"
            )
        if args.best:
            best = client.get_best_actions(states)
            if args.json:
                print(
                    json.dumps(
                        {
                            "release_id": best.release_id,
                            "states": states,
                            "actions": best.actions.tolist(),
                            "values": best.values.tolist(),
                        }
                    )
                )
            else:
                print(f"release {best.release_id}")
                print(f"{'state':>12} {'best action':>12} {'value':>14}")
                for s, a, v in zip(states, best.actions, best.values, strict=True):
                    print(f"{_label(s):>12} {int(a):>12d} {v:>14.6f}")
            return 0
        vals = client.get_values(states, args.action or None)
        if args.json:
            print(
                json.dumps(
                    {
                        "release_id": vals.release_id,
                        "states": states,
                        "actions": list(vals.actions),
                        "values": vals.values.tolist(),
                        "value_grid": vals.value_grid,
                    }
                )
            )
        else:
            print(f"release {vals.release_id}")
            print(f"{'state':>12} " + " ".join(f"{'a=' + str(a):>14}" for a in vals.actions))
            for s, row in zip(states, vals.values, strict=True):
                print(f"{_label(s):>12} " + " ".join(f"{v:>14.6f}" for v in row))
    sys.stdout.flush()
    return 0
