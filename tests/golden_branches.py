"""The golden sample's format 1.3 branch (tests/make_golden.py's build_sample).

It starts from the step's tokens and positions, so it adds nodes, layers, states and
outputs without touching the sample's 1.0-1.2 part, and writes every field 1.3 added with
a value other than its default: the four recurrent-state ops, each with its StateLayer; a
latent-attention layer (LayerCache.values_in_keys, its v the k slot); ALiBi slopes on an
UpdateAndAttend; Expm1, Log1p and Erfinv.
"""

import numpy as np

from mlxgraph.schema.records import LayerCacheInfo, Operand, Provenance, StateLayerInfo

# The branch's layer ids: the sample's attention layers are 0 and 1.
CONV, SSD, DELTA, SCAN, LATENT, ALIBI = 2, 3, 4, 5, 6, 7


def format_1_3_branch(w, rng, tok, pos, t_val, vocab) -> tuple:
    """Add the branch to the GraphWriter ``w``; returns (layers, states) for the metadata.

    Args:
        rng: the sample's numpy Generator (drawn after the earlier branches').
        tok: the tokens' slot [1, T]; pos: the positions' slot as UpdateAndAttend reads it.
        t_val: the value slot of the symbol T.
    """
    def tensor(name, dims, dtype="float32"):
        return w.add_tensor(name, dtype, (1, "T", *dims))

    def rows(name, width, low=-1.0, high=1.0):
        """[1, T, width] rows of a table of uniform values in [low, high)."""
        table = w.add_constant(f"{name}.table",
                               rng.uniform(low, high, (vocab, width)).astype(np.float32))
        out = tensor(name, (width,))
        w.add_node("Embedding", Provenance(name, f"model.{name}"), weight=table, indices=tok,
                   out=out)
        return out

    def split(x, name, dims):
        """[1, T, prod(dims)] -> [1, T, *dims]."""
        out = tensor(name, dims)
        w.add_node("Reshape", x=x, out=out, shape=[Operand.literal(1), Operand.value(t_val),
                                                   *(Operand.literal(d) for d in dims)])
        return out

    def const(name, array):
        return w.add_constant(name, np.asarray(array, np.float32))

    outputs = {}
    # CausalConv: x [1, C, T], weight [C, K], state [1, C, K - 1].
    xc = w.add_tensor("conv_x", "float32", (1, 4, "T"))
    w.add_node("Permute", x=rows("conv_in", 4), out=xc, perm=[0, 2, 1])
    yc = w.add_tensor("conv_y", "float32", (1, 4, "T"))
    w.add_node("CausalConv", Provenance("conv", "model.layers.2.conv"), x=xc,
               weight=const("conv.weight", rng.standard_normal((4, 3))),
               bias=const("conv.bias", rng.standard_normal(4)), out=yc, layer_id=CONV)
    outputs["conv"] = yc
    # SsdScan: H 2 heads of P 2, G 1 group of N 2; state [1, H, P, N].
    out = tensor("ssd_out", (2, 2))
    w.add_node("SsdScan", Provenance("ssd", "model.layers.3.mixer"),
               x=split(rows("ssd_x", 4), "ssd_x4", (2, 2)), dt=rows("ssd_dt", 2),
               a=const("ssd.a", [-1.0, -0.5]), b=split(rows("ssd_b", 2), "ssd_b4", (1, 2)),
               c=split(rows("ssd_c", 2), "ssd_c4", (1, 2)), d=const("ssd.d", [0.5, -0.25]),
               dt_bias=const("ssd.dt_bias", [0.1, -0.2]), out=out, layer_id=SSD)
    outputs["ssd"] = out
    # GatedDelta: Hk 1 head of Dk 2, Hv 2 heads of Dv 2; g <= 0, beta in (0, 1).
    out = tensor("delta_out", (2, 2))
    w.add_node("GatedDelta", Provenance("delta", "model.layers.4.linear_attn"),
               q=split(rows("delta_q", 2), "delta_q4", (1, 2)),
               k=split(rows("delta_k", 2), "delta_k4", (1, 2)),
               v=split(rows("delta_v", 4), "delta_v4", (2, 2)),
               g=rows("delta_g", 2, -1.0, 0.0), beta=rows("delta_beta", 2, 0.1, 0.9),
               out=out, layer_id=DELTA, scale=0.7, qk_l2norm=True)
    outputs["delta"] = out
    # SelectiveScan: D 2 channels, N 3; state [1, D, N].
    out = tensor("scan_out", (2,))
    w.add_node("SelectiveScan", Provenance("scan", "model.layers.5.mixer"),
               x=rows("scan_x", 2), dt=rows("scan_dt", 2),
               a=const("scan.a", -rng.uniform(0.5, 1.5, (2, 3))), b=rows("scan_b", 3),
               c=rows("scan_c", 3), d=const("scan.d", [1.0, -0.5]),
               dt_bias=const("scan.dt_bias", [0.2, 0.1]), out=out, layer_id=SCAN)
    outputs["scan"] = out
    # Latent attention: one kv head of 4 whose values are its first 3 columns (v is k's slot).
    q = w.add_tensor("latent_q", "float32", (1, 2, "T", 4))
    w.add_node("Permute", x=split(rows("latent_q_rows", 8), "latent_q4", (2, 4)), out=q,
               perm=[0, 2, 1, 3])
    k = w.add_tensor("latent_k", "float32", (1, 1, "T", 4))
    w.add_node("Permute", x=split(rows("latent_k_rows", 4), "latent_k4", (1, 4)), out=k,
               perm=[0, 2, 1, 3])
    latent = w.add_tensor("latent", "float32", (1, 2, "T", 3))
    w.add_node("UpdateAndAttend", Provenance("latent", "model.layers.6.self_attn"), q=q, k=k,
               v=k, position=pos, out=latent, layer_id=LATENT, scale=0.5)
    outputs["latent"] = latent
    # ALiBi: the same queries and keys, one slope per query head.
    alibi = w.add_tensor("alibi", "float32", (1, 2, "T", 4))
    w.add_node("UpdateAndAttend", Provenance("alibi", "model.layers.7.self_attention"), q=q,
               k=k, v=k, position=pos, out=alibi, layer_id=ALIBI, scale=0.5,
               alibi_slopes=[0.5, 0.25])
    outputs["alibi"] = alibi
    # The 1.3 elementwise ops, on tanh of the ALiBi output (inside (-1, 1): erfinv's domain).
    squashed = w.add_tensor("alibi_tanh", "float32", (1, 2, "T", 4))
    w.add_node("Tanh", x=alibi, out=squashed)
    for op in ("Expm1", "Log1p", "Erfinv"):
        out = w.add_tensor(op.lower(), "float32", (1, 2, "T", 4))
        w.add_node(op, x=squashed, out=out)
        outputs[op.lower()] = out
    for name, slot in outputs.items():
        w.add_output(name, slot)
    layers = (LayerCacheInfo(LATENT, 1, 4, 3, values_in_keys=True),
              LayerCacheInfo(ALIBI, 1, 4, 4))
    states = (StateLayerInfo(CONV, (1, 4, 2), "float32"),
              StateLayerInfo(SSD, (1, 2, 2, 2), "float32"),
              StateLayerInfo(DELTA, (1, 2, 2, 2), "float32"),
              StateLayerInfo(SCAN, (1, 2, 3), "float32"))
    return layers, states
