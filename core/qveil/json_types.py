"""The types of JSON objects as qveil reads and writes them (cards, ledger events, reports).

The standard library gives a JSON value no static type (``json.loads`` returns one that
mypy does not check), so a JSON object's values have no finer static type: each reader
checks the fields it uses. :data:`JSONValue` is the one place that says so; typed records
(frozen dataclasses) are built from these aliases at each boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias  # Any: for JSONValue alone (json.loads returns it)

__all__ = ["JSONMapping", "JSONObject", "JSONValue"]

#: A JSON value (object, array, string, number, true/false, null), as ``json.loads``
#: returns it.
JSONValue: TypeAlias = Any  # json.loads returns Any: each reader checks the fields it uses
#: A JSON object, as ``json.loads`` returns it and ``json.dumps`` takes it.
JSONObject: TypeAlias = dict[str, JSONValue]
#: A read-only JSON object.
JSONMapping: TypeAlias = Mapping[str, JSONValue]
