"""The server's logs: the access log (one line per call) and the formats of every line.

``qveil serve --access-log`` writes one line per call to the ``qveil.access`` logger: the
method, the protocol (``grpc`` or ``rest``), the caller (its token name, or its host), the
active release, the status code, how many states it answered and its latency. Every
authentication or permission failure is logged at WARNING whatever the flags (``qveil.auth``:
the method, the caller's host and the code; never the credential). ``--log-format json``
writes every line of the server as one JSON object (``time``, ``level``, ``logger``,
``message`` and, for an access line, its fields), for log shippers; ``text`` (the default)
is one readable line. No line ever holds a state, a value, a token or a key.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from qveil.json_types import JSONObject

__all__ = ["ACCESS", "AUTH", "FORMATS", "JsonFormatter", "access_line", "configure"]

#: the access log's logger (INFO lines, on with ``--access-log``)
ACCESS = logging.getLogger("qveil.access")
#: authentication and permission failures (WARNING, always)
AUTH = logging.getLogger("qveil.auth")
FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the fields of an access line, in order
_FIELDS = ("method", "protocol", "caller", "release", "code", "states", "ms")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, and the
    record's ``fields`` (an access line's) when it has them."""

    def format(self, record: logging.LogRecord) -> str:
        out: JSONObject = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=False, default=str)


def configure(*, level: str, fmt: str, access: bool) -> None:
    """The root handler on stderr in ``fmt`` at ``level``; the access log on or off;
    Alembic's migration lines only at DEBUG."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r:.80}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    ACCESS.setLevel(logging.INFO if access else logging.WARNING)
    ACCESS.disabled = not access
    AUTH.setLevel(logging.WARNING)


def access_line(**fields: str | int | float) -> None:
    """Log one call (see the module docstring), when the access log is on."""
    if ACCESS.disabled or not ACCESS.isEnabledFor(logging.INFO):
        return
    text = " ".join(f"{k}={fields[k]}" for k in _FIELDS if k in fields)
    ACCESS.info("%s", text, extra={"fields": fields})
