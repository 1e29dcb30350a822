"""Choosing the decode path, and the step function that generate_step runs after prefill.

Modes: "plain" (the model's own MLX path, per-layer caches), "compiled" (the hybrid Gated DeltaNet
stacks: the model's own layers traced by mx.compile, per-layer caches; "auto" on CUDA where the
megakernel cannot take them), "reference" (stacked weights, plain MLX ops: a check, not a speed-up;
dense and MoE stacks), "fused" (decode_layer, one launch per phase), "megakernel" (CUDA: one launch per
token), "auto" (on CUDA the megakernel for every stack its templates take, dense, MoE or hybrid, once it
has passed its self-check on this model, and the compiled path for a hybrid stack it cannot take; plain
on the CPU, on Metal, and whenever the fast path cannot run).

Kernel versions (docs/decode.md): "megakernel" and "fused" (and "auto") run version 2 of the body
where `prefer_v2` says so (the shapes in AUTO_V2; the `*_v1`/`*_v2` modes pin one) and it passes
its self-check, else version 1; "megakernel_v1" / "megakernel_v2" / "fused_v2" pin a version (no
fallback, for the benchmarks).
"""

from __future__ import annotations

import sys
import weakref
from typing import Callable, Dict, Optional, Tuple

import mlx.core as mx

import kernels_metal as K

from ..cache import make_prompt_cache
from ..errors import MetalgenError
from .modes import DECODE_MODES
from .reference import ReferenceDecoder
from .stacked import DecodeState, StackedWeights, empty_state, stack_weights, stacked_cache, unsupported_reason

MODES = DECODE_MODES
# The load-time check rejects a kernel that fails on this model (a wrong kernel's logits are unrelated:
# ~1.4 apart); the GPU tests hold the kernels to plain far tighter. bf16 noise on random-weight models is
# ~1.7% (plain bf16 vs float32 logits, qwen2.5-0.5b shape); two bf16 paths that round in different
# places differ by ~2-3% (docs/decode.md), and grow with depth and width: 0.0656 on qwen3-8b-4bit
# (2026-11-24, H200, benchmarks/results/dense_h200_2026-11-24/), which a 6e-2 bound sent to the plain
# path at 0.87x mlx-lm's speed.
CHECK_RTOL = 0.15
# A hybrid stack is checked against the plain path (no reference decoder carries it). Where it has sparse
# layers, random-weight routers nearly tie so often that any two bf16 paths choose other experts within a
# few tokens and then diverge through the recurrent states: on Qwen3.5-35B-A3B's shape cut to 4 layers
# (2026-11-24, H200, benchmarks/results/hybrid_h200_2026-11-24_megakernel.txt) plain bf16 itself is
# 0.12-0.71 from float32 and the megakernel as far, step for step. There the check only rejects a
# failed kernel (unrelated logits are ~1.4 apart); the GPU tests hold the kernel to plain on the tiny
# sparse stacks (tests/test_decode_paths.py).
CHECK_RTOL_SPARSE_HYBRID = 0.9
# "auto" on these backends takes the megakernel for every stack that its templates accept (the
# decoder's constructor names what they do not: head_dim outside {64, 128, 192, 256}, a float32 stack,
# a quantization other than 4/8-bit in groups of 32-128, ...) and that passes the start-up self-check:
# a rule, not a list of shapes. Why a rule holds (every dense shape measured faster than mlx-lm and plain,
# bf16 and 4-bit, H200 2026-11-24): docs/decode.md, "Auto: a rule".
AUTO_MEGAKERNEL = {"cuda"}
# Shapes (auto_shape_key) where version 2 of the decode body is tried first (then version 1 if its
# self-check fails). Empty: on the H200
# (benchmarks/results/decode_h200_2026-11-22/decode_h200_final.txt) version 2 measured
# within run-to-run noise of version 1 (820 vs 793 tok/s on qwen2.5-0.5b, 654 vs 643 on
# qwen3-0.6b, 226 vs 228 on qwen3-4b), and its qwen2.5-0.5b error vs plain was 0.0208 (v1 0.0197).
AUTO_V2 = {
    "cuda": set(),
}
# hybrid (Gated DeltaNet) stacks take the compiled path under "auto" on these backends
# (2026-11-23, H200, Qwen3.5-35B-A3B 4-bit, prompt 128: 91.7 tok/s, plain 51.5, mlx-lm 44.0-50.2;
# benchmarks/results/hybrid_h200_2026-11-23.txt)
AUTO_COMPILED = {"cuda"}
_registry: Dict[int, Tuple[weakref.ref, dict]] = {}


