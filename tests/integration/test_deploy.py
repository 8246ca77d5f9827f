"""deploy/ checked as far as this machine can.

No Docker daemon or systemd PID 1 here, so: the compose file is parsed as YAML and checked for
its services, health checks and durability flags; the Dockerfile is parsed stage by stage (the
server and trainer targets on one base image given by ARG BASE, every pip line installing with
--no-index from the wheelhouse that `make wheels` writes, torch==2.13.0 first in the trainer
and nowhere in the server, non-root USER, HEALTHCHECK through the probe, every COPY source
present and let through .dockerignore); what `qveil[server]` installs holds no torch or
gymnasium, and the CLI serves, audits and shows budgets with both imports blocked; `docker
build` of both targets runs where a daemon answers (`docker info`); the unit passes
`systemd-analyze verify`; the tokens example loads with the server's own parser. Above all, the
**real server is started with exactly the arguments that the unit, the compose file and the
Dockerfile's CMD give it**: only the values of --bundle, --store, --listen,
--tls-cert/--tls-key and --tokens-file are replaced by temporary ones on 127.0.0.1 (the test
fails if any of those flags is absent, so a renamed flag is caught), and the server must reach
SERVING, answer a query with a token, pass deploy/healthcheck.py, and exit 0 on SIGTERM. The
KServe manifests parse as YAML, their volumes, ports and probes agree with the args, and the
server starts with their args the same way, answering the manifest's HTTPS probes and a v2
inference.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import grpc
import pytest
import yaml
from reliability_helpers import ServerProc, free_port, shared_bundle
from server_helpers import Certs, fresh_bundle, make_certs

from qveil.server.serving.auth import ROLES, add_token, load_tokens

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROBE = DEPLOY / "healthcheck.py"
#: the Prometheus port of the images, compose, the manifests and the unit
METRICS_PORT = 9464


# ------------------------------------------------------------------ parsing helpers -------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def systemd_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as ordered (key, value) lists (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        sections[current].append((key.strip(), value.strip()))
    return sections


def env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"bad env line {line!r}"
        env[key] = value
    return env


def expand_systemd(value: str, env: Mapping[str, str]) -> list[str]:
    """systemd's ${VAR} expansion (one word each) of an ExecStart= line, then word split."""
    words = []
    for w in shlex.split(value):
        m = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", w)
        words.append(env[m.group(1)] if m else w)
    return words


def expand_compose(value: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:?msg}, ${VAR:-default} interpolation."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in env and env[name] != "":
            return env[name]
        if op == ":-":
            return arg
        raise AssertionError(f"compose needs {name}: {arg}")

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:\?|:-)([^}]*))?\}", sub, value)


def replace_values(argv: list[str], repl: Mapping[str, str]) -> list[str]:
    """Replace the value after each flag in ``repl``; every such flag must be present."""
    out = list(argv)
    for flag, value in repl.items():
        idx = [i for i, a in enumerate(out) if a == flag]
        assert len(idx) == 1, f"{flag} appears {len(idx)} times in {argv}"
        out[idx[0] + 1] = value
    return out


# ------------------------------------------------------------------ static checks ---------


