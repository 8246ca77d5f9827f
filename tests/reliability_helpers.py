"""Shared by the system-level reliability suite: real server subprocesses, kills,
health waits, process memory, and a results file that scripts/reliability.sh turns into
docs/reliability.md.

Quick form (default, inside `make test`) vs full form (`make reliability`, which sets
QVEIL_RELIABILITY=full): every test reads its sizes through ``scale(quick, full)``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_helpers import fresh_bundle, served_values, write_output_bundle

T = TypeVar("T")

FULL = os.environ.get("QVEIL_RELIABILITY", "").lower() == "full"
#: JSON-lines file the tests append their numbers to (set by scripts/reliability.sh).
RESULTS = os.environ.get("QVEIL_RELIABILITY_RESULTS")


def scale(quick: T, full: T) -> T:
    """``full`` under QVEIL_RELIABILITY=full, else ``quick``."""
    return full if FULL else quick


def report(name: str, **numbers: object) -> None:
    """Record one test's numbers for docs/reliability.md (no-op without the results file)."""
    line = {"name": name, "form": "full" if FULL else "quick", **numbers}
    print(f"[reliability] {json.dumps(line, default=str)}")
    if RESULTS:
        with open(RESULTS, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str) + "\n")


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the server binds it with SO_REUSEPORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def health_status(target: str, *, timeout: float = 1.0) -> str:
    """grpc.health.v1 status name of the whole server, or the error code name."""
    try:
        with grpc.insecure_channel(target) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    except grpc.RpcError as exc:
        return str(exc.code().name)


def serve_argv(
    *, bundle: str | os.PathLike[str], store: str, port: int, extra: Sequence[str] = ()
) -> list[str]:
    """The `qveil serve` command line (run with this interpreter, not a PATH lookup).

    The reliability suite floods the server with states from one host on purpose (crash,
    drain and fault tests), so the per-caller state budget (tested in
    tests/unit/server/test_server_serving_quotas.py and tests/integration/test_quota_backoff.py) is
    lifted unless ``extra`` sets ``--state-rate`` (or its alias ``--new-state-rate``)."""
    if "--state-rate" not in extra and "--new-state-rate" not in extra:
        extra = [*extra, "--state-rate", "1e12"]
    return [
        sys.executable,
        "-m",
        "qveil.cli",
        "serve",
        "--bundle",
        str(bundle),
        "--store",
        store,
        "--listen",
        f"127.0.0.1:{port}",
        *extra,
    ]


@dataclass
class ServerProc:
    """One real `qveil serve` subprocess on 127.0.0.1:port, restartable on the same port."""

    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> ServerProc:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.starts += 1
        if wait:
            self.wait_serving(timeout=timeout)
        return self

    def wait_serving(self, *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        status = "?"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode} before serving;"
                    f" log:\n{self.log_tail()}"
                )
            status = health_status(self.target, timeout=0.5)
            if status == "SERVING":
                return
            time.sleep(0.05)
        raise TimeoutError(
            f"server not SERVING after {timeout}s (last: {status}); log:\n{self.log_tail()}"
        )

    def kill(self) -> int:
        """SIGKILL and reap; returns the exit code (-9)."""
        return self._signal(signal.SIGKILL, timeout=10.0)

    def terminate(self, *, timeout: float = 30.0) -> int:
        """SIGTERM (graceful drain) and wait; returns the exit code."""
        return self._signal(signal.SIGTERM, timeout=timeout)

    def _signal(self, sig: int, *, timeout: float) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self.exit_codes.append(code)
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss(self) -> int:
        return rss_bytes(self.pid) if self.alive() else 0

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Best-effort cleanup (tests call it in finally)."""
        if self.alive():
            self.terminate(timeout=15.0)


def start_server(
    tmp: Path,
    *,
    bundle: str | os.PathLike[str],
    store: str,
    extra: Sequence[str] = (),
    name: str = "server",
    port: int | None = None,
    wait: bool = True,
    env: dict[str, str] | None = None,
) -> ServerProc:
    """Start `qveil serve` on loopback; returns once it reports SERVING (when ``wait``)."""
    port = port or free_port()
    srv = ServerProc(
        argv=serve_argv(bundle=bundle, store=store, port=port, extra=extra),
        port=port,
        log_path=tmp / f"{name}.log",
        env=env,
    )
    return srv.start(wait=wait)


def replicas(
    tmp: Path, n: int, *, bundle: str | os.PathLike[str], store: str, extra: Sequence[str] = ()
) -> list[ServerProc]:
    """``n`` `qveil serve` replicas (not started) of one bundle on one store, each on a free
    port, logging to ``tmp / "replica<i>.log"``."""
    out = []
    for i in range(n):
        port = free_port()
        out.append(
            ServerProc(
                argv=serve_argv(bundle=bundle, store=store, port=port, extra=extra),
                port=port,
                log_path=tmp / f"replica{i}.log",
            )
        )
    return out


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def tmpfs_mount(path: Path, *, size: str) -> bool:
    """Mount a tmpfs of ``size`` at ``path`` (root only); False when mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.returncode == 0


