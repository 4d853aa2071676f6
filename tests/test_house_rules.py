"""The house rules, checked: imports point one way with no cycles, modules stay small.

The rules are in docs/architecture.md ("Layers"). The import walk reads every module's
source (ast), so it sees imports inside functions too, relative imports, modules loaded
by name (``import_module("mlxgraph.x")``, or ``import_module(f"mlxgraph.tools.{name}")``
with the names a module-level table of the same module holds), and the lazy loads of the
op registries: a module that loads modules by name (``import_module``, ``LazyRegistry``)
and holds a module-level tuple of its package's submodule names imports each of them.

The size budget counts code, not prose: docstrings, comments and blank lines are free,
so documentation is never what a split squeezes.
"""

import ast
import io
import re
import tokenize
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
MAX_CODE_LINES = 250  # per Python module: lines holding code (not docstrings or comments)
MAX_NATIVE_CODE_LINES = 350  # per C/C++ source or header of interpreter/native/


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


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names (relative ones resolved)."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _is_import_module(func) -> bool:
    return (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module")


def _named_loads(arg, tree, modules) -> set:
    """The modules an ``import_module(arg)`` call can load: a literal name, or an f-string
    prefix completed by any string of the same module's module-level tables."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
        tables = [stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)]
        names = {n.value for table in tables for n in ast.walk(table)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        return {prefix + n for n in names if prefix + n in modules}
    return set()


def imports_of(name: str, path: Path, modules) -> tuple:
    """(static imports, lazy registry loads) of one module, as module names."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if sub in modules or not base else base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            found |= _named_loads(node.args[0], tree, modules)
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


def python_code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    tree = ast.parse(source)
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                       | ast.AsyncFunctionDef)
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
              tokenize.ENDMARKER}
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in layout:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - prose)


def native_code_lines(source: str) -> int:
    """C/C++ lines holding code: not blank, not only a comment."""
    source = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), source, flags=re.S)
    return sum(1 for line in source.splitlines()
               if line.strip() and not line.strip().startswith("//"))


def long_modules(paths) -> list:
    """'path: N code lines' for every source over its budget."""
    out = []
    for path in paths:
        native = path.suffix != ".py"
        count = (native_code_lines if native else python_code_lines)(path.read_text())
        budget = MAX_NATIVE_CODE_LINES if native else MAX_CODE_LINES
        if count > budget:
            out.append(f"{path.relative_to(ROOT)}: {count} code lines (budget {budget})")
    return out


def budgeted_modules() -> list:
    """Every Python module and C/C++ source of the repository except the generated
    bindings (and anything under a hidden folder: .git, .venv, .venv-latest)."""
    skip = {"generated", "build"}
    return sorted(p for p in ROOT.rglob("*")
                  if p.suffix in (".py", ".c", ".cpp", ".h")
                  and not any(part in skip or part.startswith(".")
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
    """No Python module over 250 code lines, no C/C++ file over 350 (the generated
    bindings excepted); docstrings, comments and blank lines do not count."""
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


def test_relative_and_by_name_imports_are_followed(tmp_path):
    """A relative import or an ``import_module`` call is an arrow like any other: the
    rules would catch a wrong-way one written either way."""
    path = tmp_path / "x.py"
    path.write_text(
        "from ..exporter import adapter\n"
        "from . import program\n"
        "import importlib\n"
        "importlib.import_module('mlxgraph.tools.cli')\n"
    )
    modules = {"mlxgraph.exporter.adapter", "mlxgraph.interpreter.program",
               "mlxgraph.tools.cli", "mlxgraph.interpreter.x"}
    static, _ = imports_of("mlxgraph.interpreter.x", path, modules)
    assert static == modules - {"mlxgraph.interpreter.x"}
    bad = wrong_way_arrows({"mlxgraph.interpreter.x": static})
    assert len(bad) == 2, bad  # the exporter sideways, the tools up


def test_budget_counts_code_not_prose():
    """Docstrings, comments and blank lines are free; every code line counts."""
    prose = '"""Module\n\ntext."""\n\n# a comment\n\n\ndef f():\n    """Doc\n    string."""\n'
    assert python_code_lines(prose + "    return 1\n") == 2
    assert python_code_lines("x = '''not\na docstring'''\n") == 2
    assert native_code_lines("/* a\n block */\n// line\n\nint x;\n") == 1
