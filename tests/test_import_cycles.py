"""No import cycles in engine/ or function/ (issue 47): every import counts, at module level or
inside a function (a lazy import still ties the two files together), except those under
``if TYPE_CHECKING``. ALLOWED lists the cycles tolerated (none now); it may only shrink: a new
cycle fails, and so does an entry that no longer matches a cycle exactly."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "function")

# the cycles allowed: none since 2026-12-06 (formats <-> lowbit: block_base.py; paths out of the
# kernel loop: choice.py; kernels <-> lowbit_kernels <-> arm/lowbit: njit_base.py; int8_dot <-> the
# ISA files: they register their block bodies, int8_dot.register_bodies). Keep it empty.
ALLOWED: tuple[frozenset[str], ...] = ()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` bodies."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
                    (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
                for stmt in node.body:
                    skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that the file imports (a package's own submodule, not the package
    itself, for ``from pkg import submodule``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_blocks(tree)
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(resolve(alias.name) or "")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else resolve(module) or "")
    found.discard("")
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    names = set(files)
    return {n: imports_of(p, n, names) for n, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def test_the_cycle_finder_finds_cycles_and_nothing_else():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(map(sorted, cycles(g))) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_no_new_import_cycle_in_engine_or_function():
    found = cycles(import_graph())
    new = [sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED)]
    assert not new, f"new import cycles: {new}"
    stale = [sorted(a) for a in ALLOWED if a not in found]
    assert not stale, (f"these allowed cycles are no longer cycles as listed: {stale}; shrink ALLOWED to what "
                       f"is left: {[sorted(c) for c in found]}")


def private_imports() -> list[tuple[str, str, str]]:
    """(importing file, module, name) for every `_name` imported from another engine/function module."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGES)):
                    out += [(str(path.relative_to(ROOT)), node.module or ".", a.name) for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_private_name_crosses_a_file():
    """What another file needs is public in the file that defines it (issue 47)."""
    assert private_imports() == []
