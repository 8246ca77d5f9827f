"""The single ``qveil`` entry point. Each subcommand lives in its own module and registers
itself here through ``add_parser(subparsers)``; imports are lazy so that the light client
commands never import torch or SQLAlchemy."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from qveil import __version__
from qveil.errors import QveilError

# subcommand -> module providing ``add_parser(subparsers)``; the parser stores ``func``.
SUBCOMMANDS: dict[str, str] = {
    "noise": "qveil.noise_cli",
    "dataset": "qveil.dataset_cli",
    "privacy": "qveil.privacy.cli",
    "train": "qveil.trainer.cli_train",
    "evaluate": "qveil.trainer.cli_evaluate",
    "inspect": "qveil.inspect_cli",
    "serve": "qveil.server.cli_serve",
    "query": "qveil.client.cli",
    "admin": "qveil.server.cli_admin",
    "budget": "qveil.server.cli_budget",
    "audit": "qveil.server.cli_audit",
    "experiments": "qveil.experiments.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qveil",
        description="Private value-function release with functional noise. The default "
        "release is fqi: private fitted-Q iteration on an offline dataset of users' episodes "
        "(qveil train --dataset); the paper's Algorithm 1 modes train online.",
    )
    parser.add_argument("--version", action="version", version=f"qveil {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # an optional extra is not installed, or not built yet
            if exc.name == module:
                continue
            p = sub.add_parser(name, help=f"(unavailable: {exc.name} is not installed)")
            p.set_defaults(func=_missing(name, exc))
            continue
        mod.add_parser(sub)
    return parser


def _missing(name: str, exc: ImportError):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        print(
            f"qveil {name}: needs {exc.name!r}; install qveil with its extras "
            f"(pip install 'qveil[server,trainer]')",
            file=sys.stderr,
        )
        return 2

    return run


def main(argv: Sequence[str] | None = None) -> int:
    # everything qveil writes (bundles, stores and their -wal/-shm, ledgers, exports, token
    # files) holds private data or key material: owner-only, whatever umask the shell has
    os.umask(0o077)
    if list(sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:
        # the server runs many small forwards in a thread pool: single-threaded BLAS (set
        # before numpy loads; an explicit OPENBLAS_NUM_THREADS wins)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except QveilError as exc:
        print(f"qveil {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `qveil ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
