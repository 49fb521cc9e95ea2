"""Imports without cycles: schemas and topology, one layer, depend on each other in one
direction only, and no group of package modules imports itself round at module level
(an import inside a function runs late, so it closes no cycle at load time; neither
does one under `if TYPE_CHECKING:`, which never runs)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_packaging import imported_modules, module_name, tracked_python_files


def _package_files() -> dict[str, Path]:
    """Installed module name -> its file, for every tracked file of the package folders."""
    found = {module_name(path): path for path in tracked_python_files() if path.is_file()}
    return {name: path for name, path in found.items() if name is not None}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _load_time_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module loads: those of its top level and of
    the if/try/with blocks there, not those in functions, classes or `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            found += _load_time_imports(node.orelse if _is_type_checking(node.test) else node.body + node.orelse)
        elif isinstance(node, ast.Try):
            found += _load_time_imports(node.body + node.orelse + node.finalbody
                                        + [stmt for handler in node.handlers for stmt in handler.body])
        elif isinstance(node, ast.With):
            found += _load_time_imports(node.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The package modules an import statement loads: `from a import b` loads module a.b when
    there is one, else a itself."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    if node.level or not node.module:
        return set()
    subs = {f"{node.module}.{alias.name}" for alias in node.names} & known
    names_only = any(f"{node.module}.{alias.name}" not in known for alias in node.names)
    return subs | ({node.module} & known if names_only or not subs else set())


def _module_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports at load time."""
    files = _package_files()
    known = set(files)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = {target for node in _load_time_imports(tree.body) for target in _targets(node, known)} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle_and_only_that() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_schemas_and_topology_depend_one_way() -> None:
    """Function-level imports count too: the two folders are one layer, so which one builds on
    the other must be a single direction."""
    pairs: dict[tuple[str, str], list[str]] = {("schemas", "topology"): [], ("topology", "schemas"): []}
    for name, path in _package_files().items():
        own = name.split(".")[1] if name.count(".") else ""
        if own not in ("schemas", "topology"):
            continue
        other = "topology" if own == "schemas" else "schemas"
        pairs[(own, other)] += [f"{name} imports {module} (line {line})" for line, module in imported_modules(path)
                                if module == f"streamjoin.{other}" or module.startswith(f"streamjoin.{other}.")]
    both = all(pairs.values())
    assert not both, "schemas and topology import each other:\n" + "\n".join(sum(pairs.values(), []))


def test_no_module_level_import_cycles() -> None:
    cycles = _cycles(_module_graph())
    assert not cycles, "modules importing each other at load time:\n" + "\n".join(" <-> ".join(c) for c in cycles)
