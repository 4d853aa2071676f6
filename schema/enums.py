"""The format's enums (codes from the generated bindings), for the layers above the schema.

Only the schema package reads ``generated/``; the exporter, interpreter and tools take
enum codes from here instead of re-typing them as literals.
"""

from mlxgraph.generated.mlxgraph_generated import DType, OperandKind, RoundingMode, SymOp

__all__ = ["DType", "OperandKind", "RoundingMode", "SymOp"]
