"""Structural verification of a FlatBuffer against the schema model, decoding as it goes.

Python FlatBuffers has no verifier, so this walks the buffer the way the C++ Verifier
does, driven by the schema model (schema/spec.py): every uoffset, soffset, vtable, vector
and string inside the FlatBuffer part and aligned as FlatBuffers lays them out; vtable and
table sizes sane; strings NUL-terminated; every vector length checked against the bytes
left before a single element is read; union and enum codes known; required fields
present. A budget of visits proportional to the buffer size bounds the walk, so a file
whose offsets share one sub-object many times cannot make it blow up.

Each table decodes to a namedtuple of its fields in schema order (absent fields hold
their default, or None for `= null` fields), unions to (code, table), structs to
namedtuples, strings to bytes, vectors to lists or tuples (plans: schema/verify_plans.py).
The semantic checks (schema/verify_semantics.py) read those plain values and never touch
the raw bytes.
"""

import struct

from mlxgraph.schema.errors import Error
from mlxgraph.schema.verify_plans import (
    SCALAR,
    STRING,
    STRUCT,
    TABLE,
    UNION,
    VSCALAR,
    VSTRING,
    VSTRUCT,
    TablePlan,
)

MAX_DEPTH = 64
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_HH = struct.Struct("<HH").unpack_from
_U8 = struct.Struct("<B").unpack_from


