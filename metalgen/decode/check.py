"""Checks a decode path against the plain path: both fed the same tokens, logits compared at
every step (used by the tests on the CPU with the reference path, and by
benchmarks/decode_check.py on a GPU with the fused and megakernel paths)."""

from __future__ import annotations

from typing import List

import mlx.core as mx
import numpy as np

from ..cache import make_prompt_cache
from .path import make_step, rel_err


def step_errors(model, mode: str, prompt_tokens: int = 16, steps: int = 32, seed: int = 0) -> List[float]:
    """Per-step relative error ||fast - plain|| / ||plain|| of the logits, teacher-forced with
    the plain path's greedy tokens."""
    vocab = model.spec.vocab_size
    prompt = mx.array(np.random.default_rng(seed).integers(0, vocab, prompt_tokens), mx.int32)
    plain_cache = make_prompt_cache(model)
    fast_cache = make_prompt_cache(model)
    logits = model.logits(model.hidden(prompt[None], cache=plain_cache)[:, -1, :])
    model.hidden(prompt[None], cache=fast_cache)
    mx.eval(logits, [c.state for c in plain_cache], [c.state for c in fast_cache])
    fast = make_step(model, fast_cache, prompt_tokens, steps, mode)
    if fast is None:
        raise RuntimeError(f"decode path {mode} is not available here")
    errs = []
    for _ in range(steps):
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        logits = model.logits(model.hidden(tok[None], cache=plain_cache)[:, -1, :])
        got = fast(tok)
        errs.append(rel_err(got, logits))
    return errs


def step_errors_vs_float32(model, mode: str, prompt_tokens: int = 16, steps: int = 32, seed: int = 0):
    """The bf16 noise floor next to a decode path's error, teacher-forced with the plain bf16
    path's greedy tokens: per-step relative logit errors (fast vs plain, fast vs float32, plain vs
    float32), where float32 is the plain path on the same weights upcast (a second copy of the
    model is built). A fast path that rounds in other places than plain differs from it by about
    the noise floor, so "no further from float32 than plain" is the fair check where plain's own
    bf16 error is large (qwen3-4b: 4.6%, docs/decode.md)."""
    import copy

    from mlx.utils import tree_map

    model32 = copy.deepcopy(model)
    model32.update(tree_map(lambda a: a.astype(mx.float32), model.parameters()))
    vocab = model.spec.vocab_size
    prompt = mx.array(np.random.default_rng(seed).integers(0, vocab, prompt_tokens), mx.int32)
    c16, c32, cf = make_prompt_cache(model), make_prompt_cache(model32), make_prompt_cache(model)
    logits = model.logits(model.hidden(prompt[None], cache=c16)[:, -1, :])
    model32.hidden(prompt[None], cache=c32)
    model.hidden(prompt[None], cache=cf)
    mx.eval(logits, [c.state for c in c16], [c.state for c in c32], [c.state for c in cf])
    fast = make_step(model, cf, prompt_tokens, steps, mode)
    if fast is None:
        raise RuntimeError(f"decode path {mode} is not available here")
    vs_plain, fast32, plain32 = [], [], []
    for _ in range(steps):
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        logits = model.logits(model.hidden(tok[None], cache=c16)[:, -1, :])
        truth = model32.logits(model32.hidden(tok[None], cache=c32)[:, -1, :])
        got = fast(tok)
        vs_plain.append(rel_err(got, logits))
        fast32.append(rel_err(got, truth))
        plain32.append(rel_err(logits, truth))
    return vs_plain, fast32, plain32
