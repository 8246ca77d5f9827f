"""Server factory and lifecycle.

``create_server(plane, health, listen=...) -> (server, port)`` builds a grpc.aio server with the
three qveil services, grpc.health.v1 and (by flag) reflection, bound but not started; tests bind
``127.0.0.1:0``. :func:`serve` is the whole life of ``qveil serve``: bind (health NOT_SERVING),
load and verify the bundle and its receipt, open the store (the answer log's), register and
activate the release, verify the logged noise, SERVING; on SIGTERM/SIGINT: NOT_SERVING (open
health watches end), keep answering for ``drain_delay`` seconds (load balancers notice), then
refuse new calls with UNAVAILABLE, let calls in flight finish (at most ``grace`` seconds),
``server.stop``, write what the answer log holds, close the store, exit 0."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Literal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as refl

from qveil.errors import FailedPrecondition, InvalidArgument, PortInUse
from qveil.server.protocol.dataplane import DataPlane, new_executor
from qveil.server.protocol.grpc.bad_body import checked_server
from qveil.server.protocol.grpc.servicer import AdminServicer, AuditServicer, ValueServicer
from qveil.server.protocol.grpc.v2_servicer import SERVICE_NAME as OIP_SERVICE_NAME
from qveil.server.protocol.grpc.v2_servicer import add_inference_service
from qveil.server.protocol.rest.server import RestServer, start_rest
from qveil.server.serving.answer_log import AnswerLog
from qveil.server.serving.auth import Authorizer, load_tokens
from qveil.server.serving.health import Health
from qveil.server.serving.limits import Limits
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.services import Services
from qveil.server.serving.state import ActiveRelease, ReleaseHolder
from qveil.server.store import open_store
from qveil.v1 import admin_service_pb2, audit_service_pb2, value_service_pb2
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = [
    "ServeConfig",
    "TLSFiles",
    "create_server",
    "default_store_url",
    "host_port",
    "is_loopback",
    "loose_permissions",
    "port_in_use",
    "serve",
]

log = logging.getLogger("qveil.server")

SERVICE_NAMES = (
    value_service_pb2.DESCRIPTOR.services_by_name["ValueService"].full_name,
    admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
)


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS, client certificates signed by this CA

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes() if self.client_ca else None,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path
    store_url: str | None = None
    listen: str = "127.0.0.1:50051"
    tls: TLSFiles | None = None
    insecure: bool = False
    tokens_file: Path | None = None
    reflection: bool = False
    limits: Limits = field(default_factory=Limits)
    max_message_bytes: int = 4 * 1024 * 1024
    workers: int = 16
    grace: float = 10.0
    drain_delay: float = 0.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    port_file: Path | None = None
    http_port: int | None = None  # v2 REST (off by default; loopback unless TLS)
    #: registry public keys (hex) whose receipts are trusted besides the server's registry's
    trust_registry_key: Sequence[str] = ()
    #: --processes N: N server processes on one port (SO_REUSEPORT), one store
    processes: int = 1
    #: set in processes 2..N only: the first process's pid; such a process binds the shared
    #: port only once its release is ready, and stops when that process is gone
    parent_pid: int | None = None


def split_host(listen: str) -> tuple[str, str]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"--listen {listen!r} must be HOST:PORT")
    return host.strip("[]"), port


def host_port(host: str, port: int | str) -> str:
    """``HOST:PORT`` as people and URLs write it: an IPv6 address in brackets ([::1]:50051)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(listen: str) -> bool:
    host, _ = split_host(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(config: ServeConfig) -> None:
    """The transport rules: plaintext only on loopback unless --insecure; without a tokens
    file, loopback only (anyone may query there, nobody may administer or audit)."""
    loop = is_loopback(config.listen)
    if not loop and config.tls is None and not config.insecure:
        raise InvalidArgument(
            f"refusing to listen on non-loopback {config.listen!r} without "
            "TLS (give --tls-cert/--tls-key, or --insecure to override)"
        )
    if not loop and config.tokens_file is None:
        raise InvalidArgument(
            f"refusing to listen on non-loopback {config.listen!r} without "
            "--tokens-file: anonymous access is for loopback only"
        )


def default_store_url(bundle: Path) -> str:
    """SQLite beside the bundle (shared by its sibling bundles: one store per directory)."""
    return f"sqlite:///{(bundle.resolve().parent / 'qveil-store.sqlite')}"


def resolve_store_url(url: str, bundle: Path) -> tuple[str, bool]:
    """(url, changed): a relative SQLite path (``sqlite:///store.sqlite``, any
    ``sqlite+driver``) resolved against the directory that holds the bundle (where the default
    store lives), not against the working directory, so the same command finds the same
    store wherever it runs. Absolute paths, in-memory SQLite and other
    backends are returned unchanged."""
    scheme, sep, rest = url.partition(":///")
    if not sep or not (scheme == "sqlite" or scheme.startswith("sqlite+")):
        return url, False
    path, q, query = rest.partition("?")
    if not path or path.startswith("/") or path == ":memory:":
        return url, False
    resolved = (bundle.resolve().parent / path).resolve()
    return f"{scheme}:///{resolved}{q}{query}", True


def create_server(
    plane: DataPlane,
    health: Health,
    *,
    listen: str = "127.0.0.1:0",
    credentials: grpc.ServerCredentials | None = None,
    reflection: bool = False,
    max_message_bytes: int = 4 * 1024 * 1024,
    reuse_port: bool = False,
    join: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with qveil's services, health and optional reflection, bound to
    ``listen`` (port 0: any free port); returns (server, bound port). Not started.
    ``reuse_port``: bind with SO_REUSEPORT (``--processes``: the kernel spreads new
    connections over the processes bound to the port); ``join``: the port is the first
    process's, not a port to check for being free."""

    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 16 * max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second server on a taken port would then
            # start and share the calls with the first. Without it the bind fails.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ],
    )
    # an undecodable body is INVALID_ARGUMENT (bad_body), wrapped once per method here
    checked_server(server, value_grpc.add_ValueServiceServicer_to_server, ValueServicer(plane))
    checked_server(server, admin_grpc.add_AdminServiceServicer_to_server, AdminServicer(plane))
    checked_server(server, audit_grpc.add_AuditServiceServicer_to_server, AuditServicer(plane))
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    add_inference_service(plane, lambda: bool(health.serving), server)  # v2, same port
    if reflection:
        names = (
            *SERVICE_NAMES,
            OIP_SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            refl.SERVICE_NAME,
        )
        refl.enable_server_reflection(names, server)
    host, want = split_host(listen)
    in_use = PortInUse(
        f"port {host_port(host, want)} is already in use (another qveil serve?); "
        "choose another --listen port or stop the other server"
    )
    # checked first as well, so that the usual case is refused before gRPC logs its own
    # bind error; the check after a failed bind covers a port taken in between
    if int(want) and not join and port_in_use(host, int(want)):
        raise in_use
    try:
        port = (
            server.add_secure_port(listen, credentials)
            if credentials is not None
            else server.add_insecure_port(listen)
        )
    except RuntimeError:  # newer grpcio raises where older returned 0
        port = 0
    if port == 0:
        if int(want) and port_in_use(host, int(want)):
            raise in_use
        raise InvalidArgument(f"cannot bind {listen!r} (address not available)")
    return server, port


def port_in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails with EADDRINUSE (a listener holds it), checked with
    a plain socket after gRPC's bind failed (gRPC does not say why)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                sock.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def loose_permissions(bundle: Path, store_url: str) -> list[str]:
    """One warning for each of the bundle and the SQLite store whose files (or the bundle
    directory) are readable or writable by group or others, naming the first such path, its
    mode and the fix. Both hold what the release protects: the bundle its un-noised model
    and noise key, the store the noise values it answered."""
    warnings = []

    def loose(paths: list[Path]) -> list[tuple[Path, int]]:
        found = []
        for p in paths:
            try:
                mode = stat.S_IMODE(p.stat().st_mode)
            except OSError:
                continue
            if mode & 0o077:
                found.append((p, mode))
        return found

    if bundle.is_dir():
        found = loose([bundle, *sorted(p for p in bundle.iterdir() if p.is_file())])
        if found:
            first, mode = found[0]
            more = f" (and {len(found) - 1} more in the bundle)" if len(found) > 1 else ""
            warnings.append(
                f"WARNING: {first} is mode {mode:04o}, readable or writable by group or "
                f"others{more}; a bundle holds the un-noised model and its noise key: "
                f"chmod -R go-rwx {bundle}"
            )
    scheme, sep, rest = store_url.partition(":///")
    if sep and (scheme == "sqlite" or scheme.startswith("sqlite+")):
        path = rest.partition("?")[0]
        path = path[len("file:") :] if path.startswith("file:") else path
        if path and path != ":memory:":
            db = Path(path)
            found = loose([db, *(db.with_name(db.name + s) for s in ("-wal", "-shm"))])
            if found:
                first, mode = found[0]
                fix = " ".join(str(p) for p, _ in found)
                warnings.append(
                    f"WARNING: store file {first} is mode {mode:04o}, readable or writable by "
                    f"group or others; it holds every noise value answered: chmod -R go-rwx {fix}"
                )
    return warnings


def _write_port_file(path: Path, port: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


async def serve(config: ServeConfig, *, on_event: Callable[[str], None] | None = None) -> int:
    """Run ``qveil serve`` until SIGTERM/SIGINT; returns the exit code.

    With ``processes`` = N > 1 this process binds the port with SO_REUSEPORT, starts its
    release, then starts the N - 1 other processes one by one (:func:`_start_processes`),
    each with its own store connection and in-process copies, binding the same port once
    its release is ready; it stops them when it stops, and stops (exit 1) when one of them
    dies. New points stay serialized across the processes by the store's cross-process
    locks, as across replicas."""
    say = on_event or (lambda msg: print(f"qveil serve: {msg}", file=sys.stderr, flush=True))
    check_transport(config)
    if config.processes > 1 and not sys.platform.startswith("linux"):
        raise InvalidArgument("--processes needs Linux (SO_REUSEPORT spreads the connections)")
    run = _Run(config, say)
    await run.health.set_serving(False)
    if not run.joining:  # processes 2..N bind once their release is ready
        await run.bind()
    try:
        run.rest = await _start_rest(config, run.plane, run.health, say)
    except BaseException:  # e.g. the REST port is taken: nothing was served yet
        await run.stop_server(0)
        run.executor.shutdown(wait=False)
        raise
    if config.port_file is not None:
        _write_port_file(config.port_file, run.port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    try:
        url = run.store_url(embedded=on_event is not None)
        waiter = asyncio.ensure_future(stop.wait())
        active = await run.start_release(url, waiter)
        if active is None:  # stopped while starting
            say("stopped before the release was ready")
            await run.stop_server(0)
            return 0
        await run.go_live(active, url, stop)
        lost: asyncio.Task[bool] | None = None
        if config.processes > 1:
            run.others = await _start_processes(config, run.host, run.port, stop, say)
            lost = loop.create_task(_watch_processes(run.others, stop, say))
        await waiter
        code = 1 if lost is not None and lost.done() and lost.result() else 0
        await run.drain_and_stop()
        return code
    except BaseException:
        if run.rest is not None:
            await run.rest.stop(0)
        await run.stop_server(0)
        raise
    finally:
        run.close()


class _Run:
    """One run of :func:`serve`: the services it serves and the steps of its life (bind,
    open the store and start the release, go live, drain and stop, close)."""

    def __init__(self, config: ServeConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self.say = say
        #: processes 2..N of --processes join the first process's port
        self.joining = config.parent_pid is not None
        self.authorizer = Authorizer(
            load_tokens(config.tokens_file) if config.tokens_file else None
        )
        self.metrics = Metrics()
        self.executor = new_executor(config.workers)
        self.services = Services.create(
            store=None,
            holder=_holder(),
            limits=config.limits,
            metrics=self.metrics,
            trusted_keys=tuple(config.trust_registry_key),
        )
        self.plane = DataPlane(self.services, self.authorizer, self.executor)
        self.health = Health()
        self.host, _ = split_host(config.listen)
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.rest: RestServer | None = None
        self.others: list[SpawnProcess] = []  # processes 2..N, started by the first process
        self.answers: AnswerLog | None = None

    async def bind(self) -> None:
        config = self.config
        self.server, self.port = create_server(
            self.plane,
            self.health,
            listen=config.listen,
            credentials=config.tls.credentials() if config.tls else None,
            reflection=config.reflection,
            max_message_bytes=config.max_message_bytes,
            reuse_port=config.processes > 1 or self.joining,
            join=self.joining,
        )
        await self.server.start()
        self.say(
            f"listening on {host_port(self.host, self.port)} "
            f"({'TLS' if config.tls else 'plaintext'}"
            f"{', mTLS' if config.tls and config.tls.client_ca else ''}, "
            f"{'tokens' if self.authorizer.enabled else 'no tokens: anonymous query only'})"
        )

    async def stop_server(self, grace: float) -> None:
        if self.server is not None:
            await self.server.stop(grace)

    def store_url(self, *, embedded: bool) -> str:
        """The store's URL (a relative SQLite path resolved against the bundle's directory),
        said with the permission warnings of the bundle and the store (``embedded``: logged
        as well, for an embedding caller's logs)."""
        config = self.config
        url = config.store_url or default_store_url(config.bundle)
        url, relative = resolve_store_url(url, config.bundle)
        if config.processes > 1 and url.startswith("memory:"):
            raise InvalidArgument(
                "--processes needs a shared store (SQLite or PostgreSQL): a memory store "
                "per process would keep a private answer log that nobody can audit"
            )
        self.say(
            f"store {_redact(url)}"
            + (
                f" (relative path resolved against the bundle's directory "
                f"{config.bundle.resolve().parent})"
                if relative
                else ""
            )
        )
        for warning in loose_permissions(config.bundle, url):
            self.say(warning)  # stderr under `qveil serve`, whose log lines go there as well
            if embedded:  # the caller's logs see it too
                log.warning("%s", warning)
        return url

    def _open_and_start(self, url: str) -> ActiveRelease:
        """Check the bundle and its receipt, open the store (the answer log's; created when
        new: it is a log, not the noise), start the answer log, then start the bundle's
        release (in the executor). A bundle that is refused opens nothing."""
        releases = self.services.releases
        loaded = releases.load(self.config.bundle)  # refused here before any file is created
        st = open_store(url, new_ok=True)
        self.services.ctx.store = st
        self.answers = self.services.start_answer_log(st)
        return releases.start(self.config.bundle, loaded=loaded)

    async def start_release(
        self, url: str, waiter: asyncio.Future[Literal[True]]
    ) -> ActiveRelease | None:
        """The started release, or None when ``waiter`` (the stop signal) came first."""
        loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(self.executor, self._open_and_start, url)
        first: set[asyncio.Future[ActiveRelease] | asyncio.Future[Literal[True]]]
        first = {starting, waiter}
        done, _ = await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if starting not in done:
            return None
        return starting.result()

    async def go_live(self, active: ActiveRelease, url: str, stop: asyncio.Event) -> None:
        """Bind (a joining process), health SERVING, the metrics endpoint, and say so."""
        config, releases = self.config, self.services.releases
        if self.joining:
            await self.bind()
            asyncio.get_running_loop().create_task(_watch_parent(config.parent_pid, stop))
        self.plane.ready = True
        await self.health.set_serving(True)
        if config.metrics_port is not None:
            mport = self.metrics.serve_prometheus(
                config.metrics_port,
                host=config.metrics_host,
                stored_points=releases.stored_points,
            )
            self.say(f"metrics on http://{host_port(config.metrics_host, mport)}/metrics")
        self.say(f"serving release {active.release_id} (answer log {_redact(url)})")
        rc = releases.last_receipt
        if rc is not None:
            self.say(
                f"charged to population {rc.population}: eps={rc.epsilon:.6g} "
                f"delta={rc.delta:.3g} (receipt of registry {rc.registry_id})"
            )
            self.say(releases.spending(rc.population))

    async def drain_and_stop(self) -> None:
        """Stop the other processes, drain (health NOT_SERVING for ``drain_delay``), refuse
        new calls, let the calls in flight finish within ``grace``, then stop both bindings."""
        config, loop = self.config, asyncio.get_running_loop()
        for p in self.others:  # they drain and stop alongside this one
            if p.is_alive():
                p.terminate()
        self.say("draining: health NOT_SERVING")
        self.services.ctx.holder.draining = True
        await self.health.drain()  # also ends open Watch streams, which would hold stop(grace)
        if config.drain_delay > 0:
            await asyncio.sleep(config.drain_delay)
        # grpc-core cancels (CANCELLED) every call that has reached it but not yet a handler
        # when server.stop() begins (grpc/grpc#41785). So first refuse new calls ourselves
        # with UNAVAILABLE while the event loop keeps matching them, let the calls in flight
        # finish, and only then stop; clients map the few calls still caught by the race
        # (reset before any handler ran, so never processed) to UNAVAILABLE too.
        # (v2 REST calls go through the data plane as well: refused and waited for alike.)
        self.plane.closing = True
        started = loop.time()
        await self.plane.wait_idle(config.grace)
        left = max(0.0, config.grace - (loop.time() - started))
        rest = self.rest
        await asyncio.gather(  # both bindings stop within what is left of --grace
            self.stop_server(left), *([rest.stop(left)] if rest is not None else [])
        )
        self.say("stopped")

    def close(self) -> None:
        """Wait for the other processes (kill a stuck one), the executor, close the store."""
        config = self.config
        for p in self.others:
            p.join(config.grace + config.drain_delay + 5)
            if p.is_alive():
                p.kill()
        self.executor.shutdown(wait=True)
        if self.answers is not None:
            self.answers.close(timeout=config.grace)
        st = self.services.ctx.opened_store
        if st is not None:
            st.close()


async def _start_processes(
    config: ServeConfig, host: str, port: int, stop: asyncio.Event, say: Callable[[str], None]
) -> list[SpawnProcess]:
    """Start processes 2..N of ``--processes N`` one after another (spawned, so no gRPC state
    is forked), each serving the same bundle and store on ``port`` (a joiner binds only once
    its release is ready: a connection never reaches a process that is still starting).
    Raises FailedPrecondition, with every started one stopped, when one does not start."""

    ctx = multiprocessing.get_context("spawn")
    child = replace(
        config,
        listen=host_port(host, port),
        processes=1,
        parent_pid=os.getpid(),
        port_file=None,
        metrics_port=None,
        http_port=None,
    )
    started: list[SpawnProcess] = []
    try:
        for k in range(2, config.processes + 1):
            ready = ctx.Event()
            p = ctx.Process(target=_process_main, args=(child, k, ready), daemon=False)
            p.start()
            started.append(p)
            while not ready.is_set():
                if not p.is_alive():
                    raise FailedPrecondition(
                        f"process {k} of --processes {config.processes} exited with code "
                        f"{p.exitcode} before serving (see its lines above)"
                    )
                if stop.is_set():
                    return started
                await asyncio.sleep(0.05)
        say(f"{config.processes} processes serving on {host_port(host, port)}")
        return started
    except BaseException:
        for p in started:
            p.terminate()
        for p in started:
            p.join(10)
        raise


async def _watch_processes(
    procs: list[SpawnProcess], stop: asyncio.Event, say: Callable[[str], None]
) -> bool:
    """Stop the server (True) when one of the other processes dies while serving."""
    while not stop.is_set():
        for k, p in enumerate(procs, start=2):
            if not p.is_alive():
                say(f"process {k} exited with code {p.exitcode}: stopping all processes")
                stop.set()
                return True
        await asyncio.sleep(0.5)
    return False


async def _watch_parent(parent: int | None, stop: asyncio.Event) -> None:
    """Stop this process (one of --processes 2..N) when the first process is gone."""
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(0.5)


def _process_main(
    config: ServeConfig, index: int, ready: multiprocessing.synchronize.Event
) -> None:
    """Entry point of process ``index`` of ``--processes N`` (a spawned interpreter)."""
    os.umask(0o077)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    def say(msg: str) -> None:
        print(f"qveil serve [{index}]: {msg}", file=sys.stderr, flush=True)
        if msg.startswith("serving release"):
            ready.set()

    try:
        code = asyncio.run(serve(config, on_event=say))
    except Exception as exc:  # noqa: BLE001 - one line, as the CLI prints it
        print(f"qveil serve [{index}]: error: {exc}", file=sys.stderr, flush=True)
        code = 2
    sys.exit(code)


async def _start_rest(
    config: ServeConfig, plane: DataPlane, health: Health, say: Callable[[str], None]
) -> RestServer | None:
    """The v2 REST binding (``--http-port``): 127.0.0.1 unless TLS is set, then the
    --listen host, with the same certificates."""
    if config.http_port is None:
        return None

    host = split_host(config.listen)[0] if config.tls is not None else "127.0.0.1"
    rest = await start_rest(
        plane,
        lambda: bool(health.serving),
        host=host,
        port=config.http_port,
        tls=config.tls,
        max_body_bytes=config.max_message_bytes,
    )
    scheme = "https" if config.tls is not None else "http"
    say(f"v2 REST on {scheme}://{host}:{rest.port}")
    return rest


def _holder() -> ReleaseHolder:
    return ReleaseHolder()


def _redact(url: str) -> str:
    """A store URL without its password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else url
    return url
