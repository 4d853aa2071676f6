"""The house rules, checked: imports point one way with no cycles, modules stay small.

The rules are in docs/architecture.md ("Layers"). The import walk reads every module's
source (ast), so it sees imports inside functions too, and the lazy loads of the op
registries: a module that loads modules by name (``import_module``, ``LazyRegistry``)
and holds a module-level tuple of its package's submodule names imports each of them.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# module prefix -> layer. An import may point only to a lower layer or within its own
# package; exporter and interpreter share a layer and never import each other.
LAYERS = {
    "mlxgraph.generated": 0,
    "mlxgraph.schema": 1,
    "mlxgraph.exporter": 2,
    "mlxgraph.interpreter": 2,
    "mlxgraph.generation": 3,
    "mlxgraph.tools": 4,
    "mlxgraph": 5,
}


def _package_dirs() -> dict:
    """folder -> (module prefix, layer), the folders read from pyproject.toml's package-dir
    (the one mapping setuptools installs), so this test has no second copy of it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the same parser, vendored by pip
        from pip._vendor import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    assert set(package_dir) == set(LAYERS), (
        f"pyproject.toml's package-dir and LAYERS disagree: {sorted(package_dir)}")
    return {folder: (prefix, LAYERS[prefix]) for prefix, folder in package_dir.items()}


PACKAGES = _package_dirs()
MAX_MODULE_LINES = 300


def module_name(path: Path) -> str:
    """The dotted module name of a package source file."""
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    prefix = PACKAGES[folder][0]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([prefix, *rest])


def package_sources() -> dict:
    """{module name: path} for every source file of the mlxgraph package."""
    out = {}
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            out[module_name(path)] = path
    return out


def _lazy_loads(tree, source: str, name: str, is_package: bool, modules) -> set:
    """The submodules a loader module names in module-level tuples of strings."""
    if "import_module" not in source and "LazyRegistry" not in source:
        return set()
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Tuple) and value.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
            subs = {f"{package}.{e.value}" for e in value.elts}
            if subs <= set(modules):
                found |= subs
    return found


def imports_of(name: str, path: Path, modules) -> tuple:
    """(static imports, lazy registry loads) of one module, as module names."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    static = {m for m in found if m in modules and m != name}
    lazy = _lazy_loads(tree, source, name, path.name == "__init__.py", modules)
    return static, lazy


def import_graph(modules: dict) -> dict:
    """{module: set of modules it imports}, lazy registry loads included.

    A module a registry loads lazily imports the registry to register itself; that edge
    back to its own registry is the one cycle the pattern needs, and it is safe because
    the registry imports its modules only on first lookup, after both are loaded.
    """
    graph, lazy_of = {}, {}
    for name, path in modules.items():
        static, lazy = imports_of(name, path, modules)
        graph[name] = static | lazy
        lazy_of[name] = lazy
    for registry, loaded in lazy_of.items():
        for sub in loaded:
            graph.get(sub, set()).discard(registry)
    return graph


def find_cycle(graph: dict) -> list | None:
    """One import cycle as a list of modules (first == last), or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def package_of(module: str) -> str:
    """The top folder a module lives in ('api' for the mlxgraph package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES and parts[1] != "api" else "api"


def wrong_way_arrows(graph: dict) -> list:
    """Every import that points up a layer, sideways between packages, or into generated/."""
    bad = []
    for src, targets in graph.items():
        for dst in sorted(targets):
            a, b = package_of(src), package_of(dst)
            if a == b:
                continue
            if b == "generated" and a != "schema":
                bad.append(f"{src} -> {dst}: only the schema package reads generated/")
            elif PACKAGES[b][1] >= PACKAGES[a][1]:
                bad.append(f"{src} -> {dst}: {a} may not import {b}")
    return bad


def long_modules(paths) -> list:
    """'path: N lines' for every module over the budget."""
    out = []
    for path in paths:
        count = len(path.read_text().splitlines())
        if count > MAX_MODULE_LINES:
            out.append(f"{path.relative_to(ROOT)}: {count} lines (budget {MAX_MODULE_LINES})")
    return out


def budgeted_modules() -> list:
    """Every Python module of the repository except the generated bindings (and anything
    under a hidden folder: .git, .venv, make test-latest's .venv-latest)."""
    skip = {"generated", "build"}
    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(part in skip or part.startswith(".")
                             for part in p.relative_to(ROOT).parts))


def test_no_import_cycles():
    """No module imports itself through a chain of imports (lazy ones included)."""
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_imports_point_one_way():
    """generated <- schema <- {exporter, interpreter} <- generation <- tools <- api, nothing
    else."""
    bad = wrong_way_arrows(import_graph(package_sources()))
    assert not bad, "wrong-way imports:\n" + "\n".join(bad)


def test_modules_within_budget():
    """No module over 300 lines (the generated bindings excepted)."""
    over = long_modules(budgeted_modules())
    assert not over, "modules over budget:\n" + "\n".join(over)


@pytest.mark.parametrize("edges, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_cycle_finder_finds_cycles(edges, cycle):
    """The cycle finder itself: it would catch a cycle, and passes a chain."""
    assert find_cycle(edges) == cycle


def test_arrow_rules_catch_wrong_way_imports():
    """The arrow rules themselves: up a layer, sideways and into generated/ are caught."""
    graph = {
        "mlxgraph.schema.reader": {"mlxgraph.interpreter.program", "mlxgraph.generated.x"},
        "mlxgraph.exporter.pipeline": {"mlxgraph.interpreter.program"},
        "mlxgraph.interpreter.program": {"mlxgraph.generated.x", "mlxgraph.schema.reader"},
        "mlxgraph.tools.cli": {"mlxgraph"},
    }
    bad = wrong_way_arrows(graph)
    assert len(bad) == 4, bad
