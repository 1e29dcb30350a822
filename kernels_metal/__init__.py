"""metalgen's custom kernels: one Python function per kernel.

Each kernel exists as a Metal shader (mx.fast.metal_kernel), a CUDA twin (mx.fast.cuda_kernel),
both generated from one body (kernels_metal/bodies) and a per-backend prelude
(kernels_metal/preludes), and a pure-MLX reference (kernels_metal.reference). The backend is
decided once; models call these functions and never know which variant ran. See docs/kernels.md.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from . import reference
from .reference import Experts, RopeTable, rope_table, make_sample_state, token_word, with_recent, ring_size
from .reference import MagpieLTWeights

__all__ = [
    "backend",
    "set_verbose",
    "gated_delta",
    "gated_delta_conv_step",
    "rms_norm",
    "add_rms_norm",
    "rope_table",
    "RopeTable",
    "rope",
    "mrope",
    "decode_attention",
    "paged_decode_attention",
    "PAGED_BLOCK_SIZES",
    "qk_rope_store",
    "kv_store",
    "linear",
    "quantized_linear",
    "sample",
    "make_sample_state",
    "token_word",
    "with_recent",
    "ring_size",
    "make_sample_scratch",
    "sample_rows",
    "Experts",
    "moe_route",
    "moe_experts",
    "MOE_MAX_EXPERTS",
    "MOE_MAX_TOP_K",
    "GEMV_MAX_ROWS",
    "MagpieLTWeights",
    "magpie_lt_draws",
    "make_magpie_lt_scratch",
]

# the MoE kernels' limits: a router row's probabilities sit in one group's shared memory, the chosen
# experts' partial sums in registers
MOE_MAX_EXPERTS = 1024
MOE_MAX_TOP_K = 16

_VERBOSE = False


def set_verbose(flag: bool = True) -> None:
    """Report (on stderr) every kernel variant that cannot be built and falls back."""
    global _VERBOSE
    _VERBOSE = bool(flag)


def verbose() -> bool:
    return _VERBOSE


@functools.lru_cache(maxsize=1)
def backend() -> str:
    """'metal' | 'cuda' | 'cpu', decided once."""
    try:
        if mx.metal.is_available():
            return "metal"
    except Exception:
        pass
    try:
        if hasattr(mx, "cuda") and mx.cuda.is_available():
            return "cuda"
    except Exception:
        pass
    return "cpu"


def _impl():
    if backend() == "cpu":
        from . import cpu

        return cpu
    from . import gpu

    return gpu


from .gpu import GEMV_MAX_ROWS  # noqa: E402  (the dispatch rule, documented in docs/kernels.md)

_FORCE_CUSTOM = False


def force_custom(flag: bool = True) -> None:
    """Use the custom GPU variants everywhere, even where MLX's built-in measured faster
    (for checks and benchmarks of the kernels themselves)."""
    global _FORCE_CUSTOM
    _FORCE_CUSTOM = bool(flag)


def _impl_for(kernel: str, **shape):
    """The module that serves this call: the CPU one on the CPU backend; on a GPU the custom
    variant where it measured faster than MLX's built-in (gpu.custom_wins), else the built-in,
    which the CPU module's functions are."""
    impl = _impl()
    if impl.__name__.endswith(".cpu") or _FORCE_CUSTOM or impl.custom_wins(kernel, **shape):
        return impl
    from . import cpu

    return cpu


def rms_norm(x, weight, eps):
    """Same semantics as mx.fast.rms_norm; float32 inside, output x.dtype."""
    return _impl_for("rms_norm").rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    """(y, h) with h = x + residual (x.dtype) and y = rms_norm(h)."""
    return _impl_for("add_rms_norm").add_rms_norm(x, residual, weight, eps)


def rope(x, table, offset):
    """Standard (rotate_half) RoPE of x (B, H, L, D) at positions offset .. offset+L-1. `offset` an
    int, or an int32 array: a scalar (MLX's built-in serves it, whose `mx.compile` trace takes the
    position as an input and so serves every position: decode/compiled.py) or (B,), one start per row
    (a batch of left-padded sequences: metalgen.batch_cache), which the built-in takes as well."""
    if isinstance(offset, mx.array):
        from . import cpu

        return cpu.rope(x, table, offset)
    return _impl_for("rope").rope(x, table, int(offset))


