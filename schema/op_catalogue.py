"""The op catalogue: every op of the schema's ``OpNode`` union and what the code knows
about it, in one place.

One entry per op, in union order; tests/test_op_catalogue.py checks the entries against
schema/mlxgraph.fbs both ways. An entry is plain data (no MLX, no torch), so exporter/
and interpreter/ both read it:

- ``name``: the op's one spelling in code, e.g. ``UpdateAndAttend``. Its schema table is
  ``name + "Node"`` (:attr:`Op.table`), the spelling of files, the generated bindings and
  graph records; :func:`entry` accepts either.
- ``traits``: the facts other modules ask for instead of comparing op names (:class:`Trait`).
- ``aten`` / ``mlx``: an elementwise unary op lowered and run generically names the ATen op
  it lowers from (``aten.<aten>.default``, input ``x``: exporter/lowerings/elementwise.py)
  and the MLX function its kernel applies to float input (``mx.<mlx>``, integer input
  computed in float32: interpreter/kernels/elementwise.py); None where the op has a
  lowering or kernel of its own.
- ``float_op``: a quantized op's float twin (the op the export quantizes into it).
- ``guard``: an op that indexes a table with ids computed at run time: what the index
  guard checks (interpreter/index_guard.py).
- ``checks``: attribute values the verifier refuses (schema/verify_bounds.py).
- ``bound``: how the verifier bounds what the op computes from runtime ints.

The registries keyed by op (interpreter kernels, interpreter token rules) refuse a name
that is not here, and every registry refuses a second registration of one key.
"""

from dataclasses import dataclass
from enum import Enum
from functools import cache


class Trait(Enum):
    """A fact about an op that modules ask for by the fact, never by the op's name."""

    UNARY = "elementwise on one input x: each output entry from x's entry alone"
    BINARY = "elementwise on operands a and b, broadcast"
    QUANTIZED = "reads a packed quantized weight (format 1.2); float_op is its float twin"
    ROW_WISE = "x @ W.T: each output row from its own input row (a Linear: an LM head)"
    EMBEDDING = "rows of a weight table picked by ids (the tokens' vocabulary table)"
    ATTENTION = "writes and reads one layer's KV cache, named by its layer_id"
    DTYPE_ONLY = "changes the dtype only (alignment and diff look through it)"
    STATE = "writes and reads one layer's recurrent state, named by its layer_id (format 1.3)"
    MATMUL = "a @ b, torch.matmul's batching (the product an expert table's gathered rows feed)"


class Bound(Enum):
    """What schema/verify_bounds.py bounds in a node that computes from runtime ints."""

    ARITH = "its value: arithmetic on runtime ints"
    AXIS = "its value: an axis size of x"
    SHAPE = "its shape operands"
    SHAPE_OR_KEEP = "its shape operands, where -1 infers or keeps an axis"
    RANGE = "its length"


@dataclass(frozen=True)
class Check:
    """A refused attribute value: ``field`` must pass ``test`` (a name verify_bounds.py
    knows: positive, finite, non_negative, not_nan, at_least_zero, at_least_one); ``what``
    says what it must be, for the error."""

    field: str
    test: str
    what: str


@dataclass(frozen=True)
class IndexGuard:
    """An op reading ``table`` at the ids in ``indices``: along the axis held by attribute
    ``axis`` (None: axis 0); ``scalar``: the ids are one scalar operand."""

    indices: str
    table: str
    axis: str | None = None
    scalar: bool = False


@dataclass(frozen=True)
class Op:
    """One op of the catalogue (see the module docstring)."""

    name: str
    traits: frozenset = frozenset()
    aten: str | None = None
    mlx: str | None = None
    float_op: str | None = None
    guard: IndexGuard | None = None
    checks: tuple = ()
    bound: Bound | None = None
    state: str | None = None  # Trait.STATE: the kind of state it keeps (a store's kind)

    @property
    def table(self) -> str:
        """The op's schema table (and union member) name, e.g. 'UpdateAndAttendNode'."""
        return self.name + "Node"

    def has(self, trait: Trait) -> bool:
        """Whether the op has ``trait``."""
        return trait in self.traits

    @property
    def sizes_from_operands(self) -> bool:
        """The op's output shape comes from operands (which may hold the token count)."""
        return self.bound in (Bound.SHAPE, Bound.SHAPE_OR_KEEP)


def _op(name, *traits, **facts) -> Op:
    return Op(name, frozenset(traits), **facts)


