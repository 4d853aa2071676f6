"""Read .mlxg files: read the structure once, verify it, and read it through the generated bindings.

:func:`open_graph` is the one way in: it reads the FlatBuffer part into memory (never a
mapping: see schema/file_source.py), runs the verifier (schema/verifier.py) and returns a
:class:`GraphFile` whose accessors decode the FlatBuffer into plain records
(schema/records.py) and read constants on demand.
"""

import os
from functools import cached_property
from pathlib import Path

import numpy as np

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.file_source import FileConstants, MemoryConstants, open_regular, read_structure
from mlxgraph.schema.records import (
    ConstantInfo,
    LayerCacheInfo,
    ModelInfo,
    NodeRecord,
    Operand,
    Provenance,
    StateLayerInfo,
    SymbolInfo,
    TensorInfo,
)
from mlxgraph.schema.spec import FieldKind, op_specs
from mlxgraph.schema.tokenizer_files import split_extra


def _str(raw) -> str:
    return raw.decode("utf-8", "replace") if raw is not None else ""


def decode_operand(obj) -> Operand | None:
    """A generated Operand struct as an :class:`Operand` record (None stays None)."""
    if obj is None:
        return None
    return Operand.from_code(obj.Kind(), obj.Index(), obj.Number())


def decode_op_table(spec, table) -> dict:
    """Read every field of an op table through its generated class.

    Args:
        spec: the op's OpSpec.
        table: the flatbuffers Table the Node's union field points at.
    Returns:
        {field name: value}; absent optional fields are None.
    """
    obj = getattr(fb, spec.name)()
    obj.Init(table.Bytes, table.Pos)
    out = {}
    for f in spec.table.fields:
        if f.is_vector:
            if getattr(obj, f"{f.accessor}IsNone")():
                out[f.name] = None
            elif f.kind is FieldKind.OPERAND_LIST:
                getter = getattr(obj, f.accessor)
                out[f.name] = [
                    decode_operand(getter(j)) for j in range(getattr(obj, f"{f.accessor}Length")())
                ]
            else:
                out[f.name] = [x.item() for x in getattr(obj, f"{f.accessor}AsNumpy")()]
        elif f.kind is FieldKind.OPERAND:
            out[f.name] = decode_operand(getattr(obj, f.accessor)())
        else:
            out[f.name] = getattr(obj, f.accessor)()
    return out