def mrope(x, table, position_ids, mrope_section, interleaved):
    """M-RoPE with three position ids per token (3, B, L); see docs/kernels.md for the layouts."""
    return _impl_for("mrope").mrope(x, table, position_ids, tuple(int(s) for s in mrope_section), bool(interleaved))


def decode_attention(q, k, v, length, scale):
    """One query token per sequence over the first `length` cache positions, grouped-query."""
    return _impl_for("decode_attention", length=int(length)).decode_attention(
        q, k, v, int(length), float(scale)
    )


# the block sizes the paged attention kernel is built for (a template argument: p / BS a shift)
PAGED_BLOCK_SIZES = (16, 32, 64)


def paged_decode_attention(q, k, v, table, lengths, max_length: int, block_size: int, scale):
    """One query token per row over a paged pool: q (B, Hq, 1, D); k, v (slots, Hkv, D) in blocks of
    `block_size` slots; table (B, MB) int32, row b's blocks in order; lengths (B,) int32, the positions
    each row attends to (its new token's included); max_length: at least every length (host-known, so
    that no readback is needed). -> (B, Hq, 1, D). Grouped-query: K/V heads are never repeated."""
    if block_size not in PAGED_BLOCK_SIZES:
        raise ValueError(f"paged_decode_attention: block size {block_size} is not one of {PAGED_BLOCK_SIZES}")
    return _impl_for("paged_decode_attention").paged_decode_attention(
        q, k, v, table, lengths, int(max_length), int(block_size), float(scale))


def qk_rope_store(q, k, v, q_weight, k_weight, eps, table, positions, slots, k_pool, v_pool):
    """A batch's decode step from its q/k/v projections to paged attention's inputs, in one launch on a GPU:
    q (B, Hq * D), k, v (B, Hkv * D) (leading shape: B rows); the heads of q and k RMS-normed by q_weight,
    k_weight (D,) where not None (Qwen3), turned by RoPE (`table`: the model's RopeTable, its dims D) at
    positions (B,) int32; row b's key and value heads written at slot slots[b] (B,) int32 of the pools
    k_pool, v_pool (slots, Hkv, D). Returns (q (B, Hq, 1, D), k_pool, v_pool): the pools to use from now on
    (on a GPU the same memory, written in place and ordered after the write; elsewhere new arrays).
    k and v None: q is one fused projection (B, (Hq + 2 Hkv) * D) of the queries, keys and values, in that
    order (a batch step's single q/k/v matmul), read in place."""
    return _impl_for("qk_rope_store").qk_rope_store(q, k, v, q_weight, k_weight, float(eps), table, positions,
                                                    slots, k_pool, v_pool)


def kv_store(kc, vc, k, v, layer: int, start: int, dep=None):
    """Write k, v (1, Hkv, n, D) into layer `layer` of a stacked KV cache kc, vc (L, Hkv, C, D) at positions
    start ..; returns (kc, vc, sync, keys, values), keys and values being the layer's first start + n
    positions (1, Hkv, start + n, D). On a GPU one launch that writes the cache in place (the next launch
    on the cache takes `sync` as its ordering input; read the written layer through keys and values, which
    the launch returns), on the CPU a slice update."""
    if start + k.shape[2] > kc.shape[2]:
        raise ValueError(f"kv_store: positions up to {start + k.shape[2]} past the cache capacity {kc.shape[2]}")
    return _impl_for("kv_store").kv_store(kc, vc, k, v, int(layer), int(start), dep)


def _no_rows(x, n: int):
    # MLX 0.32.4 stops the process (SIGFPE) on some products of no rows: quantized_matmul on the CPU, and on
    # CUDA the compiled nn.silu feeding a projection's empty input (measured 2026-11-26, H200). A zero-length
    # text run reaches the TTS talker's projection (fc2(silu(fc1(x)))), so such an input is answered here and
    # what feeds it is never evaluated
    return mx.zeros(x.shape[:-1] + (n,), x.dtype)