_UNARY, _BINARY = Trait.UNARY, Trait.BINARY
OPS = (
    # elementwise, one input
    _op("Neg", _UNARY, aten="neg"),
    _op("Exp", _UNARY, aten="exp", mlx="exp"),
    _op("Log", _UNARY, aten="log", mlx="log"),
    _op("Sqrt", _UNARY, aten="sqrt", mlx="sqrt"),
    _op("Rsqrt", _UNARY, aten="rsqrt", mlx="rsqrt"),
    _op("Sin", _UNARY, aten="sin", mlx="sin"),
    _op("Cos", _UNARY, aten="cos", mlx="cos"),
    _op("Tanh", _UNARY, aten="tanh", mlx="tanh"),
    _op("Sigmoid", _UNARY, aten="sigmoid"),      # kernel: native on the CPU
    _op("Silu", _UNARY, aten="silu"),            # kernel: native on the CPU
    _op("Abs", _UNARY, aten="abs"),              # kernel keeps integer dtypes
    _op("Reciprocal", _UNARY, aten="reciprocal", mlx="reciprocal"),
    _op("LogicalNot", _UNARY, aten="logical_not"),
    _op("Erf", _UNARY, aten="erf", mlx="erf"),
    _op("Gelu", _UNARY),
    _op("Clamp", _UNARY, checks=(Check("min", "not_nan", "a number (not NaN)"),
                                Check("max", "not_nan", "a number (not NaN)"))),
    # elementwise, two operands
    *(_op(name, _BINARY) for name in (
        "Add", "Sub", "Mul", "Div", "Pow", "Maximum", "Minimum", "Remainder", "Equal",
        "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr")),
    _op("Where"),
    # reductions
    _op("Mean"), _op("Sum"), _op("Max"), _op("Argmax"), _op("Softmax"),
    # products and lookups
    _op("Matmul", Trait.MATMUL),
    _op("Addmm", checks=(Check("alpha", "finite", "finite"), Check("beta", "finite", "finite"))),
    _op("Linear", Trait.ROW_WISE),
    _op("Embedding", Trait.EMBEDDING, guard=IndexGuard("indices", "weight")),
    _op("Gather", guard=IndexGuard("indices", "x", axis="axis")),
    # shapes and layout
    _op("Reshape", bound=Bound.SHAPE_OR_KEEP),
    _op("Permute"),
    _op("Expand", bound=Bound.SHAPE_OR_KEEP),
    _op("Slice", checks=(Check("step", "at_least_one", ">= 1"),)),
    _op("Select", guard=IndexGuard("index", "x", axis="axis", scalar=True)),
    _op("Concat"), _op("Squeeze"), _op("Unsqueeze"), _op("Split"),
    _op("Cast", _UNARY, Trait.DTYPE_ONLY),
    # creation and runtime ints
    _op("Arange", bound=Bound.RANGE),
    _op("Full", bound=Bound.SHAPE),
    _op("SymSize", bound=Bound.AXIS),
    _op("SymArith", bound=Bound.ARITH),
    # fused
    _op("RmsNorm", checks=(Check("eps", "non_negative", "finite and >= 0"),
                           Check("weight_offset", "finite", "finite"))),
    _op("Rope"),
    _op("UpdateAndAttend", Trait.ATTENTION, checks=(
        Check("scale", "positive", "finite and > 0"),
        Check("softcap", "non_negative", "finite and >= 0 (0: no softcapping)"))),
    _op("LayerNorm", checks=(Check("eps", "non_negative", "finite and >= 0"),)),
    _op("TopK", checks=(Check("k", "at_least_zero", ">= 0"),)),
    # quantized weights (format 1.2)
    _op("QuantizedLinear", Trait.QUANTIZED, Trait.ROW_WISE, float_op="Linear"),
    _op("QuantizedEmbedding", Trait.QUANTIZED, Trait.EMBEDDING, float_op="Embedding",
        guard=IndexGuard("indices", "weight")),
    # elementwise, one input (format 1.3)
    _op("Expm1", _UNARY, aten="expm1", mlx="expm1"),
    _op("Log1p", _UNARY, aten="log1p", mlx="log1p"),
    _op("Erfinv", _UNARY, aten="erfinv", mlx="erfinv"),
    # recurrent state (format 1.3)
    _op("CausalConv", Trait.STATE, state="conv_state"),
    _op("SsdScan", Trait.STATE, state="ssm_state"),
    _op("GatedDelta", Trait.STATE, state="delta_state",
        checks=(Check("scale", "positive", "finite and > 0"),)),
    _op("SelectiveScan", Trait.STATE, state="scan_state"),
)


@cache
def _by_name() -> dict:
    out = {}
    for o in OPS:
        out[o.name] = out[o.table] = o
    return out


def entry(name: str) -> Op:
    """The catalogue entry of an op by name ('UpdateAndAttend') or table ('UpdateAndAttendNode').

    Raises:
        KeyError: no op has that name.
    """
    try:
        return _by_name()[name]
    except KeyError:
        raise KeyError(f"{name!r} is not an op of the catalogue (schema/op_catalogue.py)") from None


def ops_with(trait: Trait) -> tuple:
    """Every op with ``trait``, in union order."""
    return tuple(o for o in OPS if trait in o.traits)


def quantized_form(name: str) -> Op | None:
    """The quantized op whose float twin is op ``name``, or None (it has none)."""
    float_name = entry(name).name
    return next((o for o in OPS if o.float_op == float_name), None)


__all__ = ["OPS", "Bound", "Check", "IndexGuard", "Op", "Trait", "entry", "ops_with",
           "quantized_form"]