def test_compose_file() -> None:
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = doc["services"]
    assert "postgres" in services
    replicas = [n for n, s in services.items() if s.get("image", "").startswith("qveil")]
    assert len(replicas) == 2, f"expected two qveil replicas, got {replicas}"
    for name in replicas:  # the server image of deploy/Dockerfile, from the repository root
        assert services[name]["build"] == {
            "context": "..", "dockerfile": "deploy/Dockerfile", "target": "server"
        }  # fmt: skip
    pg = services["postgres"]
    flags = " ".join(pg["command"])
    for setting in ("fsync=on", "synchronous_commit=on", "full_page_writes=on"):
        assert setting in flags, f"postgres runs without {setting}"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    for name in replicas:
        svc = services[name]
        cmd = [str(c) for c in svc["command"]]
        store = cmd[cmd.index("--store") + 1]
        assert store.startswith("postgresql+psycopg://") and "@postgres:" in store
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "healthcheck.py" in " ".join(svc["healthcheck"]["test"])
        for port in svc["ports"]:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        assert "--tls-cert" in cmd and "--tokens-file" in cmd, "non-loopback needs TLS + tokens"
        assert svc["stop_signal"] == "SIGTERM"
    # monitoring (profile): Prometheus scrapes every replica's --metrics-port, Grafana loads
    # the dashboard; both on loopback
    for name in replicas:
        cmd = [str(c) for c in services[name]["command"]]
        assert cmd[cmd.index("--metrics-port") + 1] == str(METRICS_PORT)
        assert not any(str(METRICS_PORT) in str(p) for p in services[name]["ports"])
        assert services[name]["labels"]["prometheus.io/port"] == str(METRICS_PORT)
    prom, graf = services["prometheus"], services["grafana"]
    assert prom["profiles"] == graf["profiles"] == ["monitoring"]
    for svc in (prom, graf):
        assert all(str(p).startswith("127.0.0.1:") for p in svc["ports"])
        for vol in svc["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), f"compose mounts missing {src}"
    conf = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = conf["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"{n}:{METRICS_PORT}" for n in replicas]
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "qveil.yml").read_text())[
        "providers"
    ]
    dashboards = provider["options"]["path"]
    assert f"./grafana/qveil-dashboard.json:{dashboards}/qveil-dashboard.json:ro" in graf["volumes"]
    stores = {
        [str(c) for c in services[n]["command"]][
            [str(c) for c in services[n]["command"]].index("--store") + 1
        ]
        for n in replicas
    }
    assert len(stores) == 1, "replicas must share one store"