def tmpfs_remount(path: Path, options: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True, text=True
    )


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill_filesystem(path: Path) -> Path:
    """Write a ballast file under ``path`` until the filesystem is full; returns it."""
    ballast = path / "ballast.bin"
    chunk = b"\0" * 65536
    with open(ballast, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
                fh.flush()
        except OSError:
            pass
        small = b"\0" * 512
        try:
            while True:
                fh.write(small)
                fh.flush()
        except OSError:
            pass
    return ballast


def make_bundle(
    path: Path,
    *,
    sigma: float = 1.0,
    beta: float = 20.0,
    actions: int = 2,
    interval: tuple[float, float] = (-1.0, 1.0),
    seed: int = 0,
) -> Path:
    """A small, valid release bundle (random 1-8-m ReLU network, output-mode card from the real
    accountant with the given sigma and kernel rate beta; its noise key seeded by ``seed``,
    ``seeded: true``), not charged: :func:`bundle_for_test` copies and charges it. Seconds,
    not a training run: the suite tests the server and its log, not the trainer."""
    import numpy as np

    from qveil.bundle import lipschitz_bound

    rng = np.random.default_rng(seed)
    weights = {
        "W0": rng.normal(size=(8, 1)) * 0.5,
        "b0": rng.normal(size=8) * 0.1,
        "W1": rng.normal(size=(actions, 8)) * 0.3,
        "b1": np.zeros(actions),
    }
    settings = {
        "delta": 1e-5,
        "samples": 1000,
        "batch_size": 32,
        "lr": 0.05,
        "k": 1.0,
        "resets": 1,
        "gamma": 0.9,
        "reward_bound": 1.0,
        "beta": beta,
    }
    return write_output_bundle(
        path,
        weights,
        actions=actions,
        lipschitz=max(1.0, lipschitz_bound(weights)) * 1.01,
        sigma=sigma,
        settings=settings,
        env_id="qveil/LineWalk-v0",
        interval=interval,
        seed=seed,
        hyperparameters={"made_by": "tests/reliability_helpers.make_bundle"},
        config_toml="# reliability tests\n",
        learning_curve_png=_tiny_png(),
    )


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG (no training curve to plot; spares importing matplotlib)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00\x80")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


_SHARED_BUNDLE: list[Path] = []


def shared_bundle(factory: object) -> Path:
    """One test bundle (sigma 1, beta 20, 2 actions, states in [-1, 1]) for the whole session,
    not charged and never served itself: every test serves a copy (:func:`bundle_for_test`)
    charged in its own registry."""
    if not _SHARED_BUNDLE:
        path = factory.mktemp("bundle") / "bundle"  # type: ignore[attr-defined]
        _SHARED_BUNDLE.append(make_bundle(path))
    return _SHARED_BUNDLE[0]


def bundle_for_test(factory: object, tmp: Path) -> Path:
    """A copy of the shared bundle (the same key: the same answers), charged and receipted
    in this test's registry (``QVEIL_HOME``) so that its servers serve it."""
    return fresh_bundle(shared_bundle(factory), tmp / "release-bundle")


# --- clients that record every answer ------------------------------------------------------

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
]


@contextmanager
def value_stubs(targets: Sequence[str]) -> Iterator[list[Any]]:
    """A ValueService stub per target, each on a channel of its own with quick reconnects
    (:data:`CHANNEL_OPTIONS`), the channels closed when the block ends."""
    from qveil.v1 import value_service_pb2_grpc as vgrpc

    channels = [grpc.insecure_channel(t, options=CHANNEL_OPTIONS) for t in targets]
    try:
        yield [vgrpc.ValueServiceStub(ch) for ch in channels]
    finally:
        for ch in channels:
            ch.close()


