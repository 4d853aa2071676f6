"""Shared by the lowering tests: export a small module, lower it, compare with torch."""

import mlx.core as mx
import numpy as np
import torch

import mlxgraph
from mlxgraph.exporter.lowering_pass import lower_program
from mlxgraph.exporter.pipeline import decompose
from mlxgraph.schema.writer import GraphWriter

V, D = 32, 8


def export_module(module, max_t=16):
    """torch.export a (tokens, positions) module with a dynamic length, decomposed."""
    seq = torch.export.Dim("T", min=1, max=max_t)
    args = (torch.zeros(1, 3, dtype=torch.int32), torch.arange(3, dtype=torch.int32))
    ep = torch.export.export(
        module, args, dynamic_shapes={"tokens": {1: seq}, "positions": {0: seq}}
    )
    return decompose(ep)


def lower_module(module, path, max_t=16):
    """Lower ``module`` into a graph file at ``path``; returns the GraphWriter."""
    writer = GraphWriter()
    lower_program(export_module(module, max_t), writer, strip_prefix="")
    writer.metadata.vocab_size = V  # the test modules embed V-row tables (verify checks it)
    writer.write(path)
    return writer


def check_runs_like_torch(module, path, lengths=(1, 2, 5, 16), tol=1e-5):
    """Lower ``module``, run the graph at each length and compare with torch eager."""
    lower_module(module, path)
    program = mlxgraph.load(path)
    gen = torch.Generator().manual_seed(0)
    for t in lengths:
        tokens = torch.randint(0, V, (1, t), generator=gen, dtype=torch.int32)
        positions = torch.arange(t, dtype=torch.int32)
        with torch.no_grad():
            want = module(tokens, positions).float().numpy()
        got = np.array(
            program.session().step(mx.array(tokens.numpy()), list(range(t))).astype(mx.float32)
        )
        assert got.shape == want.shape, f"T={t}"
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"T={t}")