def linear(x, weight, bias=None):
    """x @ weight.T (+ bias): a GEMV when x has at most GEMV_MAX_ROWS rows, else mx.matmul."""
    if 0 in x.shape[:-1]:  # no rows
        return _no_rows(x, weight.shape[0])
    return _impl_for("linear").linear(x, weight, bias)


def quantized_linear(x, w, scales, biases, group_size, bits, bias=None):
    """MLX-quantized (4 or 8 bit) x @ W.T: a GEMV for few rows, else mx.quantized_matmul."""
    if 0 in x.shape[:-1]:  # no rows
        return _no_rows(x, w.shape[0])
    return _impl_for("quantized_linear").quantized_linear(x, w, scales, biases, int(group_size), int(bits), bias)


def sample(logits, temperature, top_k, top_p, min_p, state, recent=None, penalty=1.0, scratch=None):
    """Fused repetition penalty (the ids of `recent`, (T,) or (B, T); without it, the ring of a state given a
    window, which every draw also writes its token into), temperature / top-k / top-p / min-p
    and Gumbel-max draw on logits (B, V); (tokens, logprobs, next_state). `scratch`: from
    `make_sample_scratch(B, V)`, the device memory the GPU kernel works in (made per call without it).
    Calls that share a scratch must be ordered, each taking the state the one before returned (as a
    sampler does): MLX may run launches with no data edge between them at the same time."""
    return _impl_for("sample").sample(logits, float(temperature), int(top_k), float(top_p), float(min_p), state,
                                      recent, float(penalty), scratch)


def sample_rows(logits, settings, states, recent=None, scratch=None):
    """`sample` for rows that each have their own settings and state (a batch of requests, one launch):
    settings a (temperature, top_k, top_p, min_p, penalty, window) tuple a row (the penalty over the last
    `window` ids of the row's `recent` (B, H), -1 for none), states (B, 3) uint32 [seed, counter, stream].
    A row whose stream is 0 draws exactly as its own sampler would alone. Returns (tokens, logprobs,
    next_states (B, 3)). The same ordering rule as `sample` holds for a shared scratch."""
    return _impl_for("sample").sample_rows(
        logits, tuple((float(t), int(k), float(p), float(m), float(pen), int(w)) for t, k, p, m, pen, w in settings),
        states, recent, scratch)


def make_sample_scratch(B: int, V: int):
    """A sampler's working memory for B x V logits on a GPU backend (None on the CPU: the reference needs
    none). Keep one per shape and pass it to every `sample` call of one sampler."""
    impl = _impl()
    return None if impl.__name__.endswith(".cpu") else impl.make_sample_scratch(B, V)


def moe_route(logits, top_k, norm_topk_prob):
    """MoE router: logits (T, E) -> (scores (T, top_k) logits.dtype, inds (T, top_k) int32): the
    top_k experts by float32 softmax probability (ties to the smaller id), descending, renormalised
    over the chosen ones when norm_topk_prob."""
    return _impl_for("moe_route").moe_route(logits, int(top_k), bool(norm_topk_prob))


def moe_experts(x, inds, scores, gate, up, down):
    """The routed SwiGLU experts: x (T, H), inds and scores (T, k), each projection an `Experts`
    (stacked (E, out, in), dense or MLX-quantized) -> (T, H) = sum_j scores[:, j] * expert(x) for
    the experts inds[:, j]; only the chosen experts' weights are read."""
    return _impl_for("moe_experts").moe_experts(x, inds, scores, gate, up, down)


def gated_delta(q, k, v, g, beta, state=None):
    """The gated delta rule of Gated DeltaNet layers (Qwen3-Next, Qwen3.5): q, k (B, L, Hk, Dk) raw
    (L2-normalised here), v (B, L, Hv, Dv) with Hv a multiple of Hk (value head j reads key head
    j // (Hv // Hk)), g (log decay <= 0) and beta (B, L, Hv) float32, state (B, Hv, Dk, Dv) float32
    or None (zeros) -> (out (B, L, Hv, Dv) in v's dtype, new state float32). One token (decode) is
    one fused kernel on a GPU, every value head in one launch; a prompt takes the chunked form
    (reference.gated_delta_chunked), equal to the token-by-token recurrence up to float32 rounding."""
    return _impl_for("gated_delta").gated_delta(q, k, v, g, beta, state)


def gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state):
    """One decode token of a Gated DeltaNet layer from its input projections (reference.gated_delta_conv_step):
    mixed (B, 1, C) = [q | k | v] projected, conv_state (B, taps, C), conv_weight (C, taps + 1, 1), a, b
    (B, 1, Hv), A_log, dt_bias (Hv,), state (B, Hv, Dk, Dv) float32 -> (out (B, 1, Hv, Dv) in mixed's
    dtype, new conv state, new state). On a GPU one launch (gated_delta_conv_step): the conv, SiLU, the
    gates and the delta rule, where the unfused step is a dozen dispatches."""
    return _impl_for("gated_delta_conv_step").gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log,
                                                                    dt_bias, state)


def magpie_lt_draws(h, weights, bad, cfg_scale, temperature, top_k, state, scratch=None):
    """Magpie's local-transformer draw chain of one decoder step (docs/kernels.md): h (R, d) the decoder
    states (R = 1, or 2 for CFG: row 0 conditional, row 1 unconditional), weights a `MagpieLTWeights`, bad
    (V,) float32 additive mask (0 or -inf), cfg_scale (used when R = 2), temperature (<= 0: argmax), top_k
    (<= 0: all), state the sampler's [seed, counter, padding] (make_sample_state) -> (codes (n,) int32, next_state
    [seed, counter + n, padding as given]). Draw j samples as `sample` does at counter + j. On a GPU one fused kernel (one
    launch on CUDA, one launch per step on Metal) working in `scratch` (make_magpie_lt_scratch; made per
    call without it): calls that share one must be chained through the state. On the CPU the reference."""
    return _impl().magpie_lt_draws(h, weights, bad, float(cfg_scale), float(temperature), int(top_k), state,
                                   scratch)


def make_magpie_lt_scratch(weights):
    """The GPU kernel's working memory for `weights` (a MagpieLTWeights), zeroed; None on the CPU."""
    impl = _impl()
    return None if impl.__name__.endswith(".cpu") else impl.make_magpie_lt_scratch(weights)


# Magpie TTS's decoder step (docs/kernels.md, "Magpie decoder kernel")
from .reference import MagpieDecoderWeights  # noqa: E402

__all__ += ["MagpieDecoderWeights", "magpie_decoder_step", "make_magpie_decoder_scratch"]


def magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers=None, est_layers=None,
                        scratch=None):
    """One step of Magpie TTS's decoder on one new row per CFG row (R = 1, or 2: row 0 conditional, row 1
    unconditional): x (R, d) the step's input rows (before the learned position), pos the position they
    take (int or int32 array; < the caches' capacity C), kc, vc (NL, R, H, C, d / H) the self-attention
    caches, written in place at pos (the caller's arrays hold the new rows afterwards), mem_k, mem_v
    (NL, R, Lt, XD) the text's cross-attention keys and values (one head), mem_mask (R, Lt) valid text
    positions (None: all), prior (R, Lt) float32 attention prior or None, weights a `MagpieDecoderWeights`
    (one dtype: bf16, f16 or f32), prior_layers / est_layers the layers that apply the prior and that the
    alignment estimate averages (layer indices or a bool mask; None: all). Returns (h (R, d) after
    norm_out, scores (Lt,) float32 row 0's prior-modified cross-attention probabilities averaged over the
    estimate layers).

    On CUDA one launch (a megakernel, grid barriers between its 8 phases a layer), on Metal one launch per
    phase, both from bodies/magpie_decoder.body; on the CPU the reference (plain MLX ops). `scratch`
    (make_magpie_decoder_scratch) is the GPU kernel's working memory, made per call without it: calls
    sharing one must be ordered, each step's input made from the previous step's output."""
    return _impl().magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers,
                                       est_layers, scratch)


def make_magpie_decoder_scratch(weights, rows: int, text_len: int):
    """The GPU kernel's working memory for `rows` CFG rows over `text_len` text positions (zeroed); None on
    the CPU, whose reference needs none."""
    impl = _impl()
    return None if impl.__name__.endswith(".cpu") else impl.make_magpie_decoder_scratch(weights, rows, text_len)
