"""Fuzz the verifier: mutated graph files are either valid or rejected with GraphFormatError.

A seeded loop mutates small real graph files (bit flips, byte overwrites, truncations,
insertions, deletions, huge counts in vector length fields, wild offsets and scalar
values) and checks for each: only GraphFormatError escapes, no case takes a second,
memory stays within a small multiple of the file size, and a file that verifies reads
completely through the reader (the verifier must make the reader safe).

MLXGRAPH_FUZZ_CASES sets the count of the slow variant (default 100,000).
"""

import os
import random
import struct
import time
import tracemalloc

import flatbuffers
import numpy as np
import pytest
from make_golden import build_sample

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.records import Operand
from mlxgraph.schema.spec import SCALAR_SIZES, load_schema
from mlxgraph.schema.verifier import verify_buffer
from mlxgraph.schema.writer import GraphWriter

HUGE = (0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x40000000, 0x10000000, 0x00FFFFFF, 65536)
# Peak Python allocation allowed while verifying, as a multiple of the file size (plus slack
# for the fixed cost of a walk): the decoded records are a few Python objects per table.
MEMORY_FACTOR, MEMORY_SLACK = 16, 64 * 1024
TRACE_EVERY = int(os.environ.get("MLXGRAPH_FUZZ_TRACE_EVERY", "4"))


def _small(tmp_path) -> bytes:
    w = GraphWriter()
    t = w.add_symbol("T", 1, 8)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    w.add_input("tokens", tok)
    emb = w.add_constant("embed", np.arange(12, dtype=np.float32).reshape(4, 3))
    x = w.add_tensor("x", "float32", (1, "T", 3))
    w.add_node("Embedding", weight=emb, indices=tok, out=x)
    y = w.add_tensor("y", "float32", (1, None, 3))
    w.add_node(
        "Reshape", x=x, out=y, shape=[Operand.literal(1), Operand.value(t), Operand.literal(3)]
    )
    w.add_output("y", y)
    w.metadata.eos_token_ids = (1,)
    w.metadata.vocab_size = 4
    w.write(tmp_path / "small.mlxg")
    return (tmp_path / "small.mlxg").read_bytes()


def field_positions(data: bytes) -> dict:
    """Where a file keeps its vector lengths, uoffsets and scalar fields.

    An independent walk with flatbuffers' plain Table and the schema model (no verifier
    code), over a valid file. Returns {'vector': [...], 'offset': [...], 'scalar': [(pos, size)]}.
    """
    schema = load_schema()
    out = {"vector": [], "offset": [], "scalar": []}
    seen = set()

    def table(pos, type_name):
        if (pos, type_name) in seen:
            return
        seen.add((pos, type_name))
        tab = flatbuffers.table.Table(data, pos)
        fields = schema.types[type_name].fields
        for f in fields:
            o = tab.Offset(4 + 2 * f.slot)
            if not o:
                continue
            at = pos + o
            ftype = schema.types.get(f.type)
            if ftype is not None and ftype.kind == "union":
                t = tab.Offset(4 + 2 * (f.slot - 1))
                code = data[pos + t]
                out["scalar"].append((pos + t, 1))
                out["offset"].append(at)
                name = next(n for n, c in ftype.values.items() if c == code)
                table(tab.Indirect(at), name)
            elif f.is_vector:
                out["offset"].append(at)
                start = tab.Vector(o)
                out["vector"].append(start - 4)
                if ftype is not None and ftype.kind == "table" or f.type == "string":
                    for j in range(tab.VectorLen(o)):
                        el = start + 4 * j
                        out["offset"].append(el)
                        if f.type != "string":
                            table(tab.Indirect(el), f.type)
            elif f.type == "string" or (ftype is not None and ftype.kind == "table"):
                out["offset"].append(at)
                if f.type != "string":
                    table(tab.Indirect(at), f.type)
            elif ftype is None or ftype.kind == "enum":
                size = SCALAR_SIZES[ftype.underlying if ftype else f.type]
                out["scalar"].append((at, size))

    table(struct.unpack_from("<I", data, 0)[0], schema.root_type)
    return out


def fix_segment_length(b: bytearray) -> None:
    """Make the root's segment_length agree with the (changed) file size, when it can be found.

    Without this, nearly every insertion, deletion or truncation fails the first size check
    and the structural walk behind it is never exercised.
    """
    fields = {f.name: f.slot for f in load_schema().types["Graph"].fields}
    try:
        tab = flatbuffers.table.Table(bytes(b), struct.unpack_from("<I", b, 0)[0])
        seg_at = tab.Pos + tab.Offset(4 + 2 * fields["segment_offset"])
        len_at = tab.Pos + tab.Offset(4 + 2 * fields["segment_length"])
        seg = struct.unpack_from("<Q", b, seg_at)[0]
        if 0 < seg <= len(b) and len_at + 8 <= len(b):
            struct.pack_into("<Q", b, len_at, len(b) - seg)
    except (struct.error, IndexError, TypeError):  # the mutation broke the root: leave it
        pass