class AnswerBook:
    """Every (state, action) -> value any client received, thread-safe. A second answer for
    the same key must be identical (checked on the spot: ``conflicts``)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.values: dict[tuple[float, int], float] = {}
        self.release_ids: set[str] = set()
        self.conflicts: list[tuple[float, int, float, float]] = []
        self.codes: dict[str, int] = {}
        self.repeats_checked = 0

    def add(
        self,
        release_id: str,
        states: Sequence[float],
        actions: Sequence[int],
        values: Sequence[float],
    ) -> None:
        m = len(actions)
        with self._lock:
            self.release_ids.add(release_id)
            self.codes["OK"] = self.codes.get("OK", 0) + 1
            for i, s in enumerate(states):
                for j, a in enumerate(actions):
                    v = float(values[i * m + j])
                    prev = self.values.setdefault((float(s), int(a)), v)
                    if prev != v:
                        self.conflicts.append((float(s), int(a), prev, v))
                    elif prev is not v:
                        self.repeats_checked += 1

    def error(self, code: str) -> None:
        with self._lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def states(self) -> list[float]:
        with self._lock:
            return sorted({s for s, _ in self.values})

    def sample_known(self, rng: object, n: int) -> list[float]:
        with self._lock:
            keys = list(self.values.keys()) if n else []
        if not keys:
            return []
        idx = rng.integers(len(keys), size=n)  # type: ignore[attr-defined]
        return [keys[int(i)][0] for i in idx]


def get_values(
    stub: object,
    states: Sequence[float],
    *,
    actions: Sequence[int] = (),
    timeout: float = 20.0,
    metadata: object = None,
) -> object:
    from qveil.v1 import value_service_pb2 as vpb

    return stub.GetValues(  # type: ignore[attr-defined]
        vpb.GetValuesRequest(states=list(states), actions=list(actions)),
        timeout=timeout,
        metadata=metadata,
    )


def release_info(target: str, *, timeout: float = 10.0) -> object:
    from qveil.v1 import value_service_pb2 as vpb
    from qveil.v1 import value_service_pb2_grpc as vgrpc

    with grpc.insecure_channel(target) as ch:
        return (
            vgrpc.ValueServiceStub(ch).GetRelease(vpb.GetReleaseRequest(), timeout=timeout).release
        )


def query_worker(
    book: AnswerBook,
    targets: Sequence[str],
    stop: object,
    *,
    seed: int,
    low: float,
    high: float,
    n_new: int = 16,
    n_known: int = 8,
    band: tuple[float, float] | None = None,
    pause: float = 0.0,
    expected: frozenset[str] = frozenset({"UNAVAILABLE"}),
    unexpected: list[str] | None = None,
) -> None:
    """Stream GetValues calls (all actions) with ``n_new`` fresh states and ``n_known``
    already-answered ones until ``stop`` is set. On an error code in ``expected`` the call is
    counted and the worker moves to the next target (failover); any other error is recorded in
    ``unexpected``. States are drawn in ``band`` (default: the whole interval)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lo, hi = band if band is not None else (low, high)
    with value_stubs(targets) as stubs:
        k = seed % len(stubs)
        while not stop.is_set():  # type: ignore[attr-defined]
            states = rng.uniform(lo, hi, size=n_new).tolist() + book.sample_known(rng, n_known)
            try:
                reply = get_values(stubs[k], states, timeout=20.0)
            except grpc.RpcError as exc:
                code = exc.code().name
                book.error(code)
                if code not in expected and unexpected is not None:
                    unexpected.append(f"{targets[k]}: {code}: {exc.details()}")
                k = (k + 1) % len(stubs)
                time.sleep(0.05)
                continue
            book.add(reply.release_id, states, list(reply.actions), list(reply.values))
            if pause:
                time.sleep(pause)


def query_workers(
    book: AnswerBook,
    targets: Sequence[str],
    stop: threading.Event,
    *,
    clients: int,
    seed: int,
    **kwargs: object,
) -> list[threading.Thread]:
    """``clients`` daemon threads (not started) each running :func:`query_worker` on
    ``targets``, with seeds ``seed``, ``seed + 1``, ... and the other ``kwargs``."""
    return [
        threading.Thread(
            target=query_worker,
            args=(book, list(targets), stop),
            kwargs=dict(kwargs, seed=seed + i),
            daemon=True,
        )
        for i in range(clients)
    ]


