"""The MLX built-in formulation of each kernel (mx.fast.* where one exists): the CPU backend's
fallback, and on a GPU the variant used wherever the built-in measured faster than the custom
kernel (gpu.custom_wins). Checked against kernels_metal.reference in
tests/test_kernels_dispatch.py."""

from __future__ import annotations

import mlx.core as mx

from . import reference as ref


def rms_norm(x, weight, eps):
    return mx.fast.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    h = x + residual
    return mx.fast.rms_norm(h, weight, eps), h


def rope(x, table, offset):
    # The table holds cos/sin(pos * inv_freq) * attention_scale; mx.fast.rope takes the periods
    # 1 / inv_freq and rotates linearly, so the scale multiplies the result. Its angle is computed
    # in float32 (as Hugging Face computes it), the table's in float64: they differ by about
    # pos * 6e-8 radians.
    # offset: an int, or an int32 array, scalar or (B,) one start per row (its bound is the caller's:
    # generation checks the context before decoding)
    L = x.shape[-2]
    if not isinstance(offset, mx.array) and offset + L > table.max_positions:
        raise ValueError(f"rope: positions up to {offset + L} exceed the table ({table.max_positions})")
    freqs = _periods(table)
    y = mx.fast.rope(x, table.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=freqs)
    if table.attention_scale != 1.0:
        y = (y.astype(mx.float32) * table.attention_scale).astype(x.dtype)
    return y


_PERIODS = {}


def _periods(table):
    key = id(table)
    got = _PERIODS.get(key)
    if got is None or got[0] is not table:
        got = (table, mx.array((1.0 / table.inv_freq).astype("float32")))
        _PERIODS[key] = got
    return got[1]


def mrope(x, table, position_ids, mrope_section, interleaved):
    return ref.mrope(x, table, position_ids, mrope_section, interleaved)


def kv_store(kc, vc, k, v, layer, start, dep=None):
    return ref.kv_store(kc, vc, k, v, layer, start, dep)


def decode_attention(q, k, v, length, scale):
    return mx.fast.scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], scale=scale)


def paged_decode_attention(q, k, v, table, lengths, max_length, block_size, scale):
    # the rows' positions gathered out of the pool, then MLX's SDPA with each row's length as its mask
    kk, vv, valid = ref.paged_gather(k, v, table, lengths, max_length, block_size)
    return mx.fast.scaled_dot_product_attention(q, kk, vv, scale=scale, mask=valid[:, None, None, :])


def qk_rope_store(q, k, v, q_weight, k_weight, eps, table, positions, slots, k_pool, v_pool):
    return ref.qk_rope_store(q, k, v, q_weight, k_weight, eps, table, positions, slots, k_pool, v_pool)


def linear(x, weight, bias=None):
    if bias is None:
        return x @ weight.T
    return mx.addmm(bias, x, weight.T)


def _f32(x):
    return x if x.dtype == mx.float32 else x.astype(mx.float32)


def quantized_linear(x, w, scales, biases, group_size, bits, bias=None):
    # x in float32: MLX's CPU quantized product (0.32) is 8x slower on bf16 activations and 30x on fp16 than
    # on float32 ones, and 3.5-6% from exact against 0.5% (2026-11-27, a 3072x1024 4-bit GEMV, this
    # two-core machine). The product is rounded to x's dtype once, as a 16-bit matmul rounds.
    y = mx.quantized_matmul(_f32(x), w, scales, biases, transpose=True, group_size=group_size,
                            bits=bits).astype(x.dtype)
    if bias is not None:
        y = y + bias
    return y


def sample(logits, temperature, top_k, top_p, min_p, state, recent=None, penalty=1.0, scratch=None):
    return ref.sample(logits, temperature, top_k, top_p, min_p, state, recent, penalty)


def sample_rows(logits, settings, states, recent=None, scratch=None):
    return ref.sample_rows(logits, settings, states, recent)


