"""The server's services over one shared context: the query service (ValueService and the
v2 model, called by the data plane), the release-management service (AdminService and the
server's start) and the audit service (AuditService)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qveil.server.governance.registry import Registry
from qveil.server.serving.answer_log import AnswerLog
from qveil.server.serving.audit_service import AuditService
from qveil.server.serving.limits import Limits
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.query import QueryService
from qveil.server.serving.releases import ReleaseService
from qveil.server.serving.state import ReleaseHolder, ServerContext
from qveil.server.store.base import SamplePathStore

__all__ = ["Services"]


@dataclass(frozen=True, slots=True)
class Services:
    ctx: ServerContext
    query: QueryService
    releases: ReleaseService
    audit: AuditService

    @classmethod
    def create(
        cls,
        *,
        store: SamplePathStore | None,
        holder: ReleaseHolder | None = None,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        bundle_dirs: Sequence[str | Path] = (),
        trusted_keys: Sequence[str] = (),
        registry: Registry | None = None,
    ) -> Services:
        """The three services on one context (``store`` may be None until it is open: set
        ``ctx.store`` then)."""
        ctx = ServerContext(
            store=store,
            holder=holder or ReleaseHolder(),
            limits=limits or Limits(),
            metrics=metrics,
            registry=registry,
        )
        return cls(
            ctx=ctx,
            query=QueryService(ctx),
            releases=ReleaseService(ctx, bundle_dirs=bundle_dirs, trusted_keys=trusted_keys),
            audit=AuditService(ctx),
        )

    def start_answer_log(self, store: SamplePathStore) -> AnswerLog:
        """Start the answer log of ``store`` (capped by the limits' ``max_stored_points``) and
        wire it where it is used: the query service submits to it, the metrics read it."""
        answers = AnswerLog(store, max_points=self.ctx.limits.max_stored_points)
        answers.start()
        self.query.log = answers
        self.ctx.metrics.answer_log = answers
        return answers
