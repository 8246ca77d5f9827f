"""The real server inside this process (qveil.server.local): built on a background
event loop on 127.0.0.1:0 over a real store, answering over loopback gRPC what the bundle's
key says; start=False leaves it NOT_SERVING until ready(); close frees everything."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path

import numpy as np
import pytest
from server_helpers import health_status, make_bundle, served_values

from qveil.client import ValueClient
from qveil.errors import NotFound
from qveil.server.local import LocalServer, _quiet_poller_shutdown
from qveil.server.store import open_store


def test_it_answers_the_bundles_values_over_loopback(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", seed=2)
    xs = np.array([-0.5, 0.0, 1.5])
    with LocalServer(bundle, f"sqlite:///{tmp_path / 's.sqlite'}", max_batch=8) as srv:
        assert srv.target == f"127.0.0.1:{srv.port}" and srv.port > 0
        assert health_status(srv.target) == "SERVING"
        with ValueClient(srv.target) as c:
            got = c.get_values(xs).values
        assert got.tobytes() == served_values(bundle, xs).tobytes()
        assert srv.services.ctx.metrics.states_answered == 3 * 3
        assert srv.services.ctx.limits.max_batch == 8
        assert srv.answers.flush(30)
        rid = srv.services.query.holder.current().release_id
        assert srv.store.count_points(rid, 0) == 3
    assert srv.server is None and srv.loop.is_closed()


def test_not_ready_until_asked_and_over_an_open_store(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", seed=2)
    st = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    with LocalServer(bundle, st, start=False) as srv:
        assert srv.store is st
        assert health_status(srv.target) == "NOT_SERVING" and not srv.plane.ready
        srv.ready(bundle)
        assert health_status(srv.target) == "SERVING" and srv.plane.ready
        assert srv.run(asyncio.sleep(0, result=7)) == 7  # runs on the server's loop


def test_a_missing_bundle_is_refused_and_the_server_closed(tmp_path: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(NotFound, match="bundle .*missing' does not exist"):
        LocalServer(tmp_path / "missing", f"sqlite:///{tmp_path / 's.sqlite'}")
    # its event loop's thread and the answer log's thread are gone
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before


def test_only_the_pollers_closed_socket_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    seen: list[dict[str, object]] = []
    loop.default_exception_handler = seen.append  # type: ignore[method-assign]
    try:
        other = OSError(errno.EBADF, "Bad file descriptor")
        _quiet_poller_shutdown(loop, {"message": "m", "exception": other})
        _quiet_poller_shutdown(loop, {"message": "m", "exception": ValueError("x")})
        assert len(seen) == 2  # not raised from the poller: passed on
    finally:
        loop.close()
