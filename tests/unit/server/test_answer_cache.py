"""The cache of answered values: a look-up answers only what was recorded for the same
release, every state and action of the request, bit for bit; anything else is None."""

from __future__ import annotations

import numpy as np

from qveil.server.answer_cache import AnswerCache


def test_answers_only_what_was_recorded_for_the_release() -> None:
    c = AnswerCache()
    xs = np.array([0.25, 0.5, 0.0, 1.0])
    vals = np.array([[1.0, -0.0], [2.5, 3.0], [-1.0, 2.0**-20], [0.0, 7.0]])
    assert c.lookup("r", xs, [0, 1]) is None
    c.record("r", xs, [0, 1], vals, 3)
    got = c.lookup("r", xs[[3, 1, 1, 0]], [1, 0])
    assert got is not None
    assert got.tobytes() == vals[[3, 1, 1, 0]][:, [1, 0]].tobytes()  # -0.0 kept
    assert c.lookup("r", np.array([0.25, 0.75]), [0]) is None  # one state not recorded
    assert c.lookup("r", xs, [2]) is None  # an action not recorded
    assert c.lookup("other", xs, [0]) is None
    c.record("r", np.array([0.75]), [2], np.array([[4.0]]), 3)
    assert c.lookup("r", np.array([0.75, 0.75]), [2]).tolist() == [[4.0], [4.0]]  # type: ignore[union-attr]
    assert c.lookup("r", np.array([0.75]), [0, 2]) is None
    c.record("s", xs, [0], vals[:, :1], 3)  # another release active: the old one is dropped
    assert c.lookup("r", xs, [0]) is None
    assert c.lookup("s", xs, [0]).tolist() == vals[:, :1].tolist()  # type: ignore[union-attr]


def test_keeps_at_most_max_entries() -> None:
    c = AnswerCache(max_entries=5)
    c.record("r", np.array([0.1, 0.2]), [0, 1], np.ones((2, 2)), 2)
    c.record("r", np.array([0.3, 0.4]), [0, 1], np.ones((2, 2)), 2)  # 8 > 5: not kept
    assert c.lookup("r", np.array([0.1, 0.2]), [0, 1]) is not None
    assert c.lookup("r", np.array([0.3]), [0]) is None


def test_states_of_several_coordinates_are_keyed_by_their_row() -> None:
    c = AnswerCache()
    xs = np.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.5], [1.0, 0.0, 0.5, 0.5]])
    vals = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    c.record("r", xs, [0, 1], vals, 3)
    got = c.lookup("r", xs[[2, 0, 2]], [1])
    assert got is not None and got.tolist() == [[6.0], [2.0], [6.0]]
    assert c.lookup("r", np.array([[0.1, 0.2, 0.3, 0.6]]), [0]) is None
    assert c.lookup("r", xs[:, ::-1], [0]) is None  # a column permutation is another state


def test_readers_never_see_a_wrong_value_while_writers_keep() -> None:
    """Writers keep batches (new states, growing the matrix, new actions of kept states)
    while readers look up: a look-up is None or every value is the one kept."""
    import threading

    c = AnswerCache()
    grid = np.round(np.linspace(0.0, 1.0, 5001), 6)

    def value(x: np.ndarray, a: int) -> np.ndarray:
        return np.round(x * 1000 + a, 3)

    stop = threading.Event()
    bad: list[str] = []

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            xs = grid[rng.integers(0, grid.size, int(rng.choice([1, 7, 300])))]
            acts = sorted({int(a) for a in rng.integers(0, 3, 2)})
            c.record("r", xs, acts, np.column_stack([value(xs, a) for a in acts]), 3)

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            xs = grid[rng.integers(0, grid.size, int(rng.choice([1, 64])))]
            acts = [int(rng.integers(0, 3))]
            got = c.lookup("r", xs, acts)
            if got is not None and not np.array_equal(got[:, 0], value(xs, acts[0])):
                bad.append(f"{xs[:3]} {acts}")

    readers = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    writers = [threading.Thread(target=writer, args=(10 + i,)) for i in range(3)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert bad == []