def dockerfile_stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's stages by name (``FROM image AS name``), each its instructions after
    FROM; the global ARGs before the first FROM under ""."""
    stages: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for kind, args in dockerfile_instructions(text):
        if kind == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args, re.I)
            assert m, f"unnamed stage: FROM {args}"
            current = m.group(2)
            assert current not in stages, f"stage {current} twice"
            stages[current] = [("FROM", m.group(1))]
        else:
            stages[current].append((kind, args))
    return stages


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*:?=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"Makefile sets no {name}"
    return m.group(1)


def dockerignore_admits(path: str) -> bool:
    """Whether .dockerignore lets ``path`` (or everything under it) into the build context:
    the last pattern matching the path or one of its parents wins (Docker's rule)."""
    import fnmatch

    admitted = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            admitted = negate
    return admitted


def requirement_closure(name: str, extras: set[str]) -> set[str]:
    """Every distribution that ``name[extras]`` installs, from the installed metadata."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonicalize_name(name), frozenset(extras))]
    while todo:
        dist_name, wanted = todo.pop()
        if (dist_name, wanted) in seen:
            continue
        seen.add((dist_name, wanted))
        try:
            requires = distribution(dist_name).requires or []
        except PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(
                req.marker.evaluate({"extra": e}) for e in (wanted or {""})
            ):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {n for n, _ in seen}


def test_dockerfile() -> None:
    """Two targets on one base, both installed from the wheelhouse only: the server (the
    default) without torch, the trainer with torch==2.13.0 first."""
    text = (DEPLOY / "Dockerfile").read_text()
    stages = dockerfile_stages(text)
    assert list(stages) == ["", "base", "build-server", "build-trainer", "trainer", "server"]
    assert ("ARG", "BASE=python:3.11-slim-bookworm") in stages[""]
    assert stages["base"][0] == ("FROM", "${BASE}")
    for name in ("build-server", "build-trainer", "trainer", "server"):
        assert stages[name][0] == ("FROM", "base"), name
    wheelhouse = makefile_var("WHEELHOUSE")
    pip_lines = 0
    for ins in stages.values():
        for kind, args in ins:
            if kind == "RUN":
                for cmd in re.split(r"&&|;", args):
                    if "pip " in cmd:
                        pip_lines += 1
                        assert "pip install --no-index --find-links /wheelhouse " in cmd, cmd
                        assert "index-url" not in cmd, cmd
            if kind == "COPY":
                words = args.split()
                if words[0].startswith("--from="):
                    assert words[0].removeprefix("--from=") in stages, args
                    continue
                for src in words[:-1]:
                    # the wheelhouse is what `make wheels` writes; every other source is in git
                    assert src == wheelhouse or (ROOT / src).exists(), f"COPY source {src}"
                    assert dockerignore_admits(src), f".dockerignore keeps {src} out"
                    if src == wheelhouse:
                        assert words[-1] == "/wheelhouse", args
    assert pip_lines == 3
    assert not dockerignore_admits(".venv") and not dockerignore_admits("results/x")

    def installs(stage: str) -> list[str]:
        return [
            cmd.split("/wheelhouse", 1)[1].strip()
            for kind, args in stages[stage]
            if kind == "RUN"
            for cmd in re.split(r"&&|;", args)
            if "pip install" in cmd
        ]

    assert installs("build-server") == ['"qveil[server]"']
    assert installs("build-trainer") == ["torch==2.13.0", '"qveil[server,trainer]"']
    for stage in ("base", "build-server", "server"):
        assert "torch" not in str(stages[stage]), stage
    for stage, image in (("server", "build-server"), ("trainer", "build-trainer")):
        ins = stages[stage]
        assert ("COPY", f"--from={image} /opt/qveil/venv /opt/qveil/venv") in ins
        users = [a for k, a in ins if k == "USER"]
        assert users and users[-1].split(":")[0] not in ("root", "0"), "must run as non-root"
        assert [k for k, _ in ins].index("USER") < [k for k, _ in ins].index("ENTRYPOINT")
    server = stages["server"]
    health = [a for k, a in server if k == "HEALTHCHECK"]
    assert len(health) == 1 and "healthcheck.py" in health[0]
    assert ("COPY", "deploy/healthcheck.py /opt/qveil/healthcheck.py") in server
    assert json.loads(dict(server)["ENTRYPOINT"]) == ["qveil", "serve"]
    assert "50051" in dict(server)["EXPOSE"].split()
    assert json.loads(dict(stages["trainer"])["ENTRYPOINT"]) == ["qveil"]


def test_server_image_requirements_hold_no_torch() -> None:
    """What ``pip install qveil[server]`` pulls in (the installed metadata, transitively) has
    no torch, gymnasium or CUDA wheel; the trainer's has torch and gymnasium."""
    server = requirement_closure("qveil", {"server"})
    assert {"numpy", "grpcio", "sqlalchemy", "alembic", "cryptography"} <= server
    heavy = {n for n in server if n in ("torch", "gymnasium") or n.startswith("nvidia")}
    assert not heavy, f"the server image would install {sorted(heavy)}"
    trainer = requirement_closure("qveil", {"server", "trainer"})
    assert {"torch", "gymnasium"} <= trainer


def _docker_daemon() -> str | None:
    """Why images cannot be built here, or None when a Docker daemon answers."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    r = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False, timeout=60)
    if r.returncode != 0:
        return f"`docker info` fails (no daemon): {(r.stderr or r.stdout).strip()[-200:]}"
    return None


def test_docker_build_both_targets() -> None:
    """`make wheels`, then `docker build` of the server and the trainer image (the base
    image must be present or pullable); the server image has no torch."""
    why = _docker_daemon()
    if why is not None:
        pytest.skip(why)
    r = subprocess.run(["make", "wheels"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    for target, tag in (("trainer", "qveil-trainer:test"), ("server", "qveil:test")):
        r = subprocess.run(
            ["docker", "build", "-f", "deploy/Dockerfile", "--target", target, "-t", tag, "."],
            cwd=ROOT, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python", "qveil:test", "-c",
         "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('gymnasium'))"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.stdout.strip() == "None None", r.stdout + r.stderr


def test_systemd_unit() -> None:
    unit = systemd_sections((DEPLOY / "qveil.service").read_text())
    svc = dict(unit["Service"])
    assert svc["User"] == "qveil" and svc["KillSignal"] == "SIGTERM"
    assert svc["Restart"] == "on-failure" and svc["StateDirectory"] == "qveil"
    assert float(svc["TimeoutStopSec"]) > 22, "must exceed --drain-delay 2 + --grace 20"
    assert unit["Install"] == [("WantedBy", "multi-user.target")]
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the unit, with ExecStart pointing at this venv's qveil."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    qveil = Path(sys.executable).with_name("qveil")
    text = (DEPLOY / "qveil.service").read_text().replace("/opt/qveil/venv/bin/qveil", str(qveil))
    unit = tmp_path / "qveil.service"
    unit.write_text(text)
    r = subprocess.run(
        [tool, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Unknown" not in out and "Failed" not in out, out


def test_env_and_tokens_examples() -> None:
    env = env_file(DEPLOY / "qveil.env")
    assert set(env) >= {"QVEIL_BUNDLE", "QVEIL_STORE_URL", "QVEIL_LISTEN"}
    assert env["QVEIL_STORE_URL"].startswith("sqlite:////var/lib/qveil/")
    assert env["QVEIL_LISTEN"].startswith("127.0.0.1:")
    entries = load_tokens(DEPLOY / "tokens.example.toml")
    assert {e.role for e in entries} == set(ROLES)
    text = (DEPLOY / "tokens.example.toml").read_text()
    assert not re.search(r"^\s*token\s*=", text, re.M), "the tokens file must hold hashes only"


# ------------------------------------------------------------------ the real server -------


@pytest.fixture
def bundle(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """This test's copy of the shared test bundle, charged and receipted in this test's
    registry (the servers started here trust it: they run with this test's QVEIL_HOME)."""
    return fresh_bundle(shared_bundle(tmp_path_factory), tmp_path / "release-bundle")


def _probe(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QVEIL_HEALTH")}
    return subprocess.run(
        [sys.executable, str(PROBE), target, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env=env,
    )


def _query(
    target: str, token: str, *, creds: grpc.ChannelCredentials | None = None, low: float = -1.0
) -> int:
    from qveil.v1 import value_service_pb2 as vpb
    from qveil.v1 import value_service_pb2_grpc as vgrpc

    ch = (
        grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "localhost")])
        if creds
        else grpc.insecure_channel(target)
    )
    with ch:
        stub = vgrpc.ValueServiceStub(ch)
        md = (("authorization", f"Bearer {token}"),)
        reply = stub.GetValues(
            vpb.GetValuesRequest(states=[low, 0.0, 0.5]), metadata=md, timeout=20
        )
        with pytest.raises(grpc.RpcError) as exc:
            stub.GetValues(vpb.GetValuesRequest(states=[0.0]), timeout=20)  # no token
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    return len(reply.values)


def _scrape_metrics(argv: list[str]) -> None:
    """The server started with ``argv`` serves its Prometheus series on --metrics-port."""
    import urllib.request

    port = argv[argv.index("--metrics-port") + 1]
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert re.search(r'^qveil_build_info\{version="[^"]+"\} 1\.0$', text, re.M), text[:500]
    assert re.search(r'^qveil_requests_total\{code="OK",', text, re.M), text[:2000]


def _metrics_values(argv: list[str], *, container: bool) -> dict[str, str]:
    """The replacement values for the metrics flags: a free port on 127.0.0.1. In a container
    or pod the endpoint must listen on all interfaces (Prometheus scrapes it from outside)."""
    assert "--metrics-port" in argv, f"metrics off in {argv}"
    if not container:
        assert "--metrics-host" not in argv, "the unit keeps metrics on loopback"
        return {"--metrics-port": str(free_port())}
    assert argv[argv.index("--metrics-host") + 1] == "0.0.0.0"
    assert argv[argv.index("--metrics-port") + 1] == str(METRICS_PORT)
    return {"--metrics-port": str(free_port()), "--metrics-host": "127.0.0.1"}


def _run(tmp_path: Path, argv: list[str], name: str, *, tls: Certs | None, token: str) -> None:
    """Start `qveil <argv>` (argv starts with "serve"), query, probe, SIGTERM."""
    assert argv[0] == "serve", argv
    port = int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1])
    srv = ServerProc(
        argv=[sys.executable, "-m", "qveil.cli", *argv],
        port=port,
        log_path=tmp_path / f"{name}.log",
    )
    if tls is None:
        srv.start()
        probe = _probe(srv.target)
        creds = None
    else:
        srv.start(wait=False)
        probe = None
        creds = grpc.ssl_channel_credentials(root_certificates=tls.ca.read_bytes())
    try:
        if tls is not None:
            import time

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                probe = _probe(
                    srv.target,
                    "--ca",
                    str(tls.ca),
                    "--server-name",
                    "localhost",
                    "--timeout",
                    "1",
                )
                if probe.returncode == 0 or not srv.alive():
                    break
                time.sleep(0.1)
        assert probe is not None and probe.returncode == 0, (
            f"health probe: {probe and probe.stdout} {probe and probe.stderr}\n{srv.log_tail()}"
        )
        assert probe.stdout.strip() == "SERVING"
        assert _query(srv.target, token, creds=creds) == 6  # 3 states x 2 actions
        _scrape_metrics(argv)
    finally:
        code = srv.terminate()
    assert code == 0, f"exit code {code} after SIGTERM\n{srv.log_tail()}"
    if tls is None:
        assert _probe(srv.target, "--timeout", "1").returncode == 1  # down: unhealthy