def kill_under_load(
    srv: ServerProc,
    workers: Sequence[threading.Thread],
    stop: threading.Event,
    *,
    kills: int,
    rnd: random.Random,
    gap: tuple[float, float],
) -> list[int]:
    """Start ``workers``, then ``kills`` times: wait a random time in ``gap`` seconds, SIGKILL
    the server and start it again; finally stop and join the workers. Returns the exit codes
    of the killed processes."""
    codes = []
    try:
        for w in workers:
            w.start()
        for _ in range(kills):
            time.sleep(rnd.uniform(*gap))
            codes.append(srv.kill())
            srv.start()
        time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    return codes


def assert_answers_kept(
    book: AnswerBook, unexpected: Sequence[str], target: str, *, min_ok: int
) -> int:
    """Repeated answers never differed, no error but UNAVAILABLE, more than ``min_ok`` calls
    answered, and every answer is the same when asked again (:func:`recheck`). Returns how
    many answers were rechecked."""
    assert not book.conflicts, f"repeated answers differed: {book.conflicts[:5]}"
    assert not unexpected, f"errors other than UNAVAILABLE: {unexpected[:5]}"
    assert book.codes.get("OK", 0) > min_ok, f"too few answered calls: {book.codes}"
    checked, mismatches = recheck(book, target)
    assert not mismatches, (
        f"{len(mismatches)} of {checked} answers changed after the kills, e.g. {mismatches[:5]}"
    )
    return checked


def recheck(book: AnswerBook, target: str, *, batch: int = 1000) -> tuple[int, list[object]]:
    """Ask ``target`` again for every recorded (state, action); returns (values compared,
    mismatches as (state, action, recorded, now))."""
    from qveil.v1 import value_service_pb2_grpc as vgrpc

    states = book.states()
    mism: list[object] = []
    n = 0
    with grpc.insecure_channel(target) as ch:
        stub = vgrpc.ValueServiceStub(ch)
        for i in range(0, len(states), batch):
            chunk = states[i : i + batch]
            reply = get_values(stub, chunk, timeout=60.0)
            acts = list(reply.actions)
            for r, s in enumerate(chunk):
                for c, a in enumerate(acts):
                    key = (s, a)
                    if key in book.values:
                        n += 1
                        now = float(reply.values[r * len(acts) + c])
                        if now != book.values[key]:
                            mism.append((s, a, book.values[key], now))
    return n, mism