class Bad(Error):
    """A structural fault. ``parts`` is the path of fields to it, innermost first."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.parts = []


class Walker:
    """One verification walk over ``data[:end]`` (the FlatBuffer part of a file).

    Args:
        data: the file's bytes (bytes, mmap or memoryview).
        end: where the FlatBuffer part ends (the constant segment's offset).
        unknown_code: callable(kind name, code) -> message for an unknown enum/union code.
    """

    def __init__(self, data, end: int, unknown_code):
        self.data, self.end, self.unknown_code = data, end, unknown_code
        # Without sharing, every object is reached through its own 4-byte uoffset.
        self.left = end // 4 + 1

    def _spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise Bad("more objects than a buffer of this size can hold (shared sub-objects?)")

    def _follow(self, p: int) -> int:
        off = _U32(self.data, p)[0]
        if off == 0 or off >= 1 << 31 or p + off >= self.end:
            raise Bad(
                f"offset {off} at byte {p} points outside the FlatBuffer part ({self.end} bytes)"
            )
        return p + off

    def _vector(self, p: int, esize: int, ealign: int) -> tuple:
        v = self._follow(p)
        if v & 3:
            raise Bad(f"vector at byte {v} is not 4-byte aligned")
        if v + 4 > self.end:
            raise Bad(f"vector at byte {v} runs past the FlatBuffer part")
        n = _U32(self.data, v)[0]
        if n * esize > self.end - v - 4:
            raise Bad(
                f"vector at byte {v} claims {n} elements, more than the {self.end - v - 4} bytes "
                "left hold"
            )
        if (v + 4) % ealign:
            raise Bad(f"vector elements at byte {v + 4} are not {ealign}-byte aligned")
        self._spend(1)
        return v + 4, n

    def string(self, p: int) -> bytes:
        """The string whose uoffset is at ``p``.

        Raises:
            Bad: the offset, length or terminating NUL lies outside the FlatBuffer part.
        """
        s = self._follow(p)
        if s & 3 or s + 4 > self.end:
            raise Bad(f"string at byte {s} is misaligned or runs past the FlatBuffer part")
        n = _U32(self.data, s)[0]
        if n >= self.end - s - 4:
            raise Bad(
                f"string at byte {s} claims {n} bytes, more than the {self.end - s - 4} bytes "
                "left hold"
            )
        if self.data[s + 4 + n] != 0:
            raise Bad(f"string at byte {s} is not NUL-terminated")
        self._spend(1)
        return bytes(self.data[s + 4:s + 4 + n])

    def _header(self, pos: int, plan: TablePlan):
        """Check a table's soffset, vtable and size; returns (table size, vtable entries)."""
        data, end = self.data, self.end
        if pos & 3 or pos + 4 > end:
            raise Bad(
                f"{plan.name} table at byte {pos} is misaligned or runs past the FlatBuffer part"
            )
        vt = pos - _I32(data, pos)[0]
        if vt < 0 or vt & 1 or vt + 4 > end:
            raise Bad(
                f"{plan.name} table at byte {pos}: vtable at {vt} is misaligned or out of bounds"
            )
        vtsize, tsize = _HH(data, vt)
        if vtsize < 4 or vtsize & 1 or vt + vtsize > end:
            raise Bad(f"{plan.name} table at byte {pos}: vtable size {vtsize} is invalid")
        if tsize < 4 or pos + tsize > end:
            raise Bad(
                f"{plan.name} table at byte {pos}: size {tsize} runs past the FlatBuffer part"
            )
        entries = vtsize >> 1
        if entries > plan.entries:
            # Entries past the schema's fields belong to a newer minor version. Absent
            # ones are harmless; a present one is a field this reader cannot honour, and
            # skipping it could run the graph wrongly (e.g. attention sinks dropped).
            extra = struct.unpack_from(f"<{entries - plan.entries}H", data, vt + 2 * plan.entries)
            for i, offset in enumerate(extra):
                if offset:
                    raise Bad(self.unknown_code(f"{plan.name} field", plan.entries - 2 + i))
            entries = plan.entries
        return tsize, plan.vt_unpack[entries](data, vt)

    def scalars(self, pos: int, plan: TablePlan) -> dict:
        """The scalar fields of the table at ``pos`` (absent ones as their default), no recursion.

        Raises:
            Bad: the table's header or one of those fields is out of bounds or misaligned.
        """
        tsize, offs = self._header(pos, plan)
        out = {}
        for f, default in zip(plan.fields, plan.defaults, strict=True):
            if f.kind != SCALAR:
                continue
            fo = offs[f.vi] if f.vi < len(offs) else 0
            out[f.name] = default
            if fo:
                if fo < 4 or fo + f.size > tsize or (pos + fo) % f.align:
                    e = Bad(
                        f"field at table offset {fo} is misaligned or outside its {tsize}-byte "
                        "table"
                    )
                    e.parts.append(f.name)
                    raise e
                out[f.name] = f.unpack(self.data, pos + fo)[0]
        return out

    def root(self) -> int:
        """The root table's position (the uoffset at byte 0), checked.

        Raises:
            Bad: the part is too short or the offset points outside it.
        """
        if self.end < 8:
            raise Bad("the FlatBuffer part is too short")
        return self._follow(0)

    def table(self, pos: int, plan: TablePlan, depth: int = 0):
        """Check and decode the table at ``pos``.

        Raises:
            Bad: any structural fault (with the field path in ``parts``).
        """
        tsize, offs = self._header(pos, plan)
        if depth > MAX_DEPTH:
            raise Bad(f"tables nested deeper than {MAX_DEPTH}")
        self._spend(1)
        k = len(offs)
        out = plan.defaults.copy()
        for i, f in enumerate(plan.fields):
            vi = f.vi
            fo = offs[vi] if vi < k else 0
            try:
                if f.kind == UNION:
                    out[i] = self._union(pos, tsize, offs, k, fo, f, depth)
                    continue
                if not fo:
                    if f.required:
                        raise Bad("required field is missing")
                    continue
                if fo < 4 or fo + f.size > tsize:
                    raise Bad(f"field at table offset {fo} lies outside its {tsize}-byte table")
                p = pos + fo
                if p % f.align:
                    raise Bad(f"field at byte {p} is not {f.align}-byte aligned")
                out[i] = self._value(p, f, depth)
            except Bad as e:
                e.parts.append(f.name)
                raise
        return plan.record._make(out)

    def _union(self, pos, tsize, offs, k, fo, f, depth):
        to = offs[f.vi - 1] if f.vi - 1 < k else 0
        code = 0
        if to:
            if to < 4 or to + 1 > tsize:
                raise Bad(f"union type at table offset {to} lies outside its {tsize}-byte table")
            code = _U8(self.data, pos + to)[0]
        if code == 0 or not fo:
            if f.required:
                raise Bad(
                    "required field is missing" if code == 0 else "union type set but value missing"
                )
            return None
        members, what = f.sub
        sub = members.get(code)
        if sub is None:
            raise Bad(self.unknown_code(what, code))
        if fo < 4 or fo + 4 > tsize or (pos + fo) & 3:
            raise Bad(f"union value at table offset {fo} is misaligned or outside its table")
        try:
            return code, self.table(self._follow(pos + fo), sub, depth + 1)
        except Bad as e:
            e.parts.append(sub.name)
            raise

    def _value(self, p, f, depth):
        kind = f.kind
        if kind == SCALAR:
            v = f.unpack(self.data, p)[0]
            if f.enum is not None and v not in f.enum[1]:
                raise Bad(self.unknown_code(f.enum[0], v))
            return v
        if kind == STRING:
            return self.string(p)
        if kind == TABLE:
            return self.table(self._follow(p), f.sub, depth + 1)
        if kind == STRUCT:
            return self._struct(f.sub, f.sub.struct.unpack_from(self.data, p))
        if kind == VSCALAR:
            fmt, size = f.sub
            start, n = self._vector(p, size, size)
            vals = struct.unpack_from(f"<{n}{fmt}", self.data, start)
            if f.enum is not None and not f.enum[1].issuperset(vals):
                raise Bad(self.unknown_code(f.enum[0], next(v for v in vals if v not in f.enum[1])))
            return vals
        if kind == VSTRUCT:
            sp = f.sub
            start, n = self._vector(p, sp.size, sp.align)
            unpack, size = sp.struct.unpack_from, sp.size
            return [self._struct(sp, unpack(self.data, start + size * j)) for j in range(n)]
        start, n = self._vector(p, 4, 4)
        if n > self.left:
            raise Bad("more objects than a buffer of this size can hold (shared sub-objects?)")
        out = []
        for j in range(n):
            try:
                if kind == VSTRING:
                    out.append(self.string(start + 4 * j))
                else:
                    out.append(self.table(self._follow(start + 4 * j), f.sub, depth + 1))
            except Bad as e:
                e.parts.append(f"[{j}]")
                raise
        return out

    def _struct(self, sp, vals):
        for i, name, (what, known) in sp.enums:
            if vals[i] not in known:
                e = Bad(self.unknown_code(what, vals[i]))
                e.parts.append(name)
                raise e
        return sp.record._make(vals)