class GraphFile:
    """A verified graph file. Accessors decode lazily and cache; constants are read on demand."""

    def __init__(self, path, data, root, source, bounds=None):
        self.path = Path(path) if path is not None else None
        self.data = data            # the FlatBuffer part (bytes, read once)
        self.root = root            # generated Graph table
        self.source = source        # FileConstants or MemoryConstants: constant bytes
        self.bounds = bounds        # verifier's StepBounds (None when not verified)

    def close(self) -> None:
        """Release the open file (constants can no longer be read; records stay)."""
        self.source.close()

    @property
    def name(self) -> str:
        """The file's name for messages."""
        return str(self.path) if self.path is not None else "<bytes>"

    @property
    def version(self) -> tuple:
        """(major, minor) of the format that wrote the file."""
        return (self.root.VersionMajor(), self.root.VersionMinor())

    @property
    def producer(self) -> str:
        """The program that wrote the file."""
        return _str(self.root.Producer())

    @cached_property
    def tensors(self) -> list:
        """Tensor slots as TensorInfo."""
        names = [s.name for s in self.symbols]
        out = []
        for i in range(self.root.TensorsLength()):
            t = self.root.Tensors(i)
            shape = []
            for j in range(t.ShapeLength()):
                d = t.Shape(j)
                sym = d.Symbol()
                shape.append(names[sym] if sym >= 0 else (None if sym == -2 else d.Size()))
            dt = t.Dtype()
            out.append(
                TensorInfo(
                    _str(t.Name()), None if dt is None else dtype_info(dt).name, tuple(shape)
                )
            )
        return out

    @cached_property
    def values(self) -> list:
        """Value slot names."""
        return [_str(self.root.Values(i).Name()) for i in range(self.root.ValuesLength())]

    @cached_property
    def symbols(self) -> list:
        """Symbolic dims as SymbolInfo."""
        out = []
        for i in range(self.root.SymbolsLength()):
            s = self.root.Symbols(i)
            out.append(SymbolInfo(_str(s.Name()), s.Min(), s.Max(), s.Value()))
        return out

    def _io(self, n, get) -> dict:
        return {_str(get(i).Name()): get(i).Tensor() for i in range(n)}

    @cached_property
    def inputs(self) -> dict:
        """Graph inputs: name -> tensor slot."""
        return self._io(self.root.InputsLength(), self.root.Inputs)

    @cached_property
    def outputs(self) -> dict:
        """Graph outputs: name -> tensor slot."""
        return self._io(self.root.OutputsLength(), self.root.Outputs)

    @cached_property
    def constants(self) -> list:
        """Constants as ConstantInfo."""
        out = []
        for i in range(self.root.ConstantsLength()):
            c = self.root.Constants(i)
            out.append(ConstantInfo(c.Tensor(), c.Offset(), c.Length(), _str(c.Hash())))
        return out

    @cached_property
    def metadata(self) -> ModelInfo:
        """Model metadata."""
        m = self.root.Metadata()
        if m is None:
            return ModelInfo()
        layers = []
        for i in range(m.LayersLength()):
            lc = m.Layers(i)
            layers.append(
                LayerCacheInfo(
                    lc.LayerId(), lc.KvHeads(), lc.HeadDim(), lc.VHeadDim(), lc.SlidingWindow(),
                    lc.AttentionChunk(), lc.ValuesInKeys(),
                )
            )
        raw = {_str(m.Extra(i).Key()): _str(m.Extra(i).Value()) for i in range(m.ExtraLength())}
        extra, files = split_extra(raw)
        eos = tuple(int(x) for x in m.EosTokenIdsAsNumpy()) if not m.EosTokenIdsIsNone() else ()
        states = tuple(
            StateLayerInfo(s.LayerId(), tuple(int(d) for d in s.ShapeAsNumpy()),
                           dtype_info(s.Dtype()).name)
            for s in (m.States(i) for i in range(m.StatesLength())))
        return ModelInfo(
            _str(m.Architecture()), m.NumLayers(), m.VocabSize(), m.HiddenSize(), m.MaxContext(),
            eos, m.BosTokenId(), tuple(layers), _str(m.Tokenizer()), extra, files, states,
        )

    @cached_property
    def nodes(self) -> list:
        """The main chain's nodes as NodeRecords."""
        specs = op_specs()
        chain = self.root.Chains(0)
        out = []
        for i in range(chain.NodesLength()):
            node = chain.Nodes(i)
            spec = specs[node.OpType()]
            fields = decode_op_table(spec, node.Op())
            p = node.Provenance()
            prov = (
                Provenance(_str(p.Source()), _str(p.ModulePath()), _str(p.Target()))
                if p
                else Provenance()
            )
            out.append(NodeRecord(spec.name, fields, prov))
        return out

    def constant_bytes(self, index: int) -> memoryview:
        """The raw bytes of constant ``index`` (read from the file now).

        Raises:
            GraphFormatError: the file changed or was truncated since it was opened.
        """
        c = self.constants[index]
        return self.source.read(c.offset, c.length)

    def constant_array(self, index: int) -> np.ndarray:
        """Constant ``index`` as a numpy array of its own in its storage dtype (bfloat16 as uint16).

        Raises:
            GraphFormatError: the file changed or was truncated since it was opened.
        """
        c = self.constants[index]
        t = self.tensors[c.tensor]
        info = dtype_info(t.dtype)
        arr = np.empty(c.length // info.itemsize, dtype=info.numpy_storage)
        self.source.read(c.offset, c.length, into=arr)
        return arr.reshape(t.shape)


def read_file(path) -> tuple:
    """A graph file's FlatBuffer part, its size and a reader of its constants.

    Returns:
        (structure bytes, file size, FileConstants holding the open file).
    Raises:
        OSError: the file cannot be read, or is not a regular file
            (file_source.NotRegularFileError: a FIFO, device or folder is never read).
    """
    from mlxgraph.schema.verifier import peek_segment_offset

    fd, st = open_regular(path)
    try:
        data = read_structure(fd, st.st_size, peek_segment_offset)
    except EOFError as e:
        os.close(fd)
        raise OSError(0, f"the file shrank while being read ({e})", str(path)) from None
    except BaseException:
        os.close(fd)
        raise
    return data, st.st_size, FileConstants(path, fd, st)


def open_graph(source, verify: bool = True, deep: bool = False, element_limit=None) -> GraphFile:
    """Read and (by default) verify a graph file.

    Args:
        source: a path, or the file's bytes.
        verify: run the verifier (leave on unless the file was just verified).
        deep: also check every constant's content hash.
        element_limit: the most elements one tensor of a step may have (None: the file's
            default, see schema/verify_bounds.py).
    Raises:
        GraphFormatError: the file cannot be read (not a regular file, unreadable) or is
            not a valid graph file.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        path, data = None, bytes(source)
        size, constants = len(data), MemoryConstants(data)
    else:
        path = Path(source)
        try:
            data, size, constants = read_file(path)
        except OSError as e:
            raise GraphFormatError(f"cannot read: {e.strerror or e}", path) from None
    bounds = None
    try:
        if verify:
            from mlxgraph.schema.verifier import verify_report

            report = verify_report(data, path=path, deep=deep, size=size, constants=constants,
                                   element_limit=element_limit)
            bounds = report.bounds
        elif len(data) < 8:
            raise GraphFormatError("file too short to be a graph file", path)
    except BaseException:
        constants.close()
        raise
    root = fb.Graph.GetRootAs(data, 0)
    return GraphFile(path, data, root, constants, bounds)


__all__ = ["GraphFile", "decode_op_table", "decode_operand", "open_graph", "read_file"]