def auto_shape_key(model) -> Optional[tuple]:
    """The key that AUTO_V2 lists shapes by (None if the model has no decoder spec)."""
    sp = getattr(model, "spec", None)
    if sp is None:
        return None
    try:
        return (sp.hidden_size, sp.num_hidden_layers, sp.intermediate_size, sp.num_attention_heads,
                sp.num_key_value_heads, sp.head_dim, bool(sp.qk_norm), bool(sp.qkv_bias))
    except AttributeError:
        return None


def prefer_v2(model, backend: str) -> bool:
    """Whether "auto" / "megakernel" / "fused" try version 2 of the decode body first."""
    return auto_shape_key(model) in AUTO_V2.get(backend, ())


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise MetalgenError(f"unknown decode path '{mode}' (choose from {', '.join(MODES)})")


def _entry(model) -> dict:
    key = id(model)
    hit = _registry.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    for k in [k for k, (ref, _) in _registry.items() if ref() is None]:
        del _registry[k]
    entry: dict = {}
    _registry[key] = (weakref.ref(model), entry)
    return entry


def stacked_weights(model) -> StackedWeights:
    """The model's stacked weights, built (and the model's parameters rebound to them) once."""
    entry = _entry(model)
    if "weights" not in entry:
        entry["weights"] = stack_weights(model, rebind=True)
    return entry["weights"]


def rel_err(a: mx.array, b: mx.array) -> float:
    """||a - b|| / ||b||, float32."""
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float((mx.sqrt(mx.sum((a - b) ** 2)) / mx.maximum(mx.sqrt(mx.sum(b * b)), 1e-30)).item())


def self_check(decoder, weights: StackedWeights, steps: int = 3, head=None) -> float:
    """Run `steps` tokens through `decoder` and the reference from an empty cache; the largest
    relative difference ||a - b|| / ||b|| of the logits (of the final hidden states when no LM
    `head` is given)."""
    ref = ReferenceDecoder(weights)
    sa, sb = decoder.prepare(empty_state(weights, steps)), empty_state(weights, steps)
    worst = 0.0
    embeds = None
    if not weights.vocab:  # a stack fed embeddings only: seeded embedding-sized inputs
        embeds = mx.random.normal((steps, weights.hidden), key=mx.random.key(7919)).astype(weights.dtype)
    for t in range(steps):
        x = (dict(token=mx.array([(7919 * (t + 1)) % weights.vocab], mx.int32)) if embeds is None
             else dict(embedding=embeds[t]))
        a = decoder.step(sa, **x)
        b = ref.step(sb, **x)
        if head is not None:
            a, b = head(a), head(b)
        mx.eval(a, b)
        worst = max(worst, rel_err(a, b))
    return worst


def self_check_plain(decoder, model, steps: int = 3) -> float:
    """For stacks the reference decoder does not carry (the hybrid ones): run `steps` tokens through
    `decoder` from an empty state and through the model's own plain path from a fresh cache; the largest
    relative difference of the logits."""
    w = decoder.w
    state = decoder.prepare(empty_state(w, steps))
    cache = make_prompt_cache(model, decode="plain")
    worst = 0.0
    for t in range(steps):
        tok = mx.array([(7919 * (t + 1)) % w.vocab], mx.int32)
        a = model.logits(decoder.step(state, tok))
        b = model(tok[None], cache=cache)[:, -1, :]
        mx.eval(a, b)
        worst = max(worst, rel_err(a, b))
    return worst


def _build(model, mode: str, version: int = 1):
    w = stacked_weights(model)
    if mode == "reference":
        if w.hybrid is not None:
            raise ValueError("the reference decoder does not carry hybrid (Gated DeltaNet) stacks")
        return ReferenceDecoder(w, split_k=version == 2)
    from .gpu import FusedDecoder, MegakernelDecoder

    return (MegakernelDecoder if mode == "megakernel" else FusedDecoder)(w, version=version)


def _split_mode(mode: str):
    """"megakernel_v2" -> ("megakernel", 2); "fused" -> ("fused", None) (version by prefer_v2)."""
    for v in (1, 2):
        if mode.endswith(f"_v{v}"):
            return mode[:-3], v
    return mode, None


