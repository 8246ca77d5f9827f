"""The blocking SDK (qveil.client.sync) against a real server (LocalServer: gRPC on
127.0.0.1, port 0): the released values and best actions of any state shape, the public
card, the admin and audit clients, and the server's refusals as the SDK's typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from server_helpers import Served, served_values

from qveil.bundle import load_bundle
from qveil.client import (
    AdminClient,
    AuditClient,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RetryPolicy,
    UnauthenticatedError,
    UnavailableError,
    ValueClient,
)

STATES = [-1.0, 0.25, 1.5, 2.0]


def test_values_and_best_actions_are_the_released_ones(served: Served) -> None:
    want = served_values(served.bundle, STATES)
    with ValueClient(served.target, token=served.tokens.query) as c:
        np.testing.assert_array_equal(c.values(STATES), want)
        np.testing.assert_array_equal(c.values(np.array(STATES).reshape(-1, 1)), want)
        np.testing.assert_array_equal(c.values(STATES, [2, 0]), want[:, [2, 0]])
        got = c.get_values(STATES)
        assert got.release_id == load_bundle(served.bundle).bundle_id and got.actions == (0, 1, 2)
        np.testing.assert_array_equal(c.best_actions(STATES), np.argmax(want, axis=1))
        best = c.get_best_actions(STATES)
        np.testing.assert_array_equal(best.values, want.max(axis=1))


def test_release_is_the_public_card(served: Served) -> None:
    b = load_bundle(served.bundle)
    with ValueClient(served.target, token=served.tokens.query) as c:
        r = c.release()
    assert r.release_id == b.bundle_id and r.status == "active" and r.n_actions == 3
    assert r.dims == 1 and r.interval == (-1.0, 2.0) and r.card == b.public_card()


@pytest.mark.parametrize(("states", "actions"), [([float("nan")], None), ([0.5], [7])])
def test_a_refused_request_is_a_typed_error(
    served: Served, states: list[float], actions: list[int] | None
) -> None:
    with (
        ValueClient(served.target, token=served.tokens.query) as c,
        pytest.raises(InvalidArgumentError),
    ):
        c.values(states, actions)


def test_a_missing_or_wrong_token_is_refused(served: Served) -> None:
    with ValueClient(served.target) as c, pytest.raises(UnauthenticatedError):
        c.release()
    with AdminClient(served.target, token=served.tokens.query) as admin:
        with pytest.raises(PermissionDeniedError):
            admin.stats()


def test_no_server_is_unavailable_within_the_timeout() -> None:
    with ValueClient("127.0.0.1:9", retry=RetryPolicy(attempts=1), timeout=5) as c:
        with pytest.raises(UnavailableError):
            c.release()


def test_admin_and_audit_clients(served: Served) -> None:
    b = load_bundle(served.bundle)
    with ValueClient(served.target, token=served.tokens.query) as c:
        c.values([0.5, 0.75])  # two new points of every action for the answer log
    with AdminClient(served.target, token=served.tokens.admin) as admin:
        releases, active = admin.list_releases()
        assert active == b.bundle_id and [r.release_id for r in releases] == [b.bundle_id]
        assert admin.admin_card()["weights_sha256"] == b.card["weights_sha256"]
        assert admin.stats().active_release_id == b.bundle_id
        with pytest.raises(NotFoundError):
            admin.retire("no-such-release")
    with AuditClient(served.target, token=served.tokens.auditor) as audit:
        # the answer log is written behind the answers: every point it holds so far is a
        # state this module asked (on the release's grid), action 0's noise
        asked = np.array([*STATES, 0.5, 0.75, 0.25])
        for p in audit.noise_points(0):
            assert np.abs(asked - p.state).min() < 1e-6 and np.isfinite(p.g)
        assert audit.verify().ok