def _tokens(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "tokens.toml"
    token = add_token(path, "query", "deploy-test")
    return path, token


def test_server_starts_with_the_systemd_unit_arguments(tmp_path: Path, bundle: Path) -> None:
    unit = systemd_sections((DEPLOY / "qveil.service").read_text())
    env = env_file(DEPLOY / "qveil.env")
    argv = expand_systemd(dict(unit["Service"])["ExecStart"], env)
    assert argv[0] == "/opt/qveil/venv/bin/qveil"
    tokens, token = _tokens(tmp_path)
    argv = replace_values(
        argv[1:],
        {
            "--bundle": str(bundle),
            "--store": f"sqlite:///{tmp_path / 'store.sqlite'}",
            "--listen": f"127.0.0.1:{free_port()}",  # the example is loopback already
            "--tokens-file": str(tokens),
            **_metrics_values(argv, container=False),
        },
    )
    _run(tmp_path, argv, "unit", tls=None, token=token)


def _compose_like(tmp_path: Path, bundle: Path, argv: list[str], name: str) -> None:
    certs = make_certs(tmp_path)
    tokens, token = _tokens(tmp_path)
    listen = argv[argv.index("--listen") + 1]
    assert listen.startswith("0.0.0.0:"), "in a container the server listens on all interfaces"
    argv = replace_values(
        argv,
        {
            "--bundle": str(bundle),
            "--store": f"sqlite:///{tmp_path / 'store.sqlite'}",
            "--listen": f"127.0.0.1:{free_port()}",
            "--tls-cert": str(certs.server_cert),
            "--tls-key": str(certs.server_key),
            "--tokens-file": str(tokens),
            **_metrics_values(argv, container=True),
        },
    )
    _run(tmp_path, ["serve", *argv], name, tls=certs, token=token)


def test_server_starts_with_the_compose_arguments(tmp_path: Path, bundle: Path) -> None:
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    cmd = [
        expand_compose(str(c), {"QVEIL_DB_PASSWORD": "x"})
        for c in doc["services"]["qveil-1"]["command"]
    ]
    _compose_like(tmp_path, bundle, cmd, "compose")


def test_server_starts_with_the_dockerfile_cmd(tmp_path: Path, bundle: Path) -> None:
    server = dockerfile_stages((DEPLOY / "Dockerfile").read_text())["server"]
    cmd = json.loads(dict(server)["CMD"])
    _compose_like(tmp_path, bundle, cmd, "dockerfile")


# `python -c BLOCK_TRAINER qveil-args...`: qveil's CLI with torch and gymnasium unimportable
# (what the server image lacks); every import of them that was tried is written to the file
# $QVEIL_TEST_BLOCKED at exit, so an import that failed quietly is seen too.
BLOCK_TRAINER = """
import atexit, os, sys
from importlib.abc import MetaPathFinder
tried = []
class Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "gymnasium"):
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
atexit.register(lambda: open(os.environ["QVEIL_TEST_BLOCKED"], "w").write("\\n".join(tried)))
from qveil.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_server_runs_without_torch_and_gymnasium(tmp_path: Path, bundle: Path) -> None:
    """The server image has neither torch nor gymnasium: `qveil serve` starts on a bundle,
    answers over gRPC, REST and /metrics and stops, `qveil audit`, `qveil budget show` and
    `qveil admin releases` run, without trying to import either; `qveil train` and `qveil
    admin retrain` say what they need (exit 2)."""
    import httpx

    blocked = tmp_path / "blocked.txt"
    env = {**os.environ, "QVEIL_TEST_BLOCKED": str(blocked)}
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    srv = ServerProc(
        argv=[sys.executable, "-c", BLOCK_TRAINER, "serve", "--bundle", str(bundle),
              "--store", store, "--listen", f"127.0.0.1:{port}",
              "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
        port=port, log_path=tmp_path / "serve.log", env=env,
    )  # fmt: skip
    srv.start()
    try:
        from qveil.v1 import value_service_pb2 as vpb
        from qveil.v1 import value_service_pb2_grpc as vgrpc

        with grpc.insecure_channel(srv.target) as ch:
            reply = vgrpc.ValueServiceStub(ch).GetValues(
                vpb.GetValuesRequest(states=[0.0, 0.5]), timeout=20
            )
        assert len(reply.values) == 4
        with httpx.Client(timeout=10) as c:
            r = c.post(
                f"http://127.0.0.1:{http_port}/v2/models/qveil/infer",
                json={"inputs": [{"name": "STATE", "datatype": "FP64", "shape": [1, 1],
                                  "data": [0.25]}]},
            )  # fmt: skip
            assert r.status_code == 200, r.text
            assert "qveil_requests_total" in c.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    finally:
        code = srv.terminate()
    assert code == 0, srv.log_tail()
    assert blocked.read_text() == "", f"serve tried to import {blocked.read_text()}"

    def qveil(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", BLOCK_TRAINER, *argv],
            capture_output=True, text=True, check=False, timeout=120, env=env,
        )  # fmt: skip

    for argv in (["audit", "--store", store, "--bundle", str(bundle)],
                 ["budget", "show", "--json"],
                 ["admin", "--store", store, "releases"]):  # fmt: skip
        r = qveil(*argv)
        assert r.returncode == 0, r.stdout + r.stderr
        assert blocked.read_text() == "", f"{argv[0]} tried to import {blocked.read_text()}"
    # what needs the trainer says so: one line, exit 2
    config = str(ROOT / "configs" / "linewalk-private.toml")
    for argv, says in (
        (["train", "--mode", "fqi", "--dataset", "users.npz", "--out", str(tmp_path / "b")],
         "qveil train: needs 'gymnasium'"),
        (["admin", "--store", store, "retrain", "--config", config, "--dataset-id", "d",
          "--epsilon", "1"], "retrain needs the trainer: 'gymnasium' is not installed"),
    ):  # fmt: skip
        r = qveil(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert says in r.stderr, r.stderr


# ------------------------------------------------------------------ KServe ------

KSERVE = ("kserve-inferenceservice.yaml", "kserve-inferenceservice-postgres.yaml")


def kserve_predictor(name: str) -> dict[str, object]:
    """The `kserve-container` of the InferenceService in deploy/NAME (static checks)."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    pred = isvc["spec"]["predictor"]
    (box,) = pred["containers"]
    assert box["name"] == "kserve-container"
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pred.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    pvcs = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert claims <= pvcs, "every claimed volume is declared in the manifest"
    args = [str(a) for a in box["args"]]
    store = args[args.index("--store") + 1]
    if store.startswith("sqlite"):
        assert claims and pred["maxReplicas"] == 1, "SQLite on a RWO volume: one replica"
        mounts = {m["mountPath"] for m in box["volumeMounts"]}
        assert any(store.removeprefix("sqlite:///").startswith(m + "/") for m in mounts)
    else:  # PostgreSQL from a Secret, expanded by Kubernetes: $(VAR) must be a container env
        env = {e["name"] for e in box["env"]}
        assert set(re.findall(r"\$\((\w+)\)", store)) <= env and store.startswith("$(")
    port = int(args[args.index("--http-port") + 1])
    assert [p["containerPort"] for p in box["ports"]] == [port]
    # Prometheus finds the pods by their annotations (KServe copies the InferenceService's)
    ann = isvc["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert ann["prometheus.io/port"] == args[args.index("--metrics-port") + 1] == str(METRICS_PORT)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = box[probe]["httpGet"]
        assert get["port"] == port and get["scheme"] == "HTTPS"
        assert get["path"] in ("/v2/health/ready", "/v2/health/live")
    return box


@pytest.mark.parametrize("manifest", KSERVE)
def test_server_starts_with_the_kserve_arguments(
    tmp_path: Path, bundle: Path, manifest: str
) -> None:
    """The real server with exactly the manifest's args (values of --bundle, --store,
    --listen, --http-port, --tls-*, --tokens-file replaced by temporary ones): SERVING,
    the manifest's probes answer over HTTPS, a v2 infer with a token answers, exit 0."""
    import ssl

    import httpx

    box = kserve_predictor(manifest)
    argv = [str(a) for a in box["args"]]  # type: ignore[union-attr]
    assert argv[argv.index("--listen") + 1].startswith("0.0.0.0:")
    certs = make_certs(tmp_path)
    tokens, token = _tokens(tmp_path)
    http_port = free_port()
    argv = replace_values(
        argv,
        {
            "--bundle": str(bundle),
            "--store": f"sqlite:///{tmp_path / 'store.sqlite'}",
            "--listen": f"127.0.0.1:{free_port()}",
            "--http-port": str(http_port),
            "--tls-cert": str(certs.server_cert),
            "--tls-key": str(certs.server_key),
            "--tokens-file": str(tokens),
            **_metrics_values(argv, container=True),
        },
    )
    srv = ServerProc(
        argv=[sys.executable, "-m", "qveil.cli", "serve", *argv],
        port=int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1]),
        log_path=tmp_path / "kserve.log",
    )
    srv.start(wait=False)
    url = f"https://127.0.0.1:{http_port}"
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    try:
        import time

        deadline = time.monotonic() + 60
        ready = None
        with httpx.Client(verify=ctx, timeout=5) as c:
            while time.monotonic() < deadline and srv.alive():
                try:
                    ready = c.get(url + box["readinessProbe"]["httpGet"]["path"])  # type: ignore[index]
                    if ready.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            assert ready is not None and ready.status_code == 200, srv.log_tail()
            assert c.get(url + "/v2/health/live").status_code == 200
            r = c.post(
                url + "/v2/models/qveil/infer",
                json={
                    "inputs": [
                        {"name": "STATE", "datatype": "FP64", "shape": [2, 1], "data": [0.0, 0.5]}
                    ]
                },
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 200, r.text
            assert {o["name"] for o in r.json()["outputs"]} == {"Q", "BEST_ACTION"}
            assert c.post(url + "/v2/models/qveil/infer", json={}).status_code == 401
        _scrape_metrics(argv)
    finally:
        code = srv.terminate()
    assert code == 0, f"exit code {code} after SIGTERM\n{srv.log_tail()}"