def decoder_for(model, mode: Optional[str] = None):
    """The decoder object of `mode` for `model` (None for the plain path). `model` is a CausalLM,
    or a bare DecoderModel that is fed embeddings (the speech talker and code predictor).
    Explicit GPU modes raise MetalgenError where they cannot run; "auto" falls back to plain
    quietly (say why with kernels_metal.set_verbose(True))."""
    mode = mode or "auto"
    _check_mode(mode)
    if mode in ("plain", "compiled"):  # compiled: not a stacked decoder (make_step builds it)
        return None
    backend = K.backend()
    if mode == "auto":
        if backend not in AUTO_MEGAKERNEL:
            if K.verbose() and backend != "cpu":
                print(f"[metalgen.decode] auto: the plain path (no fast path is the default on {backend} yet: "
                      "docs/decode.md)", file=sys.stderr)
            return None
        mode = "megakernel"
        explicit = False
    else:
        explicit = True
    base, pinned = _split_mode(mode)
    if base in ("fused", "megakernel") and backend == "cpu":
        raise MetalgenError(f"the {mode} decode path needs a GPU backend (this is {backend})")
    if base == "megakernel" and backend != "cuda":
        raise MetalgenError("the megakernel decode path runs on the CUDA backend only")
    reason = unsupported_reason(model)
    if reason:
        if explicit:
            raise MetalgenError(f"the {mode} decode path cannot run this model: {reason}")
        if K.verbose():
            print(f"[metalgen.decode] auto: the plain path ({reason})", file=sys.stderr)
        return None
    entry = _entry(model)
    if pinned is not None or base == "reference":
        versions = [pinned or 1]
    else:
        versions = [2, 1] if prefer_v2(model, backend) else [1]
    key = ("decoder", base, tuple(versions))
    if key not in entry:
        entry[key] = None
        for i, version in enumerate(versions):
            try:
                dec = _build(model, base, version)
                if base != "reference":
                    w = dec.w
                    if w.hybrid is None:
                        err, tol = self_check(dec, entry["weights"], head=getattr(model, "logits", None)), CHECK_RTOL
                    else:
                        err = self_check_plain(dec, model)
                        tol = CHECK_RTOL_SPARSE_HYBRID if w.moe.sparse_layers else CHECK_RTOL
                    if not err <= tol:
                        raise RuntimeError(f"self-check failed: relative error {err:.3g} > {tol}")
                entry[key] = dec
                break
            except Exception as e:  # noqa: BLE001 - a fast path that fails is not used
                last = i == len(versions) - 1
                if K.verbose() or explicit:
                    print(f"[metalgen.decode] {base} path version {version} unavailable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200] if str(e) else ''}); using "
                          f"{'the plain path' if last else f'version {versions[i + 1]}'}", file=sys.stderr)
    return entry[key]


def start_state(dec, cache, length: int, max_tokens: int) -> DecodeState:
    """The decoder `dec`'s state after a plain prefill of `length` positions into the per-layer
    `cache`: the cache copied once into the stacked layout, with room for `max_tokens` more
    (rounded up to 256 positions, at most the RoPE table's length)."""
    w = dec.w
    capacity = min(((length + max_tokens + 255) // 256) * 256, w.rope_table.max_positions)
    return dec.prepare(stacked_cache(w, cache, length, capacity))


def takes_compiled(model, mode: Optional[str]) -> bool:
    """Whether `mode` means the compiled path (metalgen.decode.compiled) for `model`: asked for by
    name, or "auto" on a backend in AUTO_COMPILED for a stack the stacked paths do not carry."""
    mode = mode or "auto"
    _check_mode(mode)
    hybrid = getattr(getattr(model, "spec", None), "hybrid", None) is not None
    if mode == "compiled" and not hybrid:
        raise MetalgenError("the compiled decode path runs the hybrid (Gated DeltaNet) decoders only")
    return hybrid and (mode == "compiled" or (mode == "auto" and K.backend() in AUTO_COMPILED))


def make_step(model, cache, length: int, max_tokens: int, mode: Optional[str] = None, in_place: bool = False
              ) -> Optional[Callable[[mx.array], mx.array]]:
    """After the plain prefill has filled `cache` with `length` positions: a function
    `step(token (1,) int32) -> logits (1, vocab)` on the chosen path, or None for the plain path.
    The stacked paths copy the cache once into their layout (capacity for `max_tokens` more); the
    compiled path advances `cache` itself, and is the only one `in_place` (a caller's per-layer cache,
    which must hold the turn afterwards) allows."""
    # a hybrid stack under "auto" takes the megakernel where it runs and checks out, else the compiled path
    dec = None if in_place else decoder_for(model, mode)
    if dec is None and takes_compiled(model, mode):
        from .compiled import CompiledDecoder, layer_steps, supports

        if not supports(cache):
            return None
        entry = _entry(model)
        if "compiled" not in entry:
            entry["compiled"] = layer_steps(model, cache)
        return CompiledDecoder(model, cache, entry["compiled"]).step
    if dec is None:
        return None
    return step_on(model, dec, start_state(dec, cache, length, max_tokens))


def step_on(model, dec, state: DecodeState) -> Callable[[mx.array], mx.array]:
    """The step function of decoder `dec` on `state`: token (1,) int32 -> logits (1, vocab)."""

    def step(token: mx.array) -> mx.array:
        return model.logits(dec.step(state, token))

    step.decoder = dec
    step.state = state
    return step
