"""``qveil serve --bundle DIR [--store URL] [--listen HOST:PORT]``: the gRPC server.

Embedded defaults: SQLite beside the bundle (DIR/../qveil-store.sqlite), 127.0.0.1:50051,
no tokens (anonymous query on loopback only). Non-loopback addresses need TLS (or --insecure)
and a tokens file. ``--add-token ROLE --tokens-file F`` appends a new token's hash to F,
prints the token once and exits. Imports nothing heavy until run (``qveil query`` shares the
parser)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from qveil.cli_parser import Subcommands, add_command
from qveil.server.commands.flags import call_with_flags


# long-function: a flat list of qveil serve's flag declarations, one per option: splitting it would
#   only scatter its one --help
def add_parser(sub: Subcommands) -> None:
    # here, not at the top: importing this CLI module loads no server module but commands.flags
    from qveil.server.serving.limits import DEFAULT_MAX_STORED_POINTS
    from qveil.server.serving.quotas import DEFAULT_BURST_SECONDS, DEFAULT_STATE_RATE

    p = add_command(
        sub,
        "serve",
        "serve a release bundle over gRPC (and the Open Inference Protocol over gRPC and REST)",
        __doc__,
        run,
    )
    p.add_argument("--bundle", type=Path, help="release bundle directory (qveil train --out)")
    p.add_argument(
        "--store",
        help="the answer log's store URL (sqlite:///ABS/PATH.sqlite or "
        "postgresql+psycopg://...); default: SQLite beside the bundle",
    )
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (port 0: any free)")
    p.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="also serve the Open Inference Protocol (KServe v2) REST binding on this port "
        "(0: any free); 127.0.0.1 unless TLS is set. Off by default",
    )
    t = p.add_argument_group("transport and auth")
    t.add_argument("--tls-cert", type=Path, help="server certificate chain (PEM)")
    t.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    t.add_argument(
        "--tls-client-ca",
        type=Path,
        help="mutual TLS: require client certificates signed by this CA (PEM)",
    )
    t.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext on a non-loopback address (not recommended)",
    )
    t.add_argument("--tokens-file", type=Path, help="TOML file of token hashes per role")
    t.add_argument(
        "--add-token",
        metavar="ROLE",
        choices=("query", "admin", "auditor"),
        help="append a new token of ROLE to --tokens-file, print it, exit",
    )
    t.add_argument("--token-name", default="", help="name of the token added by --add-token")
    t.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    o = p.add_argument_group("limits and operation")
    o.add_argument("--max-batch", type=int, default=4096, help="states per request")
    o.add_argument(
        "--max-in-flight",
        type=int,
        default=64,
        help="concurrent calls; beyond it RESOURCE_EXHAUSTED",
    )
    o.add_argument(
        "--max-in-flight-per-caller",
        type=int,
        default=None,
        help="concurrent calls of one caller (its token, or its connection when anonymous); "
        "default 3/4 of --max-in-flight, so one flooding caller cannot starve the others",
    )
    o.add_argument(
        "--max-stored-points",
        type=int,
        default=DEFAULT_MAX_STORED_POINTS,
        help="cap of the audit log: answered noise points kept per release, all actions and "
        "coordinates (default %(default)s); past it answers go on and are no longer logged "
        "(qveil_log_unlogged_points_total counts them, a WARNING says so once)",
    )
    o.add_argument(
        "--state-rate",
        "--new-state-rate",
        dest="state_rate",
        type=float,
        default=DEFAULT_STATE_RATE,
        help="states per second per caller, every state counted: its token name, or its host "
        "without tokens (default %(default)s); over it RESOURCE_EXHAUSTED with the wait (gRPC "
        "retry pushback, HTTP Retry-After)",
    )
    o.add_argument(
        "--state-burst",
        "--new-state-burst",
        dest="state_burst",
        type=float,
        default=None,
        help="token bucket of --state-rate: states one caller may send at once "
        f"(default {DEFAULT_BURST_SECONDS:g} s of the rate)",
    )
    o.add_argument(
        "--max-message-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest request accepted, bytes (gRPC and REST; default %(default)s)",
    )
    o.add_argument(
        "--value-grid",
        type=float,
        default=2.0**-20,
        help="released values are multiples of this power of two",
    )
    o.add_argument(
        "--workers",
        type=int,
        default=16,
        help="threads for calls of many states (a few states are answered on the event loop)",
    )
    o.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="serve with N processes on the one --listen port (Linux SO_REUSEPORT: the kernel "
        "spreads connections over them), each with its own connection to the one store "
        "(SQLite or PostgreSQL); metrics and v2 REST are served by the first process only",
    )
    o.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds calls in flight get to finish on shutdown",
    )
    o.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        help="seconds to keep answering after SIGTERM with health NOT_SERVING",
    )
    o.add_argument("--metrics-port", type=int, help="Prometheus endpoint port (0: any free)")
    o.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address of the Prometheus endpoint (default %(default)s: this machine only)",
    )
    o.add_argument(
        "--trust-registry-key",
        action="append",
        default=[],
        metavar="HEX",
        help="also trust receipts signed by this registry public key (qveil budget "
        "registry-key prints it); the registry this server opens is always trusted",
    )
    o.add_argument(
        "--log-level",
        default="WARNING",
        help="level of the server's log on stderr (default %(default)s)",
    )
    o.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="one readable line, or one JSON object per line (for log shippers)",
    )
    o.add_argument(
        "--access-log",
        action="store_true",
        help="one line per call: method, protocol, caller, release, code, states, latency "
        "(never a state or a value); authentication failures are logged always",
    )


def run(args: argparse.Namespace) -> int:
    # here, not at the top: grpc, the store and the services load only when serve runs
    from qveil.errors import InvalidArgument, PortInUse
    from qveil.server.app import ServeConfig, TLSFiles, serve
    from qveil.server.serving.auth import add_token
    from qveil.server.serving.limits import Limits
    from qveil.server.serving.logs import configure

    try:
        configure(level=args.log_level, fmt=args.log_format, access=args.access_log)
    except ValueError as exc:  # an unknown level name
        raise InvalidArgument(f"--log-level: {exc}") from None
    if args.add_token:
        if not args.tokens_file:
            raise InvalidArgument("--add-token needs --tokens-file")
        print(add_token(args.tokens_file, args.add_token, args.token_name))
        return 0
    if args.bundle is None:
        raise InvalidArgument("--bundle DIR is required")
    if not 1 <= args.processes <= 256:
        raise InvalidArgument(f"--processes must be in 1..256, got {args.processes}")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidArgument("give both --tls-cert and --tls-key")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise InvalidArgument("--tls-client-ca (mutual TLS) needs --tls-cert/--tls-key")
    tls = (
        TLSFiles(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
        if args.tls_cert
        else None
    )
    # each field of ServeConfig and Limits is the flag of the same name, but these three
    config = call_with_flags(
        ServeConfig, args, store_url=args.store, tls=tls, limits=call_with_flags(Limits, args)
    )
    try:
        return asyncio.run(serve(config))
    except PortInUse as exc:  # a plain operator mistake: one line, no "error:" prefix
        print(f"qveil serve: {exc}", file=sys.stderr)
        return 2
