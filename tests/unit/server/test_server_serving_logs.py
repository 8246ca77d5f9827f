"""The server's log lines (qveil.server.serving.logs): the access line's fields in their order,
only when the access log is on; JSON lines with the fields; a bad format refused."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from qveil.server.serving import logs


def _record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("qveil.access", logging.INFO, __file__, 1, msg, (), None)
    rec.__dict__.update(extra)
    return rec


def test_a_json_line_holds_the_message_and_the_fields() -> None:
    fields = {"method": "GetValues", "code": "OK", "states": 3}
    line = json.loads(logs.JsonFormatter().format(_record("hello", fields=fields)))
    assert list(line)[:4] == ["time", "level", "logger", "message"]
    assert line["level"] == "INFO" and line["logger"] == "qveil.access"
    assert line["message"] == "hello" and line["time"].endswith("+00:00")
    assert {k: line[k] for k in fields} == fields
    plain = json.loads(logs.JsonFormatter().format(_record("x", fields="not a dict")))
    assert set(plain) == {"time", "level", "logger", "message"}


def test_a_json_line_carries_the_exception() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = json.loads(logs.JsonFormatter().format(rec))
    assert "RuntimeError: boom" in line["exception"]


def test_a_bad_format_is_refused(restore_logging: None) -> None:
    with pytest.raises(
        ValueError, match=r"log format must be one of \('text', 'json'\), got 'xml'"
    ):
        logs.configure(level="info", fmt="xml", access=True)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_access_lines_only_when_on_with_fields_in_order(restore_logging: None) -> None:
    seen = _Lines()
    logs.ACCESS.addHandler(seen)
    try:
        logs.configure(level="info", fmt="json", access=False)
        assert logs.ACCESS.disabled and logging.getLogger().level == logging.INFO
        assert logging.getLogger("alembic").level == logging.WARNING
        assert isinstance(logging.getLogger().handlers[0].formatter, logs.JsonFormatter)
        logs.access_line(method="GetValues", code="OK")
        assert seen.records == []
        logs.configure(level="debug", fmt="text", access=True)
        logs.access_line(ms=1.5, states=2, code="OK", caller="tok", method="GetValues", x=1)
    finally:
        logs.ACCESS.removeHandler(seen)
    [rec] = seen.records
    # the documented order, whatever the call's; fields outside it stay in the JSON only
    assert rec.getMessage() == "method=GetValues caller=tok code=OK states=2 ms=1.5"
    assert rec.fields["x"] == 1  # type: ignore[attr-defined]
    assert logs.AUTH.level == logging.WARNING