def moe_route(logits, top_k, norm_topk_prob):
    # softmax, then the k most probable by sort (MLX's own ops); equals the reference wherever no
    # two experts are exactly as probable
    p = mx.softmax(logits.astype(mx.float32), axis=-1)
    inds = mx.argsort(-p, axis=-1)[..., :top_k].astype(mx.int32)
    top = mx.take_along_axis(p, inds, axis=-1)
    if norm_topk_prob:
        top = top / mx.sum(top, axis=-1, keepdims=True)
    return top.astype(logits.dtype), inds


# A routing of at most this many (token, expert) pairs takes each pair's expert weights by gather;
# more go through the grouped product (mx.gather_mm / gather_qmm over assignments sorted by expert).
MOE_GATHER_MAX_PAIRS = 64


def _expert_product(x, ex, inds, sorted_):
    """x (N, 1, in) @ expert_{inds}.T -> (N, 1, out) in x.dtype, one expert per row of x."""
    if ex.bits:
        # x in float32, as quantized_linear (there, why); the product rounded once
        return mx.gather_qmm(_f32(x), ex.weight, ex.scales, ex.biases, rhs_indices=inds, transpose=True,
                             group_size=ex.group_size, bits=ex.bits, sorted_indices=sorted_).astype(x.dtype)
    # MLX's CPU gather_mm takes float32 only: product in float32, rounded once, as a GEMM rounds
    w = ex.weight.swapaxes(-1, -2)
    return mx.gather_mm(_f32(x), _f32(w), rhs_indices=inds, sorted_indices=sorted_).astype(x.dtype)


def moe_experts(x, inds, scores, gate, up, down):
    T, H = x.shape
    k = inds.shape[-1]
    flat = inds.reshape(-1)
    if T * k <= MOE_GATHER_MAX_PAIRS and not gate.bits:
        # (T, k, out, in) weights gathered: small, and native-dtype products
        xs = x[:, None, :, None]
        g = (mx.take(gate.weight, inds, axis=0) @ xs)[..., 0]
        u = (mx.take(up.weight, inds, axis=0) @ xs)[..., 0]
        a = nn_silu(g) * u
        y = (mx.take(down.weight, inds, axis=0) @ a[..., None])[..., 0]  # (T, k, H)
    else:
        order = mx.argsort(flat)
        rows = order // k
        xs = x[rows][:, None, :]  # (T*k, 1, H), by expert
        e = flat[order]
        a = nn_silu(_expert_product(xs, gate, e, True)) * _expert_product(xs, up, e, True)
        ys = _expert_product(a, down, e, True)[:, 0, :]
        y = ys[mx.argsort(order)].reshape(T, k, H)
    return (scores.astype(mx.float32)[..., None] * y.astype(mx.float32)).sum(axis=1).astype(x.dtype)


def nn_silu(x):
    # mlx.nn.silu's arithmetic (x * sigmoid(x), each rounded to x.dtype), without importing mlx.nn
    return x * mx.sigmoid(x)


def moe_pack(inds, num_experts, block):
    return ref.moe_pack(inds, num_experts, block)


def gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state):
    return ref.gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state)


def gated_delta(q, k, v, g, beta, state=None):
    # one token steps the recurrence; a prompt takes the chunked form (matmuls over chunks of 64),
    # equal to it up to float32 rounding
    if q.shape[1] == 1:
        return ref.gated_delta_recurrent(q, k, v, g, beta, state)
    return ref.gated_delta_chunked(q, k, v, g, beta, state)


def magpie_lt_draws(h, weights, bad, cfg_scale, temperature, top_k, state, scratch=None):
    return ref.magpie_lt_draws(h, weights, bad, cfg_scale, temperature, top_k, state)


def magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers=None, est_layers=None,
                        scratch=None):
    # the reference is plain MLX ops already (a few dozen per layer); the CPU has no faster form
    return ref.magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers, est_layers)
