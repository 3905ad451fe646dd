"""The package's shape: no function longer than MAX_LINES, and no import cycle.

A function is measured from its `def` line to its last line, everything nested in it (a
closure, a class defined inside it) counted as its own. An import cycle is a module
that imports, through any chain of gpusched's modules, itself: every import counts, the
ones under `if TYPE_CHECKING:` and the ones inside functions too, since each is a
dependency that a reader, a type checker or a later call follows. The import graph is
grimp's, the one import-linter checks the layer contracts on (pyproject.toml).

Each check is also run on a small package written for it (a cycle, a long function), so
that a check that could no longer fail would fail here.
"""

from __future__ import annotations

import ast
import itertools
import sys
import textwrap
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpusched"
MAX_LINES = 80

_Function = ast.FunctionDef | ast.AsyncFunctionDef


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path:name (N lines)` of each outermost function or method under `root` longer
    than `limit` lines, in path order."""
    found: list[str] = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Function):
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found.append(f"{path}:{prefix}{child.name} ({lines} lines)")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:  # an `if`, `try` or `with` at module or class level: its defs are outermost
                visit(child, path, prefix)

    for path in sorted(root.rglob("*.py")):
        shown = path.relative_to(root.parent)
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), shown, "")
    return found


def _knots(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative):
    each is a set of modules every one of which imports, through the others, every other."""
    modules = sorted(graph.modules)
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    knots: list[list[str]] = []
    for start in modules:
        if start in index:
            continue
        work = [(start, iter(imports[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, pending = work[-1]
            child = next(pending, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imports.get(child, ()))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                knot = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    knot.append(member)
                    if member == module:
                        break
                if len(knot) > 1:
                    knots.append(sorted(knot))
    return sorted(knots)


def import_cycles(package: str) -> list[str]:
    """Each import cycle among `package`'s modules, as `a -> b -> a` with the line of each
    import: for every import inside a knot (_knots), the shortest chain back to its
    importer, so that every import that has to go is in some listed cycle."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    cycles: list[str] = []
    for knot in _knots(graph):
        seen: set[tuple[str, ...]] = set()
        for importer in knot:
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                back = graph.find_shortest_chain(importer=imported, imported=importer)
                if imported not in knot or back is None:
                    continue
                cycle = (importer, *back)  # starts and ends at `importer`
                # One rotation per cycle: the one that starts at its least module.
                first = cycle.index(min(cycle[:-1]))
                canonical = (*cycle[first:-1], *cycle[:first], cycle[first])
                if canonical in seen:
                    continue
                seen.add(canonical)
                steps = []
                for a, b in itertools.pairwise(canonical):
                    details = graph.get_import_details(importer=a, imported=b)
                    where = ", ".join(f"line {d['line_number']}" for d in details)
                    steps.append(f"  {a} -> {b} ({where})")
                cycles.append(" -> ".join(canonical) + "\n" + "\n".join(steps))
    return cycles


def test_no_function_is_longer_than_the_limit() -> None:
    offenders = long_functions(PACKAGE)
    if offenders:
        pytest.fail(f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders), pytrace=False)


def test_no_import_cycle() -> None:
    cycles = import_cycles("gpusched")
    if cycles:
        pytest.fail(f"{len(cycles)} import cycles:\n" + "\n".join(cycles), pytrace=False)


# -- the checks themselves, on a package written to break both rules ----------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_length_check_counts_a_closure_in_its_outer_function(tmp_path: Path) -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_LINES - 4))
    nested = f"def outer() -> None:\n    def inner() -> None:\n{body}        pass\n    inner()\n"
    method = (
        f"class Shape:\n    def method(self) -> None:\n{body}        pass\n"
        f"        pass\n        pass\n        pass\n"
    )
    _write(tmp_path / "probe", {"__init__.py": "", "a.py": nested, "b.py": method})
    assert nested.count("\n") == MAX_LINES  # just at the limit: allowed
    assert long_functions(tmp_path / "probe") == ["probe/b.py:Shape.method (81 lines)"]
    _write(tmp_path / "probe", {"a.py": nested + "    pass\n"})
    assert long_functions(tmp_path / "probe") == [
        "probe/a.py:outer (81 lines)",
        "probe/b.py:Shape.method (81 lines)",
    ]


def test_the_cycle_check_counts_type_checking_and_function_level_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "gpusched_shape_probe"
    monkeypatch.syspath_prepend(str(tmp_path))
    _write(
        tmp_path / name,
        {
            "__init__.py": "",
            # a -> b at module level, b -> a only for the type checker: a cycle.
            "a.py": f"from {name} import b\n",
            "b.py": f"""\
                TYPE_CHECKING = False
                if TYPE_CHECKING:
                    from {name}.a import thing
                """,
            # c -> d inside a function, d -> c at module level: a cycle too.
            "c.py": f"""\
                def late() -> None:
                    from {name} import d
                """,
            "d.py": f"import {name}.c\n",
            # e -> f, and nothing back: no cycle.
            "e.py": f"from {name} import f\n",
            "f.py": "",
        },
    )
    cycles = import_cycles(name)
    assert [c.splitlines()[0] for c in cycles] == [
        f"{name}.a -> {name}.b -> {name}.a",
        f"{name}.c -> {name}.d -> {name}.c",
    ]
    assert f"  {name}.b -> {name}.a (line 3)" in cycles[0]
    assert name not in sys.modules  # read, never imported
