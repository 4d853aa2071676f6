"""Plain Python records of a graph file's parts, shared by the writer, reader and tools."""

from dataclasses import dataclass, field

from mlxgraph.generated.mlxgraph_generated import OperandKind

_KIND_NAMES = {
    OperandKind.tensor: "tensor",
    OperandKind.value: "value",
    OperandKind.int_: "int",
    OperandKind.float_: "float",
    OperandKind.bool_: "bool",
}
_KIND_CODES = {name: code for code, name in _KIND_NAMES.items()}


@dataclass(frozen=True)
class Operand:
    """An op input that is a tensor slot, a value slot (runtime int) or a literal."""

    kind: str          # 'tensor' | 'value' | 'int' | 'float' | 'bool'
    index: int = -1    # slot index for 'tensor' and 'value'
    number: float = 0.0

    @staticmethod
    def tensor(slot: int) -> "Operand":
        """An operand read from tensor slot ``slot``."""
        return Operand("tensor", int(slot))

    @staticmethod
    def value(slot: int) -> "Operand":
        """An operand read from value slot ``slot`` (a runtime int)."""
        return Operand("value", int(slot))

    @staticmethod
    def literal(x) -> "Operand":
        """A literal bool, int or float operand."""
        if isinstance(x, bool):
            return Operand("bool", -1, float(x))
        if isinstance(x, int):
            return Operand("int", -1, float(x))
        return Operand("float", -1, float(x))

    @property
    def kind_code(self) -> int:
        """The schema's OperandKind code."""
        return _KIND_CODES[self.kind]

    @staticmethod
    def from_code(kind_code: int, index: int, number: float) -> "Operand":
        """Build from the raw struct fields.

        Raises:
            KeyError: unknown operand kind code.
        """
        return Operand(_KIND_NAMES[kind_code], index, number)

    @property
    def is_literal(self) -> bool:
        """True for int, float and bool literals."""
        return self.kind in ("int", "float", "bool")

    def python_value(self):
        """The literal as a Python bool, int or float (literals only)."""
        if self.kind == "bool":
            return bool(self.number)
        if self.kind == "int":
            return int(self.number)
        return float(self.number)

    def __str__(self) -> str:
        if self.kind == "tensor":
            return f"%{self.index}"
        if self.kind == "value":
            return f"$v{self.index}"
        return repr(self.python_value())


@dataclass(frozen=True)
class Provenance:
    """Where a node came from in the exported program."""

    source: str = ""
    module_path: str = ""
    target: str = ""


@dataclass
class NodeRecord:
    """One node: the op table name and its fields as Python values.

    Field values: tensor/value slots as int (lists of ints for vector fields), Operand
    for Operand fields, dtype and other enums as int codes, and plain Python scalars.
    A field left out (or None) is not written.
    """

    op: str
    fields: dict
    provenance: Provenance = field(default_factory=Provenance)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor slot: name, dtype name (or None) and shape (ints; symbol names; None = dynamic)."""

    name: str
    dtype: str | None
    shape: tuple


@dataclass(frozen=True)
class SymbolInfo:
    """A symbolic dimension with inclusive bounds and its runtime value slot."""

    name: str
    min: int
    max: int | None
    value: int | None


@dataclass(frozen=True)
class ConstantInfo:
    """A constant: the tensor slot it fills and where its bytes are."""

    tensor: int
    offset: int
    length: int
    hash: str


@dataclass(frozen=True)
class LayerCacheInfo:
    """KV-cache geometry of one attention layer (sliding_window 0 = full attention;
    attention_chunk C > 0 = chunked local attention, a query sees its own chunk of C;
    values_in_keys: latent attention, each value is the first v_head_dim columns of its key,
    and the cache holds the keys alone; format 1.3)."""

    layer_id: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    sliding_window: int = 0
    attention_chunk: int = 0
    values_in_keys: bool = False


@dataclass(frozen=True)
class StateLayerInfo:
    """The off-graph recurrent state of one layer (format 1.3): its whole shape, batch
    first, and storage dtype name; a new session's state is zeros
    (docs/architecture.md#recurrent-state)."""

    layer_id: int
    shape: tuple
    dtype: str


@dataclass
class ModelInfo:
    """Model metadata carried by a graph file."""

    architecture: str = ""
    num_layers: int = 0
    vocab_size: int = 0
    hidden_size: int = 0
    max_context: int = 0
    eos_token_ids: tuple = ()
    bos_token_id: int = -1
    layers: tuple = ()          # LayerCacheInfo
    tokenizer: str = ""
    extra: dict = field(default_factory=dict)
    # file name -> text; stored in extra as tokenizer_file:<name> (schema/tokenizer_files.py)
    tokenizer_files: dict = field(default_factory=dict)
    states: tuple = ()          # StateLayerInfo (format 1.3)
