"""The server's state (qveil.server.serving.state): the active release swapped atomically, the
shared context's store and registry, and the services' view of that context."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qveil.errors import Unavailable
from qveil.server.governance.registry import open_registry
from qveil.server.serving.limits import Limits
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.state import ActiveRelease, ContextService, ReleaseHolder, ServerContext
from qveil.server.store import open_store


def _release(rid: str) -> ActiveRelease:
    bundle: Any = SimpleNamespace(bundle_id=rid)
    return ActiveRelease(bundle=bundle, record=None)  # type: ignore[arg-type]


def test_the_holder_is_unavailable_until_a_release_is_swapped_in() -> None:
    h = ReleaseHolder()
    assert h.peek() is None and h.draining is False
    with pytest.raises(Unavailable, match="no release is loaded yet"):
        h.current()
    a, b = _release("a"), _release("b")
    assert h.swap(a) is None
    assert h.current() is a and h.peek() is a and a.release_id == "a"
    assert h.swap(b) is a  # the previous release is handed back
    assert h.current() is b


def test_the_context_store_is_unavailable_until_set(tmp_path: Path) -> None:
    ctx = ServerContext(store=None, holder=ReleaseHolder(), limits=Limits())
    assert ctx.opened_store is None
    with pytest.raises(Unavailable, match="the store is not open yet"):
        _ = ctx.store
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        ctx.store = st
        assert ctx.store is st and ctx.opened_store is st


def test_the_context_wires_its_quotas_into_its_metrics() -> None:
    m = Metrics()
    ctx = ServerContext(
        store=None, holder=ReleaseHolder(), limits=Limits(state_rate=3.0), metrics=m
    )
    assert ctx.metrics is m and m.quotas is ctx.quotas
    assert ctx.quotas.config.state_rate == 3.0
    own = ServerContext(store=None, holder=ReleaseHolder(), limits=Limits())
    assert own.metrics is not m and own.metrics.quotas is own.quotas


def test_the_registry_is_the_given_one_or_opened_once_from_the_default(
    tmp_path: Path, qveil_home: str
) -> None:
    with open_registry(f"sqlite:///{tmp_path / 'reg.sqlite'}") as reg:
        ctx = ServerContext(store=None, holder=ReleaseHolder(), limits=Limits(), registry=reg)
        assert ctx.registry is reg
    ctx = ServerContext(store=None, holder=ReleaseHolder(), limits=Limits())
    first = ctx.registry
    try:
        assert ctx.registry is first  # opened once
        assert str(Path(qveil_home)) in first.url
    finally:
        first.close()


def test_a_context_service_reads_the_shared_context(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        ctx = ServerContext(store=st, holder=ReleaseHolder(), limits=Limits(max_batch=7))
        svc = ContextService(ctx)
        assert svc.store is st and svc.releases is st.releases
        assert svc.holder is ctx.holder and svc.limits.max_batch == 7
        assert svc.metrics is ctx.metrics and svc.quotas is ctx.quotas
