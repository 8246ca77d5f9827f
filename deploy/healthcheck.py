#!/usr/bin/env python3
"""Container / orchestrator health probe for qveil through the standard grpc.health.v1 service.

Exit status 0 only when Health/Check for the overall server ("") answers SERVING; 1 for
NOT_SERVING (model or store not verified yet, or draining after SIGTERM), an error, or a
timeout. No grpc_health_probe binary is needed: the image already has grpcio and
grpcio-health-checking.

Configuration (arguments win over the environment):
  target        argv[1] or QVEIL_HEALTH_TARGET         (default 127.0.0.1:50051)
  CA bundle     --ca FILE or QVEIL_HEALTH_CA           (TLS when the file exists; else plaintext)
  server name   --server-name N or QVEIL_HEALTH_SERVER_NAME (TLS name override, e.g. localhost)
  client cert   --cert/--key or QVEIL_HEALTH_CERT / QVEIL_HEALTH_KEY (mutual TLS)
  timeout       --timeout S or QVEIL_HEALTH_TIMEOUT    (default 3 seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _read(path: str | None) -> bytes | None:
    if not path or not Path(path).is_file():
        return None
    return Path(path).read_bytes()


def check(
    target: str,
    *,
    ca: str | None = None,
    server_name: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    timeout: float = 3.0,
) -> str:
    """The serving status name reported by ``target`` ("SERVING", "NOT_SERVING", ...)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    root = _read(ca)
    if root is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=root, private_key=_read(key), certificate_chain=_read(cert)
        )
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(description="grpc.health.v1 probe for qveil")
    p.add_argument("target", nargs="?", default=env("QVEIL_HEALTH_TARGET", "127.0.0.1:50051"))
    p.add_argument("--ca", default=env("QVEIL_HEALTH_CA"))
    p.add_argument("--server-name", default=env("QVEIL_HEALTH_SERVER_NAME"))
    p.add_argument("--cert", default=env("QVEIL_HEALTH_CERT"))
    p.add_argument("--key", default=env("QVEIL_HEALTH_KEY"))
    p.add_argument("--timeout", type=float, default=float(env("QVEIL_HEALTH_TIMEOUT", "3")))
    args = p.parse_args(argv)
    try:
        status = check(
            args.target,
            ca=args.ca,
            server_name=args.server_name,
            cert=args.cert,
            key=args.key,
            timeout=args.timeout,
        )
    except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy"
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
