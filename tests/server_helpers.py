"""Helpers for the server/client tests: small real bundles, real `qveil serve` subprocesses
on 127.0.0.1 port 0 (the server writes its bound port to --port-file), an in-process grpc.aio
server on a background event loop (qveil.server.local: still real gRPC over loopback), token
files and test certificates (made with `cryptography`), and a query service with its answer log
over a SQLite store (:func:`serving_query`)."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import numpy as np
from cli_helpers import qveil_main

from qveil.server.governance.registry import Registry
from qveil.server.local import LocalServer

REPO = Path(__file__).resolve().parent.parent
QVEIL = str(Path(sys.executable).parent / "qveil")


def qveil(
    *argv: str,
    cwd: Path | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """The `qveil` CLI as a subprocess, its output captured as text."""
    return subprocess.run(
        [QVEIL, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


# ----------------------------------------------------------------------------- bundles
def make_bundle(
    path: Path,
    *,
    seed: int = 0,
    actions: int = 3,
    sigma: float = 2.0,
    interval: tuple[float, float] = (-1.0, 2.0),
    hidden: int = 16,
    bundle_id: str | None = None,
    home: Path | None = None,
) -> Path:
    """A small real bundle (:func:`make_uncharged_bundle`), charged to the test population
    and receipted (:func:`charge`) so that it can be served, in the registry of ``home``
    (default: this test's ``QVEIL_HOME``). ``bundle_id``: tests of a second bundle under an
    existing release id only."""
    out = make_uncharged_bundle(
        path,
        seed=seed,
        actions=actions,
        sigma=sigma,
        interval=interval,
        hidden=hidden,
        bundle_id=bundle_id,
    )
    charge(out, home=home)
    return out


def make_uncharged_bundle(
    path: Path,
    *,
    seed: int = 0,
    actions: int = 3,
    sigma: float = 2.0,
    interval: tuple[float, float] = (-1.0, 2.0),
    hidden: int = 16,
    bundle_id: str | None = None,
) -> Path:
    """A small real bundle (output mode: served Q clamped to the card's bound), written by
    qveil.bundle.write_bundle with privacy numbers from qveil.privacy.account, its noise key
    seeded by ``seed``; recorded in no registry and without a receipt."""
    from qveil.bundle import lipschitz_bound
    from qveil.privacy import E3_SETTINGS

    rng = np.random.default_rng(seed)
    w = {
        "W0": rng.normal(size=(hidden, 1)) * 2,
        "b0": rng.normal(size=hidden),
        "W1": rng.normal(size=(actions, hidden)) * 0.5,
        "b1": rng.normal(size=actions),
    }
    return write_output_bundle(
        path,
        w,
        seed=seed,
        actions=actions,
        lipschitz=max(lipschitz_bound(w), 1.0),
        sigma=sigma,
        settings=E3_SETTINGS,
        env_id="LineWalk-v0",
        interval=interval,
        hyperparameters={"made_by": "tests/server_helpers.py", "seed": seed},
        extra=None if bundle_id is None else {"bundle_id": bundle_id},
        config_toml="# test bundle\n",
        learning_curve_png=b"",
    )


def charge(bundle: Path, *, population: str | None = None, home: Path | None = None) -> str:
    """Charge a bundle written through the Python API to ``population`` (default: the test
    population, declared on demand) in the registry of ``home`` (default: this test's
    ``QVEIL_HOME``) and write that registry's signed receipt into it, as ``qveil train`` does:
    what ``qveil serve`` requires. Returns the receipt line."""
    from qveil.server.governance.release_records import open_release_records

    name = population or TEST_POPULATION
    ensure_population(name, home=home)
    url = None if home is None else f"sqlite:///{home / 'registry.sqlite'}"
    with open_release_records(url, actor="tests") as rec:
        rec.record_release(bundle, population=name)
        return rec.issue_receipt(bundle)


def small_network_bundle(
    path: Path,
    *,
    weights_seed: int,
    sigma: float,
    interval: tuple[float, float],
    env_id: str = "LineWalk-v0",
) -> Path:
    """A tiny d = 1 output-mode network release: 2 actions, 4 hidden units drawn with
    ``weights_seed``, Lipschitz bound 2, accountant settings E3, noise key seeded by 0.
    Not charged: :func:`charge` it to serve it."""
    from qveil.privacy import E3_SETTINGS

    rng = np.random.default_rng(weights_seed)
    w = {
        "W0": rng.uniform(-1, 1, (4, 1)),
        "b0": rng.uniform(-1, 1, 4),
        "W1": rng.uniform(-1, 1, (2, 4)) / 4,
        "b1": np.zeros(2),
    }
    return write_output_bundle(
        path, w, actions=2, lipschitz=2.0, sigma=sigma, settings=dict(E3_SETTINGS),
        env_id=env_id, interval=interval, hyperparameters={}, config_toml="",
        learning_curve_png=b"",
    )  # fmt: skip


def write_output_bundle(
    path: Path,
    weights: dict[str, Any],
    *,
    seed: int = 0,
    actions: int,
    lipschitz: float,
    sigma: float,
    settings: dict[str, Any],
    env_id: str,
    interval: tuple[float, float],
    hyperparameters: dict[str, Any],
    config_toml: str,
    learning_curve_png: bytes,
    extra: dict[str, Any] | None = None,
) -> Path:
    """The seeded output-mode bundle of an MLP's ``weights`` with ``actions`` outputs: privacy
    numbers from qveil.privacy.account with ``sigma`` and the accountant ``settings`` (all but
    mode, sigma, lipschitz and actions), a one-row training log, its noise key seeded by
    ``seed``. Not charged: :func:`charge` it to serve it."""
    from qveil.bundle import build_card, write_bundle
    from qveil.keyed import seeded_key
    from qveil.privacy import PrivacyParams, account

    params = PrivacyParams(
        mode="output",
        sigma=sigma,
        **{**settings, "lipschitz": lipschitz, "actions": actions},
    )
    card = build_card(
        env_id=env_id,
        interval=interval,
        actions=actions,
        hyperparameters=hyperparameters,
        privacy_result=account(params),
        lipschitz=lipschitz,
        seeded=True,
        extra=extra,
    )
    return write_bundle(
        path,
        card=card,
        weights=weights,
        config_toml=config_toml,
        training_log_rows=[{"episode": 0, "return": 0.0}],
        learning_curve_png=learning_curve_png,
        noise_key=seeded_key(seed),
    )


def make_cartpole_kernel_bundle(d: Path, *, seed: int) -> tuple[Path, str]:
    """(bundle, train's stdout): 200 CartPole users collected with ``seed`` and trained by
    the CLI's entry point in this process (cli_helpers.qveil_main: the real commands without
    two interpreter start-ups; `qveil dataset collect` and `qveil train` run as processes in
    their own tests) with configs/cartpole-private.toml at epsilon 1 (a d = 4 kernel fqi
    release, receipted by the registry it was trained with: serve a :func:`fresh_bundle` copy
    per test)."""
    config = str(Path(__file__).resolve().parents[1] / "configs" / "cartpole-private.toml")
    pop = ensure_population()
    steps = (
        ["dataset", "collect", "--env", "CartPole-v1", "--users", "200", "--seed", str(seed)]
        + ["--reward-range", "0,1", "--out", str(d / "cp.npz"), "--no-progress"],
        ["train", "--mode", "fqi", "--dataset", str(d / "cp.npz"), "--config", config]
        + ["--epsilon", "1", "--delta", "1e-5", "--out", str(d / "bundle"), *pop],
    )
    for argv in steps:
        r = qveil_main(*argv, cwd=d)
        assert r.returncode == 0, r.stderr
    return d / "bundle", r.stdout


def fresh_bundle(src: Path, dest: Path) -> Path:
    """A copy of a template bundle for one test's own world: the suite gives every test its
    own registry (``QVEIL_HOME``, tests/conftest.py) and the test gives the copy its own
    store. The copy is charged in this test's registry (a new receipt; the key and the
    answers are the template's, as for any copy)."""
    import shutil

    from qveil.bundle import RECEIPT_FILE

    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(RECEIPT_FILE))
    charge(dest)
    return dest


@contextmanager
def registry_home(home: Path) -> Iterator[Path]:
    """``QVEIL_HOME`` set to ``home`` inside the block (a module's own registry, for a bundle
    trained once per module), restored after."""
    old = os.environ.get("QVEIL_HOME")
    os.environ["QVEIL_HOME"] = str(home)
    try:
        yield home
    finally:
        if old is None:
            os.environ.pop("QVEIL_HOME", None)
        else:
            os.environ["QVEIL_HOME"] = old


#: The population the suite's releases are charged to (a large budget, declared on demand).
TEST_POPULATION = "test-users"


def ensure_population(name: str = TEST_POPULATION, *, home: Path | None = None) -> list[str]:
    """Declare ``name`` (epsilon 1e7, delta 0.5) in the registry of ``home`` (default: this
    test's ``QVEIL_HOME``) unless it is declared; returns the flags that name it."""
    import os

    from qveil.server.governance.registry import open_registry

    url = None if home is None else f"sqlite:///{home / 'registry.sqlite'}"
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
    elif not os.environ.get("QVEIL_HOME"):
        raise AssertionError("QVEIL_HOME is not set (tests/conftest.py sets it)")
    with open_registry(url) as reg:
        if reg.ledger.cap(name) is None:
            reg.ledger.set_cap(name, cap_epsilon=1e7, cap_delta=0.5, actor="tests")
    return ["--population", name]


def registry_key(home: Path | None = None) -> str:
    """The public key of the registry of ``home`` (default: this test's ``QVEIL_HOME``), as
    ``qveil budget registry-key`` prints it: what ``qveil serve --trust-registry-key`` takes."""
    env = None if home is None else {**os.environ, "QVEIL_HOME": str(home)}
    r = qveil("budget", "registry-key", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", key), key
    return key


def served_values(bundle: Path | Any, states: Any, actions: Any = None) -> np.ndarray:
    """What a server of ``bundle`` (a directory or a loaded bundle) answers for raw
    ``states`` (n states, [n] for d = 1 or [n, d]), computed here from the bundle's key:
    ``qveil.answer.released_values`` at the states clipped into the box, [n, len(actions)]
    (all actions by default)."""
    from qveil.answer import released_values
    from qveil.bundle import load_bundle

    b = load_bundle(bundle) if isinstance(bundle, str | Path) else bundle
    raw = np.asarray(states, dtype=np.float64).reshape(-1, int(b.dims))
    return released_values(b, b.box.to_unit(raw, clip=True), actions)


def grid_states(bundle: Path | Any, states: Any) -> np.ndarray:
    """Raw ``states`` of ``bundle`` as the answer log keys them: clipped into the box, mapped
    onto [0, 1] and snapped to the release's grid (``qveil.keyed.snap``), [n, d]."""
    from qveil.bundle import load_bundle
    from qveil.keyed import snap

    b = load_bundle(bundle) if isinstance(bundle, str | Path) else bundle
    raw = np.asarray(states, dtype=np.float64).reshape(-1, int(b.dims))
    return snap(b.box.to_unit(raw, clip=True))[1]


def logged_points(url: str, release_id: str) -> dict[int, dict[float, float]]:
    """The answer log of ``release_id`` in the store at ``url``, read from the database:
    path -> {unit state: logged noise value}."""
    from qveil.server.store import open_store

    with open_store(url, create=False) as st:
        rec = st.releases.get_release(release_id)
        return {
            p: {float(q.x): float(q.g) for q in st.iter_points(release_id, p)}
            for p in range(rec.n_paths)
        }


# ----------------------------------------------------------------------------- tokens
@dataclass
class Tokens:
    path: Path
    query: str
    admin: str
    auditor: str

    def of(self, role: str | None) -> str | None:
        return None if role is None else getattr(self, role)


def make_tokens(path: Path) -> Tokens:
    from qveil.server.serving.auth import add_token

    return Tokens(
        path, add_token(path, "query"), add_token(path, "admin"), add_token(path, "auditor")
    )


# ----------------------------------------------------------------------------- certificates
@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def mtls_flags(self) -> list[str]:
        """`qveil serve` flags: TLS with the server certificate, and client certificates
        required, signed by the CA."""
        return [
            "--tls-cert",
            str(self.server_cert),
            "--tls-key",
            str(self.server_key),
            "--tls-client-ca",
            str(self.ca),
        ]

    def client_credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials that trust the CA and present the client certificate."""
        return grpc.ssl_channel_credentials(
            self.ca.read_bytes(), self.client_key.read_bytes(), self.client_cert.read_bytes()
        )


# long-function: the CA, server and client certificates are built together, each from the CA
def make_certs(d: Path) -> Certs:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def key() -> Any:
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(k: Any, p: Path) -> Path:
        p.write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return p

    def write_cert(c: Any, p: Path) -> Path:
        p.write_bytes(c.public_bytes(serialization.Encoding.PEM))
        return p

    ca_key = key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("qveil test CA"))
        .issuer_name(name("qveil test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: Any, san: list[Any] | None) -> tuple[Any, Any]:
        k = key()
        b = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca.subject)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(ca_key, hashes.SHA256()), k

    srv, srv_key = leaf(
        "localhost",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    cli, cli_key = leaf("qveil test client", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    d.mkdir(parents=True, exist_ok=True)
    return Certs(
        ca=write_cert(ca, d / "ca.pem"),
        server_cert=write_cert(srv, d / "server.pem"),
        server_key=write_key(srv_key, d / "server-key.pem"),
        client_cert=write_cert(cli, d / "client.pem"),
        client_key=write_key(cli_key, d / "client-key.pem"),
    )


# ----------------------------------------------------------------------------- subprocess
@dataclass
class ServerProcess:
    """A running `qveil serve` subprocess."""

    proc: subprocess.Popen[str]
    port: int
    log: Path
    args: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def rest_url(self, scheme: str = "http") -> str:
        """The v2 REST base URL the server logged at start (``--http-port``)."""
        m = re.search(rf"v2 REST on {scheme}://127\.0\.0\.1:(\d+)", self.output())
        assert m, self.output()
        return f"{scheme}://127.0.0.1:{m.group(1)}"

    def terminate(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not stop on SIGTERM:\n{self.output()}") from None


def start_server(
    tmp: Path,
    bundle: Path,
    *extra: str,
    store: str | None = None,
    wait_serving: bool = True,
    timeout: float = 30.0,
    health_creds: grpc.ChannelCredentials | None = None,
    name: str = "server",
    home: Path | None = None,
) -> ServerProcess:
    """Start `qveil serve --listen 127.0.0.1:0 --port-file F ...`; wait for the port file and
    (by default) for health SERVING. ``home``: the server's ``QVEIL_HOME`` (its registry;
    default: this test's)."""
    port_file = tmp / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log = tmp / f"{name}.log"
    args = [
        QVEIL,
        "serve",
        "--bundle",
        str(bundle),
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
        *extra,
    ]
    if store:
        args += ["--store", store]
    fh = log.open("w")
    proc = subprocess.Popen(
        args,
        stdout=fh,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **({} if home is None else {"QVEIL_HOME": str(home)}),
        },
    )
    fh.close()
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise AssertionError(f"qveil serve exited {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"qveil serve did not bind:\n{log.read_text()}")
        time.sleep(0.02)
    sp = ServerProcess(proc, int(port_file.read_text()), log, args)
    if wait_serving:
        wait_health(
            sp.target, "SERVING", timeout=deadline - time.monotonic(), creds=health_creds, proc=sp
        )
    return sp


def health_status(
    target: str,
    service: str = "",
    *,
    creds: grpc.ChannelCredentials | None = None,
    options: list[tuple[str, Any]] | None = None,
) -> str:
    """The standard health client: grpc_health.v1 Health/Check -> status name."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ch = (
        grpc.secure_channel(target, creds, options=options or [])
        if creds
        else grpc.insecure_channel(target)
    )
    with ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def wait_health(
    target: str,
    want: str,
    *,
    timeout: float = 20.0,
    creds: grpc.ChannelCredentials | None = None,
    proc: ServerProcess | None = None,
) -> list[str]:
    """Poll Health/Check until it answers ``want``; returns the statuses seen."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    opts = [("grpc.ssl_target_name_override", "localhost")] if creds else None
    while True:
        try:
            s = health_status(target, creds=creds, options=opts)
        except grpc.RpcError as exc:
            s = f"error:{exc.code().name}"
        if not seen or seen[-1] != s:
            seen.append(s)
        if s == want:
            return seen
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"server exited {proc.proc.returncode}:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"health never became {want}: saw {seen}")
        time.sleep(0.05)


# ----------------------------------------------------------------------------- in-process
#: the real grpc.aio server on a background event loop over a real store
#: (qveil.server.local)
InProcessServer = LocalServer


class Served(NamedTuple):
    """A running in-process server (qveil.server.local) of ``bundle`` over a SQLite
    store, asking for the tokens of ``tokens``."""

    server: LocalServer
    tokens: Tokens
    bundle: Path

    @property
    def target(self) -> str:
        """The server's gRPC address (127.0.0.1:port)."""
        return self.server.target

    def md(self, role: str) -> list[tuple[str, str]]:
        """The call metadata carrying ``role``'s token."""
        return [("authorization", f"Bearer {self.tokens.of(role)}")]


@contextmanager
def running(tmp: Path, bundle: Path, *extra: str, **kw: Any) -> Iterator[ServerProcess]:
    sp = start_server(tmp, bundle, *extra, **kw)
    try:
        yield sp
    finally:
        sp.terminate()


@contextmanager
def serving_with_tokens(
    tmp: Path, bundle: Path, *extra: str, **kw: Any
) -> Iterator[tuple[ServerProcess, Tokens]]:
    """A server of ``bundle`` that asks for the tokens of a fresh tokens file in ``tmp``."""
    tokens = make_tokens(tmp / "tokens.toml")
    with running(tmp, bundle, "--tokens-file", str(tokens.path), *extra, **kw) as sp:
        yield sp, tokens


@contextmanager
def serving_query(
    tmp: Path, *, log: bool = True, **limits: object
) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(query service, store, answer log or None, loaded bundle) on a fresh SQLite store
    serving a 3-action bundle on [-1, 2] (seeded key), the answer log wired as ``qveil
    serve`` wires it; the log and the store are closed after."""
    from qveil.bundle import load_bundle
    from qveil.server.serving.answer_log import AnswerLog
    from qveil.server.serving.limits import Limits
    from qveil.server.serving.services import Services
    from qveil.server.store import open_store

    bundle = make_bundle(tmp / "bundle", seed=5, actions=3, hidden=16)
    st = open_store(f"sqlite:///{tmp / 'store.sqlite'}")
    answer_log = None
    try:
        lim = Limits(**limits)  # type: ignore[arg-type]
        services = Services.create(store=st, limits=lim)
        services.releases.start(bundle)
        if log:
            answer_log = AnswerLog(st, max_points=lim.max_stored_points)
            answer_log.start()
            services.query.log = answer_log
        yield services.query, st, answer_log, load_bundle(bundle)
    finally:
        if answer_log is not None:
            answer_log.close()
        st.close()


class ModuleRegistry(NamedTuple):
    """A registry of the test module's own (``home``: its QVEIL_HOME) and a bundle charged in
    it: tests charge their bundles there (``server_helpers.charge(b, home=home)``) and give
    ``registry`` to ``Services.create``, instead of a new registry per test."""

    home: Path
    registry: Registry
    bundle: Path
