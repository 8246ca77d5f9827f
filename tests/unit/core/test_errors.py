"""qveil.errors' echo of user input: at most 80 characters, its start and its (longer) end
kept, so a long path still names its file."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qveil.errors import ECHO_LIMIT, clip, echo


def test_a_short_text_is_unchanged() -> None:
    assert clip("nope.npz") == "nope.npz"
    assert echo("nope.npz") == "'nope.npz'"
    assert echo(3.5) == "'3.5'"


def test_a_long_path_keeps_its_file_name() -> None:
    path = "/tmp/pytest-of-root/pytest-46/popen-gw1/" + "d" * 90 + "/missing.tok"
    out = clip(path)
    assert len(out) == ECHO_LIMIT and "\u2026" in out
    assert out.startswith("/tmp/pytest-of") and out.endswith("/missing.tok")


@given(st.text(max_size=300), st.integers(min_value=4, max_value=120))
def test_clip_never_exceeds_the_limit_and_keeps_both_ends(text: str, limit: int) -> None:
    out = clip(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        head, tail = out.split("\u2026", 1) if "\u2026" not in text else (out[:1], out[-1:])
        assert text.startswith(head) and text.endswith(tail)
