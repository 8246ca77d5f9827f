"""The hash chains of the admin records (qveil.server.governance.hashchain): canonical JSON
(sorted keys, compact, exact floats, no NaN), each link SHA-256 over the previous hash and that
text, so that any edit, reorder or deletion changes every hash after it."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from qveil.server.governance.hashchain import GENESIS, canonical_json, link_hash


def test_canonical_json_is_sorted_compact_and_exact() -> None:
    assert canonical_json({"b": 1, "a": [0.1, "é", None, True]}) == (
        '{"a":[0.1,"\\u00e9",null,true],"b":1}'
    )
    x = 0.1 + 0.2  # 0.30000000000000004: written so that it reads back bit for bit
    text = canonical_json({"x": x, "tiny": 5e-324, "big": 1e308})
    back = json.loads(text)
    assert back["x"] == x and back["tiny"] == 5e-324 and canonical_json(back) == text


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"eps": math.nan}, r"\$\.eps"),
        ({"a": [1.0, {"b": math.inf}]}, r"\$\.a\[1\]\.b"),
        ([-math.inf], r"\$\[0\]"),
    ],
)
def test_non_finite_numbers_are_refused_with_their_place(obj: object, path: str) -> None:
    with pytest.raises(ValueError, match=f"non-finite number at {path}"):
        canonical_json(obj)  # type: ignore[arg-type]


def test_a_link_is_sha256_of_the_previous_hash_and_the_record() -> None:
    fields = {"seq": 1, "epsilon": 0.5, "actor": "me"}
    want = hashlib.sha256(
        (GENESIS + "\n" + '{"actor":"me","epsilon":0.5,"seq":1}').encode()
    ).hexdigest()
    assert GENESIS == "0" * 64
    assert link_hash(GENESIS, fields) == want
    assert link_hash(GENESIS, dict(reversed(list(fields.items())))) == want  # key order


def test_a_chain_breaks_after_any_change() -> None:
    records = [{"seq": i, "epsilon": 0.1 * i} for i in range(1, 5)]

    def chain(rs: list[dict[str, object]]) -> list[str]:
        out, prev = [], GENESIS
        for r in rs:
            prev = link_hash(prev, r)  # type: ignore[arg-type]
            out.append(prev)
        return out

    good = chain(records)
    assert len(set(good)) == 4
    edited = [dict(r) for r in records]
    edited[1]["epsilon"] = 0.25
    bad = chain(edited)
    assert bad[0] == good[0] and all(b != g for b, g in zip(bad[1:], good[1:], strict=True))
    swapped = chain([records[0], records[2], records[1], records[3]])
    assert swapped[3] != good[3]
    assert chain(records[1:])[0] != good[1]  # a deleted first record


@pytest.mark.parametrize("prev", ["", "0" * 63, "0" * 65])
def test_a_previous_hash_of_another_length_is_refused(prev: str) -> None:
    with pytest.raises(ValueError, match="previous hash must be 64 hex characters"):
        link_hash(prev, {})