def mutate(rng: random.Random, data: bytes, where: dict) -> bytes:
    """One to three random mutations of ``data``."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.randrange(9)
        n = len(b)
        if n == 0:
            break
        if kind == 0:                                     # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(n * 8)
                b[i // 8] ^= 1 << (i % 8)
        elif kind == 1:                                   # byte overwrites
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(n)] = rng.choice((0, 0xFF, 0x7F, 0x80, 1, rng.randrange(256)))
        elif kind == 2:                                   # truncation
            b = b[:rng.randrange(n)]
        elif kind == 3:                                   # insertion
            i = rng.randrange(n + 1)
            b[i:i] = bytes(
                rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 8, rng.randint(1, 64))))
            )
        elif kind == 4:                                   # deletion
            i = rng.randrange(n)
            del b[i:i + rng.choice((1, 2, 4, 8, rng.randint(1, 64)))]
        elif kind == 5 and where["vector"]:               # huge count in a vector length
            pos = rng.choice(where["vector"])
            if pos + 4 <= n:
                old = struct.unpack_from("<I", b, pos)[0]
                struct.pack_into(
                    "<I", b, pos, rng.choice((*HUGE, old + 1, old * 1000, n // 4)) % 2**32
                )
        elif kind == 6 and where["offset"]:               # wild uoffset
            pos = rng.choice(where["offset"])
            if pos + 4 <= n:
                old = struct.unpack_from("<I", b, pos)[0]
                new = rng.choice((0, 4, old + 4, old - 4, old + 1, n, rng.randrange(2**32), *HUGE))
                struct.pack_into("<I", b, pos, new % 2**32)
        elif kind == 7 and where["scalar"]:  # out-of-range scalar (slot, dtype, length)
            pos, size = rng.choice(where["scalar"])
            if pos + size <= n:
                value = rng.choice(
                    (
                        -1,
                        -2,
                        0,
                        1,
                        7,
                        99,
                        127,
                        2 ** (8 * size - 1) - 1,
                        rng.randrange(2 ** (8 * size)),
                    )
                )
                b[pos:pos + size] = (value % 2**(8 * size)).to_bytes(size, "little")
        else:                                             # duplicate a chunk elsewhere
            i, j = rng.randrange(n), rng.randrange(n)
            chunk = b[i:i + rng.randint(1, 16)]
            b[j:j + len(chunk)] = chunk
    if len(b) != len(data) and rng.random() < 0.5:
        fix_segment_length(b)
    return bytes(b)


def read_everything(data: bytes) -> None:
    """Decode every part of a verified file the way the interpreter and tools will."""
    g = open_graph(data, verify=False)
    g.version, g.producer, g.symbols, g.tensors, g.values, g.inputs, g.outputs, g.metadata  # noqa: B018
    for node in g.nodes:
        for v in node.fields.values():
            if isinstance(v, Operand) and v.is_literal:
                v.python_value()
    for i in range(len(g.constants)):
        g.constant_array(i).tobytes()
        g.constant_bytes(i).release()


def run_fuzz(tmp_path, cases: int, seed: int = 20240601) -> dict:
    """The fuzz loop; returns counts and timings. Fails on the first bad outcome."""
    bases = [_small(tmp_path)]
    build_sample().write(tmp_path / "sample.mlxg")
    bases.append((tmp_path / "sample.mlxg").read_bytes())
    where = [field_positions(b) for b in bases]
    for b in bases:               # the bases are valid; this also builds the cached plans
        verify_buffer(b)
        read_everything(b)
    rng = random.Random(seed)
    stats = {"cases": cases, "valid": 0, "rejected": 0, "max_seconds": 0.0,
             "max_peak_bytes": 0, "max_memory_ratio": 0.0}
    start = time.perf_counter()
    for case in range(cases):
        k = rng.randrange(len(bases))
        data = mutate(rng, bases[k], where[k])
        traced = case % TRACE_EVERY == 0   # tracemalloc slows the walk: sample it
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        try:
            verify_buffer(data)
            valid = True
        except GraphFormatError as e:
            valid = False
            assert "unchecked fault" not in e.reason, f"case {case}: {e}"
        elapsed = time.perf_counter() - t0
        if traced:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            stats["max_peak_bytes"] = max(stats["max_peak_bytes"], peak)
            if len(data) >= 1024:
                stats["max_memory_ratio"] = max(
                    stats["max_memory_ratio"], round(peak / len(data), 2)
                )
            assert peak <= MEMORY_FACTOR * len(data) + MEMORY_SLACK, (
                f"case {case}: {peak} bytes for {len(data)}"
            )
        # Bounded work, not a speed figure (the slowest case takes tens of ms when idle; the
        # bound only has to catch a runaway walk, on a loaded machine too).
        assert elapsed < 5.0, f"case {case} took {elapsed:.2f} s"
        stats["max_seconds"] = max(stats["max_seconds"], elapsed)
        if valid:
            stats["valid"] += 1
            read_everything(data)   # whatever the verifier accepts, the reader must read
        else:
            stats["rejected"] += 1
    stats["seconds"] = round(time.perf_counter() - start, 1)
    return stats


def test_fuzz_10k(tmp_path):
    stats = run_fuzz(tmp_path, 10_000)
    print(stats)
    assert stats["rejected"] > 5_000 and stats["valid"] > 100


@pytest.mark.slow
def test_fuzz_large(tmp_path):
    stats = run_fuzz(tmp_path, int(os.environ.get("MLXGRAPH_FUZZ_CASES", "100000")), seed=7)
    print(stats)