def run_audit(
    store_url: str, *extra: str, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """`qveil audit --store URL [extra]` (the admin/audit part's command) as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "qveil.cli", "audit", "--store", store_url, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: the law test's level in :func:`audit_with_key` (Bonferroni over its 4 p-values: a correct
#: log fails with probability < 1e-6; the points logged in a run depend on its timing)
LAW_LEVEL = 2e-7


def audit_with_key(store_url: str, bundle: Path) -> dict[str, Any]:
    """Audit the answer log of ``bundle``'s release in ``store_url``:

    * ``qveil audit --store URL --bundle DIR --json``: every path's integrity (hash chains,
      sequence, no state twice) and EVERY logged value recomputed from the release's key,
      bit for bit; the ledger and the audit log chains. These are asserted. Its law test
      runs at the CLI's pass level (0.001 per audit), too high a false-alarm rate for a run
      whose logged points depend on timing, so its verdict is returned, not asserted;
    * the same audit in process at :data:`LAW_LEVEL`, which must pass, with power: every
      tested path rejects sigma x 1.3.

    Returns numbers for :func:`report`."""
    from qveil.bundle import load_bundle
    from qveil.server.governance.admin_db import admin_db_for
    from qveil.server.governance.audit import audit_store
    from qveil.server.store import open_store

    b = load_bundle(bundle)
    r = run_audit(store_url, "--bundle", str(bundle), "--json", "--no-record")
    assert r.returncode in (0, 1), f"audit failed to run:\n{r.stdout[-2000:]}\n{r.stderr}"
    rep = json.loads(r.stdout)
    assert rep["ledger"]["ok"] and rep["audit_log"]["ok"], rep["failures"]
    (rel,) = [x for x in rep["releases"] if x["release_id"] == b.bundle_id]
    assert rel["integrity_ok"] and rel["key_checked"], r.stdout[-3000:]
    assert all(a["key_checked"] for a in rel["actions"] if a["count"]), r.stdout[-3000:]
    store = open_store(store_url, create=False)
    try:
        db = admin_db_for(store, store_url)
        law = audit_store(
            store,
            db,
            release_id=b.bundle_id,
            level=LAW_LEVEL,
            record=False,
            keys={b.bundle_id: b.noise_paths},
        )
        db.close()
    finally:
        store.close()
    (ra,) = law.releases
    assert ra.passed, [a.problems for a in ra.actions]
    tested = [a for a in ra.actions if a.tested]
    assert all(a.power and a.power["rescaled_rejected"] for a in tested), [a.power for a in tested]
    return {
        "logged_points": sum(a["count"] for a in rel["actions"]),
        "cli_passed": bool(rep["passed"]),
        "law_passed_at": LAW_LEVEL,
        "paths_tested": len(tested),
    }


def assert_answers_are_the_keys(book: AnswerBook, bundle: Path) -> int:
    """Every answer any client received is the release's value computed here from the
    bundle's key (``qveil.answer.released_values``), bit for bit. Returns how many."""
    states = book.states()
    if not states:
        return 0
    want = served_values(bundle, states)
    with book._lock:
        got = dict(book.values)
    bad = [
        (s, a, v, float(want[i, a]))
        for i, s in enumerate(states)
        for a in range(want.shape[1])
        if (v := got.get((s, a))) is not None and v != float(want[i, a])
    ]
    assert not bad, f"{len(bad)} answers are not the key's, e.g. {bad[:5]}"
    return sum(1 for k in got if k[1] < want.shape[1])


def logged_states(store_url: str, bundle: Path) -> dict[int, set[float]]:
    """The unit states the answer log holds for each path of ``bundle``'s release."""
    from qveil.bundle import load_bundle
    from qveil.server.store import open_store

    b = load_bundle(bundle)
    store = open_store(store_url, create=False)
    try:
        return {
            a: {float(p.x) for p in store.iter_points(b.bundle_id, a)} for a in range(b.n_actions)
        }
    finally:
        store.close()


def unlogged_answers(book: AnswerBook, store_url: str, bundle: Path) -> list[tuple[float, int]]:
    """(state, action) answered (in ``book``) whose snapped unit state is not in the log."""
    from server_helpers import grid_states

    states = book.states()
    logged = logged_states(store_url, bundle)
    unit = dict(zip(states, grid_states(bundle, states)[:, 0].tolist(), strict=True))
    with book._lock:
        keys = list(book.values)
    return [(s, a) for (s, a) in keys if unit[s] not in logged[a]]


# --- docs/reliability.md (scripts/reliability.sh calls `python tests/reliability_helpers.py
# write-doc ...` after the full run) ---------------------------------------------------------


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) or "none"
    return str(v)


