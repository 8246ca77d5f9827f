"""qveil.client: the light SDK (numpy + grpcio; never torch or SQLAlchemy).

    from qveil.client import ValueClient
    with ValueClient("127.0.0.1:50051", token=None) as c:
        c.values([0.1, 0.5])          # (2, m) released values Q(s, a) + g_a(s)
        c.best_actions([0.1, 0.5])    # argmax per state
        c.release()                   # the public privacy card (a dataclass)

Errors are the typed tree of :mod:`qveil.common.errors`; results are the dataclasses of
:mod:`qveil.common.typing` (both re-exported here).
"""

from qveil.client.aio import AsyncValueClient
from qveil.client.channel import RetryPolicy, TLSConfig
from qveil.client.sync import AdminClient, AuditClient, ValueClient
from qveil.common.errors import (
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RpcError,
    ServerError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from qveil.common.typing import (
    BestActions,
    IntegrityResult,
    NoisePoint,
    Release,
    ServerStats,
    StatisticalReport,
    Values,
)

__all__ = [
    "AdminClient",
    "AsyncValueClient",
    "AuditClient",
    "BestActions",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "IntegrityResult",
    "InvalidArgumentError",
    "NoisePoint",
    "NotFoundError",
    "PermissionDeniedError",
    "Release",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RpcError",
    "ServerError",
    "ServerStats",
    "StatisticalReport",
    "TLSConfig",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "ValueClient",
    "Values",
]
