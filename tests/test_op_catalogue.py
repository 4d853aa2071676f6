"""The op catalogue (schema/op_catalogue.py) is the one place that knows ops by name.

It matches the schema's OpNode union both ways, every op has a kernel and a token rule,
every registry refuses a second registration and a name that is not an op, and no module
outside the places that register ops spells an op's name: they ask the catalogue.
"""

import ast
from pathlib import Path

import pytest
import tomllib

from mlxgraph.schema.op_catalogue import OPS, Trait, entry, ops_with, quantized_form
from mlxgraph.schema.registry import LazyRegistry
from mlxgraph.schema.spec import op_spec, op_specs

ROOT = Path(__file__).resolve().parents[1]
# Where op names may be spelled: the catalogue, and the modules that register per op (the
# kernels, the lowerings and their symbolic-size helper, the token rules).
OP_NAME_FOLDERS = {"kernels", "lowerings"}
# (quantize_tables.py emits the Reshape after an expert table's rows, as a lowering would.)
OP_NAME_MODULES = {"op_catalogue.py", "symbolic_exprs.py", "token_rules.py",
                   "token_rules_layout.py", "quantize_tables.py"}
# (module, string): a string that equals an op name but means something else there.
NOT_OP_NAMES = {("tokenizer_check.py", "Split")}  # a tokenizer.json pre-tokenizer type


def test_catalogue_matches_the_schema_union():
    """Every OpNode member has an entry and every entry is a member, in union order."""
    union = [spec.name for _, spec in sorted(op_specs().items())]
    assert [op.table for op in OPS] == union


def test_one_entry_per_op_and_each_lookup_spelling():
    assert len({op.name for op in OPS}) == len(OPS)
    for op in OPS:
        assert entry(op.name) is op and entry(op.table) is op
    with pytest.raises(KeyError, match="not an op"):
        entry("Frobnicate")


def test_catalogue_facts_name_real_fields_and_ops():
    """Checks and guards name fields of the op's table; a quantized op's twin exists and
    quantizes into it."""
    for op in OPS:
        fields = {f.name for f in op_spec(op.table).fields}
        for check in op.checks:
            assert check.field in fields, (op.name, check.field)
        if op.guard is not None:
            assert {op.guard.indices, op.guard.table} <= fields, op.name
            assert op.guard.axis is None or op.guard.axis in fields, op.name
        if op.has(Trait.QUANTIZED):
            assert quantized_form(op.float_op) is op
        assert op.mlx is None or op.aten is not None, f"{op.name}: a generic kernel, no lowering"


def test_every_op_has_a_kernel_and_a_token_rule():
    from mlxgraph.interpreter.batching.token_rules import rules
    from mlxgraph.interpreter.kernels import get_kernel

    assert [op.name for op in OPS if get_kernel(op.table) is None] == []
    assert [op.name for op in OPS if op.name not in rules()] == []


def test_every_unary_op_is_elementwise_on_x():
    for op in ops_with(Trait.UNARY):
        assert [f.name for f in op_spec(op.table).inputs] == ["x"], op.name


def test_a_registry_refuses_a_second_registration():
    registry = LazyRegistry(__name__, ())
    registry.add("Add", 1)
    with pytest.raises(ValueError, match="already registered"):
        registry.add("Add", 2)
    assert registry.table() == {"Add": 1}


def test_registries_refuse_duplicates_and_unknown_ops():
    from mlxgraph.interpreter.batching.token_rules import rule, rules
    from mlxgraph.interpreter.kernels import get_kernel, register

    assert get_kernel("AddNode") is not None and "Add" in rules()  # both tables loaded
    with pytest.raises(ValueError, match="already registered"):
        register("Add")(lambda a, b: a)
    with pytest.raises(KeyError, match="not an op"):
        register("Frobnicate")
    with pytest.raises(ValueError, match="already registered"):
        rule("Add")(lambda n: [None])
    with pytest.raises(KeyError, match="not an op"):
        rule("Frobnicate")


def test_lowerings_refuse_a_second_registration():
    pytest.importorskip("torch")
    from mlxgraph.exporter.lowerings import lowerings, register

    target = next(iter(lowerings()))
    with pytest.raises(ValueError, match="already registered"):
        register(target)(lambda ctx, node: None)


def package_folders() -> list:
    """The package's source folders, from pyproject's package-dir (generated/ left out)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = config["tool"]["setuptools"]["package-dir"].values()
    return sorted(ROOT / d for d in set(dirs) if d != "generated")


def op_name_literals(source: str, module: str, names: set) -> list:
    """'line: name' for every string constant of ``source`` equal to an op name (parts of
    f-strings aside: they build other names), but for ``module``'s NOT_OP_NAMES."""
    tree = ast.parse(source)
    in_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                  for v in node.values}
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in names and id(node) not in in_fstring
            and (module, node.value) not in NOT_OP_NAMES]


def allowed_to_name_ops(path: Path) -> bool:
    """Whether a module (path from the repository root) may spell op names."""
    return path.name in OP_NAME_MODULES or bool(OP_NAME_FOLDERS & set(path.parent.parts))


OP_NAMES = {op.name for op in OPS} | {op.table for op in OPS}


def test_no_op_names_outside_the_catalogue_and_registrations():
    """Modules ask the catalogue (``entry(op).has(Trait...)``) instead of comparing op names."""
    found = []
    for folder in package_folders():
        for path in sorted(folder.rglob("*.py")):
            where = path.relative_to(ROOT)
            if not allowed_to_name_ops(where):
                found += [f"{where}:{hit}"
                          for hit in op_name_literals(path.read_text(), path.name, OP_NAMES)]
    assert not found, "op names spelled outside the catalogue:\n" + "\n".join(found)


def test_the_op_name_scan_catches_names():
    """The scan itself: a tuple of names and a comparison with a table name are caught; an
    f-string part, an exempt string and a folder that registers ops are not."""
    source = ('ops = ("Linear", "QuantizedLinearNode")\nok = op == "CastNode"\n'
              'f"{name}Add{accessor}"\nkind == "Split"\n')
    assert op_name_literals(source, "tokenizer_check.py", OP_NAMES) == [
        "1: 'Linear'", "1: 'QuantizedLinearNode'", "2: 'CastNode'"]
    assert len(op_name_literals(source, "probe.py", OP_NAMES)) == 4
    assert allowed_to_name_ops(Path("interpreter/kernels/linalg.py"))
    assert allowed_to_name_ops(Path("interpreter/token_rules.py"))
    assert not allowed_to_name_ops(Path("interpreter/program.py"))