# long-function: the whole of docs/reliability.md, section by section in its order
def write_doc(
    results: Path, doc: Path, *, command: str, elapsed: str, summary: str, exit_code: str
) -> None:
    """Render the JSON-lines results of one run as docs/reliability.md."""
    import platform
    from datetime import UTC, datetime

    rows = (
        [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        if results.exists()
        else []
    )
    by_name = {r["name"]: r for r in rows}

    def total(key: str) -> int:
        return sum(int(r.get(key, 0) or 0) for r in rows)

    unexpected: dict[str, int] = {}
    codes: dict[str, int] = {}
    for r in rows:
        for code, n in (r.get("unexpected_errors") or {}).items():
            unexpected[code] = unexpected.get(code, 0) + int(n)
        for key in ("calls", "known_state_calls"):
            for code, n in (r.get(key) or {}).items():
                if code != "OK":
                    codes[code] = codes.get(code, 0) + int(n)
    for r in rows:
        if "calls_unavailable" in r:
            codes["UNAVAILABLE"] = codes.get("UNAVAILABLE", 0) + int(r["calls_unavailable"])
        if "flood_resource_exhausted" in r:
            codes["RESOURCE_EXHAUSTED"] = codes.get("RESOURCE_EXHAUSTED", 0) + int(
                r["flood_resource_exhausted"]
            )
    soak = by_name.get("load_soak")
    held = (
        f"{soak['rate']:.0f} calls/s x {soak['batch']} states ({soak['new_fraction']:.0%} new) "
        f"for {soak['duration_s']:.0f} s: {soak['errors']} errors, {soak['skipped']} skipped, "
        f"p50 {soak['p50_ms']:.1f} ms, p99 {soak['p99_ms']:.1f} ms, RSS {soak['rss_warm_mib']}"
        f" -> {soak['rss_peak_mib']} MiB"
        if soak
        else "not run (or failed before reporting)"
    )
    over = by_name.get("overload")
    refused = (
        f"{over['in_limit_refused_during_flood']} of {over['in_limit_calls']} calls refused "
        f"during a {over['flood_s']:.0f}-s flood by another client (bound {over['max_in_flight']}"
        " in all, 3/4 of it per caller); 0 after it"
        if over
        else "not run"
    )
    faults = [
        ("server: " if r["name"].startswith("server_") else "store: ")
        + f"{r['name'].removeprefix('server_fault_').removeprefix('fault_')} recovered in "
        f"{float(r['recovery_s']):.2f} s"
        + (" (PostgreSQL cluster restarted)" if r.get("cluster_restarted") else "")
        for r in rows
        if "fault" in r["name"] and "recovery_s" in r
    ]
    replicas = by_name.get("replicas")
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    lines = [
        "# Reliability (system level)",
        "",
        "Written by `scripts/reliability.sh` (the body of `make reliability`); rerun with the "
        "command below. The same tests run in a quick form inside `make test` (8 kills instead "
        "of 50, an 8-second soak instead of 120 s, fewer connection cuts). What each test does "
        "and asserts is in the docstrings of `tests/reliability/`; "
        "`tests/integration/test_deploy.py` checks `deploy/`.",
        "",
        f"`{command}`",
        "",
        f"Run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, commit {rev or '?'}; {elapsed} s; pytest exit "
        f"{exit_code} ({summary.strip('= ') or 'no summary'}); load average at the end "
        f"{', '.join(f'{v:.1f}' for v in os.getloadavg())} (on 2 cores, other work on the "
        "machine inflates latencies).",
        "",
        "| what | result |",
        "|---|---|",
        f"| SIGKILLs survived (server restarted at once; every answer reproduced) | "
        f"{total('kills') + (1 if replicas else 0)} |",
        f"| answers re-checked (after kills, across replicas, after faults) | "
        f"{total('answers_rechecked')} |",
        f"| answers changed or missing | {total('answers_changed') + total('answers_missing')} |",
        f"| errors seen, all expected (UNAVAILABLE while a server was down, "
        f"RESOURCE_EXHAUSTED above the bound) | {_fmt(codes)} |",
        f"| unexpected errors (any other code, or a value that is not the release key's) | "
        f"{_fmt(unexpected)} |",
        f"| replicas on one PostgreSQL store | "
        f"{'3 (one SIGKILLed mid-run)' if replicas else 'not run'} |",
        f"| load held | {held} |",
        f"| in-limit client during overload | {refused} |",
        f"| store faults under a server (disk full, read-only, cut connections: answers go "
        f"on, the answer log catches up) | {'; '.join(faults) or 'not run'} |",
        "",
        "Overload: each caller (its token, or its connection when anonymous) may hold at most "
        "3/4 of the server's in-flight bound (`--max-in-flight-per-caller`), so a flooding "
        "client gets RESOURCE_EXHAUSTED while a client within its limit is not refused.",
        "",
    ]
    for r in rows:
        name = r.pop("name")
        r.pop("form", None)
        lines += [f"## {name}", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in r.items()]
        lines.append("")
    doc.write_text("\n".join(lines).rstrip() + "\n")


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="reliability suite helpers")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-doc")
    w.add_argument("--results", type=Path, required=True)
    w.add_argument("--doc", type=Path, required=True)
    w.add_argument("--command", required=True)
    w.add_argument("--elapsed", default="?")
    w.add_argument("--pytest-summary", default="")
    w.add_argument("--exit-code", default="?")
    a = p.parse_args(argv)
    write_doc(
        a.results,
        a.doc,
        command=a.command,
        elapsed=a.elapsed,
        summary=a.pytest_summary,
        exit_code=a.exit_code,
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
