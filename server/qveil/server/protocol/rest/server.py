"""The v2 REST binding's HTTP server: uvicorn serving :func:`build_app` on an already bound
socket, inside the server's running event loop (``qveil serve --http-port P``; off by
default). TLS: the server's --tls-* files; without TLS it binds 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qveil.errors import InvalidArgument, PortInUse
from qveil.server.protocol.dataplane import DataPlane
from qveil.server.protocol.rest.v2_endpoints import build_app

if TYPE_CHECKING:  # uvicorn loads only when the REST endpoint is served (--http-port)
    import uvicorn

__all__ = ["RestServer", "TLSPaths", "start_rest"]


class TLSPaths(Protocol):
    """The server's TLS files (``qveil.server.app.TLSFiles``)."""

    @property
    def cert(self) -> Path: ...
    @property
    def key(self) -> Path: ...
    @property
    def client_ca(self) -> Path | None: ...  # set: mutual TLS


@dataclass
class RestServer:
    """uvicorn serving the app on an already bound socket, inside the running event loop."""

    server: uvicorn.Server
    sock: socket.socket
    task: asyncio.Task[None]
    port: int

    async def stop(self, grace: float) -> None:
        # typed int by uvicorn, used as asyncio.wait_for's timeout: a float is what it takes
        self.server.config.timeout_graceful_shutdown = max(0.0, grace)  # type: ignore[assignment]
        self.server.should_exit = True
        await self.task
        await self.server.shutdown(sockets=[self.sock])


async def start_rest(
    plane: DataPlane,
    serving: Callable[[], bool],
    *,
    host: str,
    port: int,
    tls: TLSPaths | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> RestServer:
    """Bind ``host:port`` (0: any free port) and serve the v2 REST app on it (TLS from the
    server's ``TLSFiles``; mutual TLS when it has a client CA)."""
    # uvicorn loads only when the REST endpoint is served (--http-port)
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when
    # the socket says it is TCP; without it every response waited ~40 ms (Nagle against the
    # client's delayed ACK: uvicorn writes headers and body separately), 48 ms per call
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise PortInUse(
                f"port {where} is already in use (another qveil serve?); choose another "
                "--http-port or stop the other server"
            ) from None
        raise InvalidArgument(f"cannot bind the v2 REST port {host}:{port}: {exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    ca = tls.client_ca if tls is not None else None
    config = uvicorn.Config(
        build_app(plane, serving, max_body_bytes=max_body_bytes),
        lifespan="off",
        log_level="warning",
        access_log=False,
        ssl_certfile=str(tls.cert) if tls is not None else None,
        ssl_keyfile=str(tls.key) if tls is not None else None,
        ssl_ca_certs=str(ca) if ca is not None else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if ca is not None else ssl.CERT_NONE,
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    task = asyncio.ensure_future(server.main_loop())
    return RestServer(server, sock, task, int(sock.getsockname()[1]))
