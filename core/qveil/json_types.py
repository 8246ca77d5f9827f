"""The types of JSON objects as qveil reads and writes them (cards, ledger events, reports).

The standard library types every JSON value as Any (``json.loads`` returns Any), so a JSON
object's values have no finer static type: each reader checks the fields it uses. These
aliases are the one place that says so (the one ``Any`` of a JSON value); typed records
(frozen dataclasses) are built from them at each boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["JSONMapping", "JSONObject", "JSONValue"]

#: Any JSON value (object, array, string, number, true/false, null), as ``json.loads``
#: returns it.
JSONValue = Any
#: A JSON object, as ``json.loads`` returns it and ``json.dumps`` takes it.
JSONObject = dict[str, Any]
#: A read-only JSON object.
JSONMapping = Mapping[str, Any]
