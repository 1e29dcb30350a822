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
    L = x.shape[-2]
    if offset + L > table.max_positions:
        raise ValueError(f"rope: positions up to {offset + L} exceed the table ({table.max_positions})")
    freqs = _periods(table)
    y = mx.fast.rope(x, table.dims, traditional=False, base=None, scale=1.0, offset=int(offset), freqs=freqs)
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


def decode_attention(q, k, v, length, scale):
    return mx.fast.scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], scale=scale)


def linear(x, weight, bias=None):
    if bias is None:
        return x @ weight.T
    return mx.addmm(bias, x, weight.T)


def quantized_linear(x, w, scales, biases, group_size, bits, bias=None):
    y = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits)
    if bias is not None:
        y = y + bias
    return y


def sample(logits, temperature, top_k, top_p, min_p, state):
    return ref.sample(logits, temperature, top_k, top_p, min_p, state)
