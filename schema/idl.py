"""The subset of the FlatBuffers IDL mlxgraph.fbs uses: tokens, tables, structs, enums,
unions, and their layout (vtable slots, struct offsets).

This is the raw declaration; schema/spec.py adds the field model (what each field of an
op means to the program, the verifier, the reader, the writer and the tools).
"""

import re
from dataclasses import dataclass, field

SCALAR_SIZES = {
    "bool": 1, "byte": 1, "ubyte": 1, "int8": 1, "uint8": 1,
    "short": 2, "ushort": 2, "int16": 2, "uint16": 2,
    "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4, "float32": 4,
    "long": 8, "ulong": 8, "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}


@dataclass
class FieldSpec:
    """One field of a table or struct, as the .fbs declares it.

    ``kind`` and ``required`` are derived once, by schema/spec.py, from the attributes,
    type and default: read them, never re-derive them.
    """

    name: str
    type: str            # element type for vectors
    is_vector: bool
    default: str | None  # None when not written; "null" for optional scalars
    attributes: dict
    slot: int = 0        # vtable slot (tables) or byte offset (structs)
    kind: object = None  # spec.FieldKind
    required: bool = False

    @property
    def accessor(self) -> str:
        """The generated bindings' accessor name (snake_case -> UpperCamel)."""
        return upper_camel(self.name)


def upper_camel(name: str) -> str:
    """A schema field name as flatc's Python bindings spell it: 'v_head_dim' -> 'VHeadDim'."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


@dataclass
class TypeSpec:
    """A table, struct, enum or union."""

    kind: str              # 'table' | 'struct' | 'enum' | 'union'
    name: str
    fields: list = field(default_factory=list)   # FieldSpec (table, struct)
    values: dict = field(default_factory=dict)   # name -> int (enum, union)
    underlying: str = ""   # enum's scalar type
    size: int = 0          # struct byte size
    align: int = 1         # struct alignment


@dataclass
class Schema:
    """Everything the .fbs declares."""

    types: dict
    root_type: str
    file_identifier: str
    attributes: set

    def scalar_size(self, type_name: str) -> int | None:
        """Byte size of a scalar or enum type, or None when it is not a scalar."""
        if type_name in SCALAR_SIZES:
            return SCALAR_SIZES[type_name]
        spec = self.types.get(type_name)
        if spec is not None and spec.kind == "enum":
            return SCALAR_SIZES[spec.underlying]
        return None


_TOKEN = re.compile(
    r'\s*(?:(//[^\n]*)|(/\*.*?\*/)|("[^"]*")|([A-Za-z_][\w.]*)|(-?[\d.]+(?:e-?\d+)?)|(\S))', re.S
)


def _tokenize(text: str) -> list:
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        if m.group(1) or m.group(2):
            continue
        tokens.append(next(g for g in m.groups()[2:] if g is not None))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected=None):
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ValueError(
                f"schema parse error near token {self.i}: expected {expected!r}, got {tok!r}"
            )
        self.i += 1
        return tok

    def parse(self) -> Schema:
        types, root, ident, attrs = {}, "", "", set()
        while self.peek() is not None:
            word = self.take()
            if word in ("namespace", "file_extension", "include"):
                while self.take() != ";":
                    pass
            elif word == "attribute":
                attrs.add(self.take().strip('"'))
                self.take(";")
            elif word == "file_identifier":
                ident = self.take().strip('"')
                self.take(";")
            elif word == "root_type":
                root = self.take()
                self.take(";")
            elif word in ("table", "struct"):
                spec = self._fields(word, self.take())
                types[spec.name] = spec
            elif word in ("enum", "union"):
                spec = self._enum(word)
                types[spec.name] = spec
            else:
                raise ValueError(f"schema parse error: unexpected {word!r}")
        schema = Schema(types, root, ident, attrs)
        _layout(schema)
        return schema

    def _fields(self, kind, name) -> TypeSpec:
        spec = TypeSpec(kind, name)
        self.take("{")
        while self.peek() != "}":
            fname = self.take()
            self.take(":")
            is_vector = self.peek() == "["
            if is_vector:
                self.take("[")
            ftype = self.take()
            if is_vector:
                self.take("]")
            default = None
            if self.peek() == "=":
                self.take("=")
                default = self.take()
            attributes = {}
            if self.peek() == "(":
                self.take("(")
                while self.peek() != ")":
                    key = self.take()
                    value = True
                    if self.peek() == ":":
                        self.take(":")
                        value = self.take().strip('"')
                    attributes[key] = value
                    if self.peek() == ",":
                        self.take(",")
                self.take(")")
            self.take(";")
            spec.fields.append(FieldSpec(fname, ftype, is_vector, default, attributes))
        self.take("}")
        return spec

    def _enum(self, kind) -> TypeSpec:
        name = self.take()
        spec = TypeSpec(kind, name)
        if self.peek() == ":":
            self.take(":")
            spec.underlying = self.take()
        self.take("{")
        # Union member codes start at 1 (0 is NONE); enum values at 0 unless given.
        nxt = 1 if kind == "union" else 0
        while self.peek() != "}":
            member = self.take()
            if self.peek() == "=":
                self.take("=")
                nxt = int(self.take())
            spec.values[member] = nxt
            nxt += 1
            if self.peek() == ",":
                self.take(",")
        self.take("}")
        return spec


def _layout(schema: Schema) -> None:
    """Assign vtable slots to table fields and byte offsets to struct fields."""
    for spec in schema.types.values():
        if spec.kind == "table":
            slot = 0
            for f in spec.fields:
                if schema.types.get(f.type) is not None and schema.types[f.type].kind == "union":
                    slot += 1  # a union field is preceded by its hidden _type field
                f.slot = slot
                slot += 1
        elif spec.kind == "struct":
            offset, align = 0, 1
            for f in spec.fields:
                size = schema.scalar_size(f.type)
                if size is None:
                    raise ValueError(f"struct {spec.name}: only scalar fields are supported")
                offset = (offset + size - 1) // size * size
                f.slot = offset
                offset += size
                align = max(align, size)
            spec.size = (offset + align - 1) // align * align
            spec.align = align


def parse_idl(text: str) -> Schema:
    """Parse schema text (the subset of the FlatBuffers IDL mlxgraph.fbs uses), without
    the field model (see spec.parse_schema).

    Raises:
        ValueError: the text uses IDL this parser does not cover.
    """
    return _Parser(text).parse()
