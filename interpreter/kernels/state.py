"""Kernels of ops with off-graph recurrent state (format 1.3): the session's state store
(interpreter/cache/recurrent_state.py) gives each layer's committed state (``read``) and
takes the one the step leaves (``write``). In a batched step (``ctx.rows``) each row's
tokens go to its own session's store, with exactly the calls a step of that session alone
would make."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import register

SSD_CHUNK = 64  # tokens per block of the chunked (SSD) prefill


def _rows(ctx, layer_id, total, axis, name, one):
    """Run ``one(store, row slice)`` per row (or for the whole step), joined on ``axis``."""
    if ctx.rows is None:
        return one(ctx.store(layer_id), slice(None))
    if total != sum(n for _, _, n in ctx.rows):
        raise ValueError(f"{name}: a batched step of {sum(n for _, _, n in ctx.rows)} tokens, "
                         f"got {total} (tokens on axis {axis})")
    outs = [one(stores[layer_id], slice(start, start + n)) for stores, start, n in ctx.rows]
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=axis)


@register("CausalConv", needs_context=True)
def causal_conv(x, weight, bias, layer_id, ctx):
    """Convolve x [1, C, T] over its tokens after the layer's last K - 1 inputs."""
    def one(store, rows):
        xr = x[:, :, rows]
        s = mx.concatenate([store.read(x.dtype), xr], axis=2)
        store.write(s[:, :, s.shape[2] - weight.shape[1] + 1:])
        return _conv(s, xr.shape[2], weight, bias).astype(x.dtype)
    return _rows(ctx, layer_id, x.shape[2], 2, "CausalConv", one)


def _conv(s, t, weight, bias):
    """out[:, c, t] = bias[c] + sum_k weight[c, k] * s[:, c, t + k], in float32."""
    s, w = s.astype(mx.float32), weight.astype(mx.float32)[:, :, None]   # w: [C, K, 1]
    out = s[:, :, 0:t] * w[:, 0]
    for j in range(1, weight.shape[1]):
        out = out + s[:, :, j:j + t] * w[:, j]
    if bias is not None:
        out = out + bias.astype(mx.float32)[:, None]
    return out


