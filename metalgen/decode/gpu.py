"""The fused (per-phase) and megakernel (one launch per token) decode paths.

Both run kernels_metal/bodies/decode_layer.body on the stacked weights:

* `MegakernelDecoder` (CUDA only): one launch per token runs every layer and the final norm, the
  groups meeting at a grid barrier between the 5 phases of each layer. The barrier's word lives in
  the scratch (zeroed once, never reset: each barrier flips its top bit, cuda.h), not in a small
  output: MLX puts <= 8-byte arrays in a read-mostly managed pool where every atomic faulted. The grid is kept co-resident: at most `blocks_per_sm` groups of 256
  threads per multiprocessor (the kernel uses ~72 registers and <= 48 KB of shared memory, so 3
  fit; we use 2).
* `FusedDecoder` (Metal and CUDA): the same body, one launch per phase (5 per layer + 1): norm
  into the QKV projection; q/k norms, RoPE and the cache write into attention; the split merge,
  o_proj and the residual add; norm into gate/up with SiLU; down with the residual add.

The KV cache (stacked layout) and a float32 scratch are inputs that the kernel updates in place;
every launch of a token runs on the one stream, after the previous token's sampler (its input),
so nothing else touches them meanwhile. The runtime layer count and the token-or-embedding input
let the same compiled kernel serve any decoder of the same head dim and flags.

MLX-quantized weights (weights.quant, 4 or 8 bits) run the body's MG_QUANT variant on either path
(`decode_megakernel_q`, `decode_layer_q` and their MoE and hybrid forms), each quantized input followed by
its scales and biases.

MoE decoders (weights.moe) run the body's MG_MOE variant (`decode_megakernel_moe`, `decode_layer_moe`,
version 1): 6 phases a layer, the sparse layers' router, routing and chosen experts on the GPU; the
fused path skips the dense layers' idle sixth launch.

Hybrid Gated DeltaNet stacks (weights.hybrid: Qwen3-Next, Qwen3.5) run the MG_HYBRID variant, built on
the MoE one (`decode_megakernel_hybrid`, `_q`; fused: `decode_layer_hybrid`, `_q`): an attention layer's phases
as before with the output gate and partial RoPE, a Gated DeltaNet layer's as its input projections with
the conv, the delta rule, and the gated norm with out_proj; the conv taps and recurrent states of the
state (`DecodeState.conv`, `.rec`) are updated in place as the KV cache is.

`version` 1 is the body as measured in run 4; version 2 (MG_DECODE_V 2, docs/decode.md) does
o_proj and down as split-K tasks over every lane-group with atomic partial sums, folds the residual
add into the next phase's norm, and keeps more loads in flight. Both compile from the same body.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from kernels_metal import source as S
from kernels_metal.gpu import multiprocessors, spec_kernel

from .stacked import DecodeState, StackedWeights

THREADS = 256
# attention positions per (head, split) item at least: 32, a group's round trip at head_dim 128 (8 lane-groups of
# 4 positions, decode_layer.body). H200, 2026-11-26, against 16 in the same process at 128 positions: qwen3-0.6b
# 842.8 against 857.7 us a token, qwen2.5-0.5b 771.8 against 788.9 (64: 864.0, 786.7); at 1024 positions the
# split count is the same either way (the groups bound it), and measured 911.5 against 931.0: one run's
# noise is about 2%. 16 had won against 64 by 2-5% with the earlier attention loop (2 positions a
# lane-group a round trip).
MIN_CHUNK = 32
PARAM_BLOCK = 64  # positions whose parameter rows are made at once
# the launches' dependency token (`sync`, never read): 4 words, out of MLX's unified-memory pool of small arrays,
# whose fill launch (the fused path's) would write across the bus
SYNC_WORDS = 4


# Benchmarks set this to sweep the megakernel's grid; None sizes it from the multiprocessors.
GRID_BLOCKS: Optional[int] = None


# From this many positions on, a decode attention item takes 2 query heads of a KV head, so that a split's
# keys and values are read once for both (decode_layer.body's GQ); below, one query head an item, whose
# items are twice as many. H200, 2026-11-25 (benchmarks/results/decode_h200_2026-11-25/), grouped against
# one head an item in the same run: qwen3-0.6b at 16384 positions 409.3 against 332.8 tok/s (+23%),
# 12288 +20%, 8192 +11%, 6144 +6%, but 4096 -3% and 128 -12%; qwen2.5-0.5b at 16384 552.7 against 453.7
# (+22%).
GROUP_FROM = 6144
GROUP_MAX = 2  # decode_layer.body's GQM: the query heads an item's registers hold (1 in the hybrid kernels)


def attention_group(heads: int, kv_heads: int, length: int, most: int = GROUP_MAX) -> int:
    """The query heads a decode attention item takes at `length` positions (decode_layer.body's GQ), at
    most `most` (the kernel's GQM)."""
    return min(heads // kv_heads, most) if length >= GROUP_FROM else 1


def grid_blocks(blocks_per_sm: int = 2) -> int:
    if GRID_BLOCKS:
        return int(GRID_BLOCKS)
    sms = multiprocessors()
    # unknown GPU: 32 groups are co-resident on anything with >= 16 multiprocessors
    return blocks_per_sm * sms if sms else 32


VERSIONS = (1, 2)


class _GpuDecoder:
    base_kernel = ""
    base_name = ""

    def __init__(self, weights: StackedWeights, blocks: Optional[int] = None, version: int = 1):
        w = weights
        if version not in VERSIONS:
            raise ValueError(f"decode kernel version {version} (choose from {VERSIONS})")
        if version == 2 and w.head_dim > 128:
            # past 128 registers: 2 groups per multiprocessor no longer fit (the grid barrier needs them)
            raise ValueError("decode kernel version 2 needs head_dim <= 128")
        self.version = version
        m = w.moe
        q = w.quant
        hy = w.hybrid
        if (m is not None or q is not None) and version != 1:
            raise ValueError("the MoE, hybrid and quantized decode kernels are version 1 only")
        kind = "_hybrid" if hy is not None else ("_moe" if m is not None else "")
        self.kernel_name = self.base_kernel + ("_v2" if version == 2 else "") + kind + ("_q" if q is not None else "")
        self.name = self.base_name + ("_v2" if version == 2 else "")
        if w.dtype not in (mx.bfloat16, mx.float16):
            raise ValueError(f"the {self.name} path needs bfloat16 or float16 weights, not {w.dtype}")
        if w.head_dim % 64 or w.head_dim > 256 or w.hidden % 8 or w.inter % 8 or w.heads % w.kv_heads:
            raise ValueError("the decode kernels need head_dim in {64, 128, 192, 256}, hidden and "
                             "intermediate sizes divisible by 8")
        if m is not None and (m.top_k > 16 or m.experts > 1024 or m.inter % 8 or m.shared % 8):
            raise ValueError("the MoE decode kernels take at most 1024 experts, top 16, and intermediate sizes "
                             "divisible by 8")
        self.w = w
        # the kernel's steps for one token: 5 phases a layer (6 with sparse layers), then the final norm
        # (decode_layer.body)
        self.phases = 6 if m is not None else 5
        self.steps = self.phases * w.layers + 1
        self.blocks = blocks or grid_blocks()
        # attention items are (KV head, group of query heads, split): as many splits as keep every group busy,
        # at most when each item takes GROUP_MAX query heads
        self.group_max = 1 if w.hybrid is not None else GROUP_MAX
        self.max_splits = max(1, self.blocks // self._items_per_split(self.group_max))
        # the activation buffer: the dense intermediate size, or the chosen experts' and the shared one's
        act = max(w.inter, m.top_k * m.inter + m.shared) if m is not None else w.inter
        sk = max(w.hidden, w.q_dim, act, hy.value_heads * hy.value_dim if hy is not None else 0)
        self.sk = (sk + 255) // 256 * 256
        self.template = [("T", w.dtype), ("D", w.head_dim), ("QKN", bool(w.qk_norm)),
                         ("BIAS", bool(w.has_bias)), ("SK", self.sk), ("HT", w.hidden), ("HQT", w.heads),
                         ("HKVT", w.kv_heads), ("IT", w.inter)]
        if m is not None:
            self.template += [("EXT", m.experts), ("KX", m.top_k), ("MIT", m.inter), ("SIT", m.shared)]
        # the projection buffer: q/k/v (an attention layer's q with its gates), or a Gated DeltaNet layer's rows
        qkv_buf = w.qkv_dim
        if hy is not None:
            self.template += [("ROT", hy.rotary_dims), ("HKL", hy.key_heads), ("HVL", hy.value_heads),
                              ("DKL", hy.key_dim), ("DVL", hy.value_dim), ("KCT", hy.conv_kernel),
                              ("QKVZ", hy.packed)]
            qkv_buf = max(w.qkv_dim + w.q_dim, hy.rows)
        if q is not None:
            self.template += [("QB", q.bits), ("GS", q.group_size), ("QBR", q.gate_bits), ("GSR", q.gate_group_size)]
            names = (S.QUANT_HYBRID_WEIGHTS if hy is not None else S.QUANT_MOE_WEIGHTS if m is not None
                     else S.QUANT_WEIGHTS)
            self.quant_inputs = [a for name in names for a in q.params[name]]
        else:
            self.quant_inputs = []
        # the attention splits' partials start on 16 bytes, head_dim + 4 floats a split (decode_layer.body's part)
        work = -(-(w.hidden + qkv_buf + act) // 4) * 4 + w.heads * self.max_splits * (w.head_dim + 4)
        # version 2's [h1, accA, accB] (hidden floats each; zero at start, the kernel keeps the sums
        # zeroed between their uses); allocated for both versions
        self.v2_offset = (work + 31) // 32 * 32
        work = self.v2_offset + 3 * w.hidden
        # the megakernel's grid-barrier word: alone on a 128-byte line after the work area, zeroed
        # with the scratch and never reset (kernels_metal/preludes/cuda.h, mg_grid_barrier)
        self.barrier_offset = (work + 31) // 32 * 32
        # per-step timing (megakernel, `stamp_steps`): ns at start and end, cycles at start and at the
        # end of each step, then 2 marks within each step (uint32 words)
        self.stamp_offset = self.barrier_offset + 32
        # the megakernel's merged attention output (q_dim floats) and per-head split counters
        # (zero at start; the merging group resets its head's)
        self.merge_offset = (self.stamp_offset + 3 * self.steps + 3 + 31) // 32 * 32
        # the merge area holds obuf [Hq * D] floats, cnt [Hq] words, then (decode_layer.body, OP_FUSE) the count of a
        # layer's merges on its own 128-byte line; after it, MoE's: the router logits [E + 1] and the routing choice
        # [2 * top_k]
        self.moe_offset = (self.merge_offset + w.q_dim + (w.heads + 31) // 32 * 32 + 32 + 31) // 32 * 32
        # hybrid: the delta rule's output [Hv * Dv]
        self.hybrid_offset = (self.moe_offset + (m.experts + 1 + 2 * m.top_k if m is not None else 0) + 31) // 32 * 32
        self.scratch_size = self.hybrid_offset + (hy.value_heads * hy.value_dim if hy is not None else 0)
        self.stamp_steps = False
        # Arrays the kernels read are kept above 8 bytes: MLX's CUDA allocator puts arrays of 8 bytes or less
        # in a pool of unified memory that the CPU's token readback also touches every step, so that (as we read
        # the allocator; the timing is measured) every group's read of them may cross the bus. [eps, scale]
        # padded to 4 floats took 7-20 us (0.5-2.6%) off a pipelined greedy token (benchmarks/scalar_pool_probe.py,
        # H200, 2026-11-26). The token a step takes may be (1,) in that pool; generate_step feeds it the one the
        # sampler writes into its own 16-byte state as well (DeviceSampler.last_token): 0.5-1.2% off the small
        # shapes' pipelined token (H200, 2026-11-27, means of 10 runs), where a copy by an add cost its own launch.
        self.fparams = mx.array([w.eps, w.head_dim**-0.5, 0.0, 0.0], mx.float32)
        self.no_emb = mx.zeros((w.hidden,), w.dtype)
        self.no_tok = mx.zeros((1,), mx.int32)
        self.no_dep = mx.zeros((SYNC_WORDS,), mx.uint32)
        mx.eval(self.fparams, self.no_emb, self.no_tok, self.no_dep)
        self._param_cache = {}

    def prepare(self, state: DecodeState) -> DecodeState:
        if state.scratch is None:
            state.scratch = mx.zeros((self.scratch_size,), mx.float32)
            mx.eval(state.scratch)
        return state

    def _items_per_split(self, group: int) -> int:
        """Attention items a context split makes when each takes `group` query heads of a KV head."""
        g = self.w.heads // self.w.kv_heads
        return self.w.kv_heads * -(-g // min(group, g))

    def splits(self, length: int, group: int):
        """(splits, positions a split) of `length` positions when an attention item takes `group` query heads:
        enough items to keep the groups busy."""
        most = max(1, min(self.max_splits, self.blocks // self._items_per_split(group)))
        ns = max(1, min(most, -(-length // MIN_CHUNK)))
        chunk = -(-length // ns)
        return -(-length // chunk), chunk

    def _param_row(self, pos, capacity, use_emb, s_begin, s_end):
        w = self.w
        group = attention_group(w.heads, w.kv_heads, pos + 1, self.group_max)
        ns, chunk = self.splits(pos + 1, group)
        return [w.hidden, w.heads, w.kv_heads, w.inter, w.layers, pos, capacity, use_emb, s_begin, s_end, ns,
                chunk, self.blocks, self.barrier_offset, self.v2_offset,
                self.stamp_offset if self.stamp_steps else 0, self.merge_offset, self.moe_offset,
                int(w.moe is not None and w.moe.norm_topk), self.hybrid_offset, group]

    def _params(self, state, use_emb, s_begin, s_end):
        """The launch's int32 parameter array. Rows for PARAM_BLOCK consecutive positions are made
        in one host-to-device copy and each launch takes a row (a view, no launch): a fresh host array per
        launch cost ~65 us a token on the H200 (benchmarks/decode_step_probe.py)."""
        pos = state.pos
        block = pos // PARAM_BLOCK
        key = (block, state.capacity, use_emb, s_begin, s_end, self.stamp_steps)
        table = self._param_cache.get(key)
        if table is None:
            if len(self._param_cache) >= 8 * self.steps:  # a few blocks of every phase
                self._param_cache.clear()
            first = block * PARAM_BLOCK
            rows = [self._param_row(p, state.capacity, use_emb, s_begin, s_end)
                    for p in range(first, first + PARAM_BLOCK)]
            table = mx.array(rows, mx.int32)
            mx.eval(table)
            self._param_cache[key] = table
        # a slice, a view of the table: `table[i]` is a gather whose index, a scalar the host makes every step, sits in
        # MLX's unified-memory pool of small arrays (docs/decode.md, "Small arrays in unified memory")
        i = pos - block * PARAM_BLOCK
        return table[i : i + 1].reshape(-1)

    init_value = 0

    def _dep(self, state: DecodeState) -> mx.array:
        """The previous launch on this state, as an input: the kernels update the KV cache in
        place, so a step whose output nobody reads (the code predictor's first position) must
        still run before the next one. MLX sees the order only through this edge."""
        return self.no_dep if state.dep is None else state.dep

    def _launch(self, state, tok, emb, params, dep):
        w = self.w
        table = w.rope_table
        moe = list(w.moe.arrays) if w.moe is not None else []
        hybrid = list(w.hybrid.arrays) + [state.conv, state.rec] if w.hybrid is not None else []
        return spec_kernel(self.kernel_name)(
            inputs=[tok, emb, w.embed, w.wqkv, w.bqkv, w.qkn, w.wo, w.wgu, w.wd, w.norms, w.fnorm,
                    table.cos, table.sin, state.kc, state.vc, state.scratch, params, self.fparams, dep] + moe
            + hybrid + self.quant_inputs,
            template=self.template, grid=(self.blocks * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
            output_shapes=[(w.hidden,), (SYNC_WORDS,)], output_dtypes=[w.dtype, mx.uint32], init_value=self.init_value)

    def _inputs(self, state, token, embedding):
        w = self.w
        pos = state.pos
        if pos >= state.capacity:
            raise ValueError(f"decode position {pos} is past the cache capacity {state.capacity}")
        if pos >= w.rope_table.max_positions:
            raise ValueError(f"decode position {pos} is past the RoPE table")
        self.prepare(state)
        if embedding is None:
            if not w.vocab:
                raise ValueError("this stack has no token embedding: pass an embedding")
            if token.dtype != mx.int32 or token.shape != (1,):
                token = token.reshape(-1)[:1].astype(mx.int32)
            return token, self.no_emb, 0
        return self.no_tok, embedding.reshape(w.hidden).astype(w.dtype), 1


class MegakernelDecoder(_GpuDecoder):
    base_kernel = "decode_megakernel"
    base_name = "megakernel"
    init_value = None  # every element of `out` is written; `sync` is unused (no fill launch)

    def _stamps(self, state: DecodeState):
        """The last launch's stamps in microseconds since its start: the end of every step (n,) and
        its two marks (n, 2). Group 0's cycle counter, scaled by the launch's nanosecond timer;
        reads the scratch back."""
        import numpy as np

        n = self.steps
        raw = np.array(state.scratch[self.stamp_offset:self.stamp_offset + 3 * n + 3]).view(np.uint32)
        ns = float((int(raw[1]) - int(raw[0])) & 0xFFFFFFFF)
        cycles = ((raw[3:] - raw[2]) & 0xFFFFFFFF).astype(np.float64)  # since the start
        ends = cycles[:n]
        scale = ns / ends[-1] / 1e3 if ends[-1] > 0 else 1.0
        return ends * scale, cycles[n:].reshape(n, 2) * scale

    def step_times(self, state: DecodeState):
        """With `stamp_steps` set before the step: the last launch's per-step durations in
        microseconds (5 per layer, then the final norm), as group 0 saw them (each ends at the
        grid barrier after the step). Call after the step was evaluated."""
        import numpy as np

        ends, _ = self._stamps(state)
        return np.diff(np.concatenate([[0.0], ends]))

    def step_marks(self, state: DecodeState):
        """With `stamp_steps`: per step of the last launch, microseconds from the step's start (the
        previous step's barrier) to (input vector ready or attention done, work done), an array
        (steps, 2); the step's own duration is `step_times`."""
        import numpy as np

        ends, marks = self._stamps(state)
        return marks - np.concatenate([[0.0], ends[:-1]])[:, None]

    def step(self, state: DecodeState, token=None, embedding=None) -> mx.array:
        tok, emb, use_emb = self._inputs(state, token, embedding)
        params = self._params(state, use_emb, 0, self.steps)
        out, state.dep = self._launch(state, tok, emb, params, self._dep(state))
        state.pos += 1
        return out.reshape(1, -1)


class FusedDecoder(_GpuDecoder):
    base_kernel = "decode_layer"
    base_name = "fused"

    def _live_steps(self):
        """The steps that do work: all of them, less the dense layers' idle sixth phase in an MoE decoder."""
        m = self.w.moe
        if m is None:
            return range(self.steps)
        sparse = set(m.sparse_layers)
        return [s for s in range(self.steps) if not (s % 6 == 5 and s // 6 < self.w.layers and s // 6 not in sparse)]

    def step(self, state: DecodeState, token=None, embedding=None) -> mx.array:
        tok, emb, use_emb = self._inputs(state, token, embedding)
        dep = self._dep(state)
        out = None
        for s in self._live_steps():
            out, dep = self._launch(state, tok, emb, self._params(state, use_emb, s, s + 1), dep)
        state.dep = dep
        state.pos += 1
        return out.reshape(1, -1)
