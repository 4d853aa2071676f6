"""ATen ops lowered onto several existing nodes (exporter/lowerings/composite.py) and
torch.gather (issue 31): each runs in the interpreter like torch, for several lengths from
one export, and the decomposed program really holds the op under test."""

import torch
from lowering_helpers import D, V, check_runs_like_torch, export_module
from torch import nn

aten = torch.ops.aten


class Composite(nn.Module):
    """floor, clamp with tensor bounds, copy, repeat, var, vector norms, slice_scatter,
    scatter of a value and gather, on [1, T, D] features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, D)
        self.lo = nn.Parameter(torch.randn(D) * 0.3 - 0.5)
        self.hi = nn.Parameter(torch.randn(D) * 0.3 + 0.5)

    def forward(self, tokens, positions):
        x = self.emb(tokens)                                           # [1, T, D]
        t = x.shape[1]
        p = positions.float()[None, :, None] * 0.7                     # [1, T, 1]
        written = x.clone()
        written[..., 2:5] = x[..., :3] * 2                             # slice_scatter
        head = x.clone()
        head[..., :2] = 0.5                                            # slice_scatter at 0
        copied = torch.zeros_like(x)
        copied.copy_(x.double())                                       # copy (with a cast)
        vals, idx = torch.topk(x, 3, dim=-1)
        mask = torch.zeros_like(x).scatter(-1, idx, 1.0)               # scatter.value
        picked = x.gather(-1, torch.topk(-x, 3, dim=-1)[1])            # gather
        rows = x.view(t, D)
        feats = [
            torch.floor(x * 3) + torch.floor(p).expand(-1, -1, D),
            torch.clamp(x, min=self.lo, max=self.hi),
            torch.clamp(x, min=self.lo),
            written, head, copied, mask, picked, vals,
            x.repeat(1, 1, 2)[..., ::2] + x.repeat(2, 1, 1)[1:],
            rows.repeat(1, 1, 1).view(1, t, D),                        # leading axis added
            torch.var(x, dim=-1, keepdim=True).expand(-1, -1, D),
            torch.std(x, dim=-1, keepdim=True, unbiased=False).expand(-1, -1, D),
            torch.var(x, dim=-1, correction=0).unsqueeze(-1).expand(-1, -1, D),
            *(torch.norm(x, p=p, dim=-1, keepdim=True).expand(-1, -1, D)   # vector norms
              for p in (1.0, 2.0, 3.0, float("inf"))),
        ]
        return torch.cat(feats, dim=-1)


def test_composite_ops_run_like_torch(tmp_path):
    targets = {n.target for n in export_module(Composite().eval()).graph.nodes}
    for op in (aten.floor.default, aten.clamp.Tensor, aten.copy.default, aten.repeat.default,
               aten.var.correction, aten.slice_scatter.default, aten.scatter.value,
               aten.gather.default, aten.linalg_vector_norm.default):
        assert op in targets, op
    check_runs_like_torch(Composite().eval(), tmp_path / "c.mlxg", tol=2e-6)