@register("SsdScan", needs_context=True)
def ssd_scan(x, dt, a, b, c, d, dt_bias, layer_id, ctx):
    """Mamba-2's selective scan over x [1, T, H, P] from the layer's state S [1, H, P, N]:
    chunks of SSD_CHUNK tokens in the chunked (SSD) form, S carried between them."""
    f32 = mx.float32
    heads, groups = x.shape[2], b.shape[2]

    def one(store, rows):
        xr, br, cr = (v[:, rows].astype(f32) for v in (x, b, c))
        step = dt[:, rows].astype(f32) + dt_bias.astype(f32)
        step = mx.logaddexp(step, mx.zeros_like(step))                  # softplus [1, T, H]
        if groups != heads:  # head h reads group h // (H / G)
            br, cr = (mx.repeat(v, heads // groups, axis=2) for v in (br, cr))
        state, outs = store.read(f32), []
        for lo in range(0, xr.shape[1], SSD_CHUNK):
            part = slice(lo, lo + SSD_CHUNK)
            y, state = _ssd_chunk(xr[0, part], step[0, part], a.astype(f32), br[0, part],
                                  cr[0, part], state[0])
            outs.append(y)
            state = state[None]
        store.write(state)
        y = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)
        return (y + d.astype(f32)[:, None] * xr[0])[None]
    return _rows(ctx, layer_id, x.shape[1], 1, "SsdScan", one)


def _ssd_chunk(x, step, a, b, c, s0):
    """One chunk of L tokens: x [L, H, P], step [L, H], a [H], b, c [L, H, N], s0 [H, P, N].
    Returns (y [L, H, P] without the D term, the state after the chunk [H, P, N])."""
    n = x.shape[0]
    da = step * a                                                        # [L, H], <= 0
    # seg[h, l, s] = sum of da over (s, l]: a cumulative sum of a masked copy, as transformers
    # computes it (a difference of two long cumulative sums would lose precision).
    tri = mx.tril(mx.ones((n, n), dtype=mx.bool_), k=-1)                 # [l, s]: s < l
    seg = mx.cumsum(mx.where(tri[None], da.T[:, :, None], 0.0), axis=1)  # [H, l, s]
    causal = mx.tril(mx.ones((n, n), dtype=mx.bool_))
    decay = mx.where(causal[None], mx.exp(seg), 0.0)                     # [H, l, s]
    bh, ch = b.transpose(1, 0, 2), c.transpose(1, 0, 2)                  # [H, L, N]
    xdt = (x * step[:, :, None]).transpose(1, 0, 2)                      # [H, L, P]
    scores = (ch @ bh.transpose(0, 2, 1)) * decay                        # [H, l, s]
    start = mx.exp(mx.cumsum(da, axis=0)).T[:, :, None]                  # [H, L, 1]: S0's decay
    y = scores @ xdt + start * (ch @ s0.transpose(0, 2, 1))              # [H, L, P]
    last = decay[:, n - 1, :, None]                                      # [H, L, 1]
    s1 = start[:, n - 1, :, None] * s0 + (xdt * last).transpose(0, 2, 1) @ bh
    return y.transpose(1, 0, 2), s1


DELTA_CHUNK = 64  # tokens per block of the gated delta rule's chunked prefill


@register("GatedDelta", needs_context=True)
def gated_delta(q, k, v, g, beta, layer_id, scale, qk_l2norm, ctx):
    """The gated delta rule over q, k [1, T, Hk, Dk], v [1, T, Hv, Dv] from the layer's state
    S [1, Hv, Dk, Dv]: blocks of DELTA_CHUNK tokens in the chunked (UT transform) form."""
    f32, heads = mx.float32, v.shape[2]

    def one(store, rows):
        qr, kr = (x[0, rows].astype(f32) for x in (q, k))
        if qk_l2norm:
            qr, kr = (x * mx.rsqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (qr, kr))
        if heads != qr.shape[1]:  # value head h reads q/k head h // (Hv / Hk)
            qr, kr = (mx.repeat(x, heads // x.shape[1], axis=1) for x in (qr, kr))
        qr = qr * scale
        vr, gr, br = (x[0, rows].astype(f32) for x in (v, g, beta))
        state, outs = store.read(f32)[0], []
        for lo in range(0, vr.shape[0], DELTA_CHUNK):
            part = slice(lo, lo + DELTA_CHUNK)
            y, state = _delta_chunk(*(x[part].swapaxes(0, 1) for x in (qr, kr, vr)),
                                    gr[part].T, br[part].T, state)
            outs.append(y)
        store.write(state[None])
        y = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
        return y.swapaxes(0, 1)[None]
    return _rows(ctx, layer_id, v.shape[1], 1, "GatedDelta", one)


def _delta_chunk(q, k, v, g, beta, s0):
    """One block of L tokens, per head: q, k [H, L, Dk], v [H, L, Dv], g, beta [H, L],
    s0 [H, Dk, Dv]. Returns (out [H, L, Dv], the state after the block)."""
    n = q.shape[1]
    cum = mx.cumsum(g, axis=1)                                           # [H, L]
    lower = mx.tril(mx.ones((n, n), dtype=mx.bool_))
    pair = mx.where(lower, mx.exp(cum[:, :, None] - cum[:, None, :]), 0.0)   # [H, i, j]
    kb, vb = k * beta[:, :, None], v * beta[:, :, None]
    kt = k.swapaxes(1, 2)
    # The UT transform: unit lower-triangular A = I + strictly_lower(kb k^T * pair); solving
    # A X = B condenses the block's delta-rule updates into matrix products.
    eye = mx.eye(n, dtype=mx.float32)
    system = eye + mx.tril((kb @ kt) * pair, k=-1)
    rhs = mx.concatenate([vb, kb * mx.exp(cum)[:, :, None]], axis=2)
    solved = mx.linalg.solve_triangular(system, rhs, upper=False, stream=mx.cpu)
    values, k_decayed = solved[:, :, :v.shape[2]], solved[:, :, v.shape[2]:]
    intra = (q @ kt) * pair                                              # [H, i, j]
    fresh = values - k_decayed @ s0                                      # [H, L, Dv]
    out = (q * mx.exp(cum)[:, :, None]) @ s0 + intra @ fresh
    last = cum[:, n - 1:]                                                # [H, 1]
    s1 = s0 * mx.exp(last)[:, :, None] + (k * mx.exp(last - cum)[:, :, None]).swapaxes(1, 2) @ fresh
    return out, s1


@register("SelectiveScan", needs_context=True)
def selective_scan(x, dt, a, b, c, d, dt_bias, layer_id, ctx):
    """Mamba's selective scan over x [1, T, D] from the layer's state S [1, D, N], token by
    token (its decay differs per channel and state entry, so no block form is used)."""
    f32 = mx.float32

    def one(store, rows):
        xr, br, cr = (v[0, rows].astype(f32) for v in (x, b, c))
        step = dt[0, rows].astype(f32)
        if dt_bias is not None:
            step = step + dt_bias.astype(f32)
        step = mx.logaddexp(step, mx.zeros_like(step))                  # softplus [T, D]
        decay = mx.exp(step[:, :, None] * a.astype(f32))                  # [T, D, N]
        update = (step * xr)[:, :, None] * br[:, None, :]                 # [T, D, N]
        state, ys = store.read(f32)[0], []
        for t in range(xr.shape[0]):
            state = decay[t] * state + update[t]
            ys.append(state @ cr[t])
        store.write(state[None])
        return (mx.stack(ys) + d.astype(f32) * xr)[None]
    return _rows(ctx, layer_id, x.shape[1], 1, "SelectiveScan", one)
