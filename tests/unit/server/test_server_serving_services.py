"""The services of one server (qveil.server.serving.services): three services on one shared
context, and the answer log wired where the query service and the metrics use it."""

from __future__ import annotations

from pathlib import Path

from qveil.server.serving.limits import Limits
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.services import Services
from qveil.server.serving.state import ReleaseHolder
from qveil.server.store import open_store


def test_the_services_share_one_context(tmp_path: Path) -> None:
    holder, limits, metrics = ReleaseHolder(), Limits(max_batch=9), Metrics()
    s = Services.create(
        store=None,
        holder=holder,
        limits=limits,
        metrics=metrics,
        bundle_dirs=[tmp_path],
        trusted_keys=["ab" * 32],
    )
    assert s.query.ctx is s.releases.ctx is s.audit.ctx is s.ctx
    assert s.ctx.holder is holder and s.ctx.limits is limits and s.ctx.metrics is metrics
    assert s.releases.bundle_dirs == [tmp_path]
    assert s.releases.trusted_keys == ("ab" * 32,)
    assert s.ctx.opened_store is None and s.query.log is None
    fresh = Services.create(store=None)
    assert fresh.ctx.holder is not holder and fresh.ctx.limits == Limits()


def test_the_answer_log_is_capped_and_wired(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        s = Services.create(store=st, limits=Limits(max_stored_points=17))
        log = s.start_answer_log(st)
        try:
            assert s.query.log is log and s.ctx.metrics.answer_log is log
            assert log.max_points == 17
        finally:
            assert log.close(30)
