"""The import graph of the ``qveil`` namespace (docs/architecture.md, "One direction of
imports"), checked over the sources as the editable install puts them on the path:

* no cycle between qveil modules, imports inside functions and under ``if TYPE_CHECKING:``
  included (grimp counts them like any other import): a loop that only the type checker
  follows still ties two modules into one, so it is a cycle too. A cycle fails with its path
  (a -> b -> ... -> a);
* every import inside a function carries its reason: a comment on the import's line or on the
  line above it (one comment above a block of imports, separated by blank lines at most,
  covers the block), as docs/architecture.md states the convention.

Both run in ``make check``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the folders of the namespace's parts whose sources are written by hand (the generated
#: stubs under proto/ are left out of the reason check, not out of the graph)
PARTS = ("core", "server", "trainer", "client", "common", "experiments")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("qveil", exclude_type_checking_imports=False, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, successors = work[-1]
            w = next(successors, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _cycle_path(graph: grimp.ImportGraph, modules: list[str]) -> str:
    """One cycle through the first of ``modules`` (a strongly connected set), as a path."""
    inside = set(modules)
    start = modules[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.find_modules_directly_imported_by(v) & inside):
                if w == start:
                    path = [start]
                    while v != start:
                        path.append(v)
                        v = parent[v]
                    return " -> ".join([start, *reversed(path[1:]), start])
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return " <-> ".join(modules)


def test_the_graph_holds_every_part(graph: grimp.ImportGraph) -> None:
    """The graph is the whole namespace: a module of each part, and imports inside functions
    and under ``if TYPE_CHECKING:`` (the composition root's command modules are imported by
    name, not counted)."""
    for mod in (
        "qveil.keyed",
        "qveil.server.app",
        "qveil.trainer.train",
        "qveil.client.sync",
        "qveil.common.serde",
        "qveil.experiments.commands.experiments",
        "qveil.v1.value_service_pb2",
    ):
        assert mod in graph.modules, mod
    # qveil.server.governance.retrain imports the trainer's estimators inside functions and
    # under TYPE_CHECKING only
    assert "qveil.trainer.estimators" in graph.find_modules_directly_imported_by(
        "qveil.server.governance.retrain"
    )


def test_no_import_cycle_between_qveil_modules(graph: grimp.ImportGraph) -> None:
    bad = _cycles(graph)
    assert not bad, "import cycles (an import inside a function counts):\n" + "\n".join(
        _cycle_path(graph, c) for c in bad
    )


def test_the_cycle_finder_reports_a_cycle_with_its_path() -> None:
    """The check itself, on a graph with a known loop: found, and named as a path."""
    g = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        g.add_import(importer=a, imported=b)
    cycles = _cycles(g)
    assert cycles == [["p.a", "p.b", "p.c"]]
    assert _cycle_path(g, cycles[0]) == "p.a -> p.b -> p.c -> p.a"


def _sources() -> Iterator[Path]:
    for part in PARTS:
        yield from sorted((ROOT / part / "qveil").rglob("*.py"))


def _reason_lines(source: str) -> set[int]:
    """Lines holding a comment that says something (a bare ``# noqa`` or ``# type:`` pragma
    is not a reason)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string.lstrip("#").strip()
        if text and not text.startswith(("noqa", "type:")):
            lines.add(tok.start[0])
    return lines


def unexplained_imports(source: str) -> list[int]:
    """Line numbers of the imports inside functions of ``source`` that carry no reason."""
    tree = ast.parse(source)
    reasons = _reason_lines(source)
    text = source.splitlines()
    inside = sorted(
        {
            node.lineno: node
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn)
            if isinstance(node, ast.Import | ast.ImportFrom)
        }.items()
    )
    explained: set[int] = set()  # first lines of the imports with a reason
    ends: dict[int, int] = {}  # last line -> first line of each import inside a function
    for first, node in inside:
        last = node.end_lineno or first
        ends[last] = first
        if reasons & set(range(first, last + 1)) or first - 1 in reasons:
            explained.add(first)
            continue
        above = first - 1  # a block: the import above (blank lines between) is explained
        while above > 0 and not text[above - 1].strip():
            above -= 1
        if ends.get(above) in explained:
            explained.add(first)
    return [first for first, _node in inside if first not in explained]


def test_every_import_inside_a_function_has_its_reason() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _sources()
        for line in unexplained_imports(path.read_text(encoding="utf-8"))
    ]
    assert not missing, (
        "imports inside functions without a reason (a comment on the line or the line above; "
        "docs/architecture.md):\n" + "\n".join(missing)
    )


def test_the_reason_check_reads_comments_and_blocks() -> None:
    source = """
def f():
    import a  # an optional extra
    # heavy: loaded only when f runs
    import b

    from c import d
    x = 1
    import e
    # noqa: F401
    import g
    s = "# not a comment"; import h
"""
    assert unexplained_imports(source) == [9, 11, 12]
