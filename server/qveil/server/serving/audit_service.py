"""The audit service: what AuditService answers to the auditor role (the stored noise
points of a path, the integrity of a release's chains, the statistical report)."""

from __future__ import annotations

import math
from collections.abc import Generator

from qveil.common import typing as t
from qveil.errors import bad_argument, echo
from qveil.server.serving import views
from qveil.server.serving.state import ContextService
from qveil.server.store.releases import ReleaseRecord

__all__ = ["AuditService"]


class AuditService(ContextService):
    """StreamNoisePoints, VerifyIntegrity and GetStatisticalReport."""

    def _audit_release(self, release_id: str, action: int | None) -> ReleaseRecord:
        if not release_id:
            release_id = self.holder.current().release_id
        rec = self.releases.get_release(release_id)  # NotFound
        # a release of d > 1 coordinates: "action" names the store path
        # action * d + coordinate (the 1-D OU path g_{action, coordinate})
        n = int(getattr(rec, "n_paths", rec.n_actions))
        if action is not None and not 0 <= int(action) < n:
            what = "actions" if n == int(rec.n_actions) else "paths (action * dims + coordinate)"
            raise bad_argument(
                f"unknown action {action}: release {echo(release_id)} has {what} 0..{n - 1}",
                field="action",
                reason="UNKNOWN_ACTION",
            )
        return rec

    def noise_points(
        self, release_id: str, action: int
    ) -> tuple[str, Generator[list[t.NoisePoint], None, None]]:
        """(release id, generator of chunks of stored points in insertion order)."""
        rec = self._audit_release(release_id, action)
        lo, hi = map(float, rec.interval)
        j = int(action) % int(getattr(rec, "dims", 1))
        if j:  # coordinate j of a d > 1 release: its interval is in the bundle's card
            cur = self.holder.peek()
            if cur is not None and cur.release_id == rec.release_id:
                iv = cur.bundle.box.intervals[j]
                lo, hi = float(iv.lo), float(iv.hi)
            else:
                lo = hi = math.nan  # the raw state is unknown here; x and g are exact
        chunk = self.limits.points_chunk

        def chunks() -> Generator[list[t.NoisePoint], None, None]:
            buf: list[t.NoisePoint] = []
            for p in self.store.iter_points(rec.release_id, int(action)):
                buf.append(views.noise_point(p, lo=lo, hi=hi))
                if len(buf) >= chunk:
                    yield buf
                    buf = []
            if buf:
                yield buf

        return str(rec.release_id), chunks()

    def verify(self, release_id: str = "", action: int | None = None) -> t.IntegrityResult:
        rec = self._audit_release(release_id, action)
        report = (
            self.store.verify(rec.release_id)
            if action is None
            else self.store.verify(rec.release_id, int(action))
        )
        return views.integrity_from_report(str(rec.release_id), report)

    def report(self, release_id: str = "", action: int | None = None) -> t.StatisticalReport:
        """The audit of one release (qveil.server.governance.audit.service_report: the same report
        as ``qveil audit --release ID``): integrity, high-water marks, whitened innovations tested
        against N(0, 1) with power against sigma x 1.3, ledger and audit-log chains."""
        # the audit (scipy.stats) loads only when an audit is asked, not with the server
        from qveil.server.governance.audit import service_report

        rec = self._audit_release(release_id, action)
        current = self.holder.peek()
        paths = (
            current.bundle.noise_paths
            if current is not None and current.release_id == str(rec.release_id)
            else None
        )
        report: t.StatisticalReport = service_report(
            self.store, str(rec.release_id), action=action, paths=paths
        )
        return report
