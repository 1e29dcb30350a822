"""Kernels that MLX compiles the first time it meets them, compiled before the server takes requests.

MLX's CUDA backend compiles its Hopper quantized matmul the first time it meets each class of rows (at most
16, 32, 64, 128, or more), 27-45 s each on a machine that has not compiled it before (H200, 2026-11-26,
docs/kernels.md): a server that met a class mid-traffic held every request of the batch that long (43 s to
the first token of the first request on qwen3-8b-4bit; warmed up, 93.5 s before the server started, then 112
ms). The compiled kernels stay in MLX's cache on disk for later starts. Decode steps and prompt chunks reach
every class (a batch of B rows is B rows; a chunk of a prompt is as many rows as tokens), so all are built.

A batched server's first step above kernels_metal.GEMV_MAX_ROWS rows runs the traced layer halves
(metalgen.batch_step) for the first time, and MLX compiles their fused kernels then: 2.1 s a step for
qwen3-0.6b and 6.1 s for qwen3.5-0.8b (H200, 2026-11-26, benchmarks/batch_step_probe.py's first arrivals),
against 0.03-0.3 s once built, and again for each batch size the traced step has not met: a step of 31 rows
took 2.9 s mid-traffic (qwen3-0.6b, a fresh H200, 2026-11-26). The step runs its rows
padded to a multiple of metalgen.batch_step.ROW_BUCKET, so `warm_batch` runs a batch that grows through each
of those sizes up to the server's --max-batch before the server starts.
"""

from __future__ import annotations

import time
from typing import Callable, List, Tuple

import mlx.core as mx

import kernels_metal as K

from ..models.layers import QuantizedLinear

ROW_CLASSES = (16, 32, 64, 128, 256)  # one row count in each class MLX builds a kernel for


def _on_cuda() -> bool:
    return K.backend() == "cuda"


def quantized_products(model) -> List[Tuple[QuantizedLinear, int]]:
    """(layer, rows) for one layer of each quantization format (bits, group size, scale dtype) in `model`,
    at one row count of each class."""
    seen, layers = set(), []
    for _, m in model.named_modules():
        if isinstance(m, QuantizedLinear):
            key = (m.bits, m.group_size, m["scales"].dtype)
            if key not in seen:
                seen.add(key)
                layers.append(m)
    return [(layer, rows) for layer in layers for rows in ROW_CLASSES]


def warm_up(model, say: Callable[[str], None] = lambda _: None) -> int:
    """On CUDA, run each of `quantized_products(model)` once on zeros, so that MLX compiles its kernels now;
    `say` gets a line before (what is happening and why it may take minutes) and after (how long it took).
    Returns the products run (0 elsewhere, or without quantized layers)."""
    products = quantized_products(model) if _on_cuda() else []
    if not products:
        return 0
    say(f"preparing the quantized matmul kernels ({len(products)} products; minutes the first time MLX "
        "compiles them on this machine, then cached)")
    t0 = time.perf_counter()
    for layer, rows in products:
        in_features = layer["weight"].shape[1] * 32 // layer.bits
        x = mx.zeros((rows, in_features), dtype=layer["scales"].dtype)
        mx.eval(layer(x))
    say(f"kernels ready in {time.perf_counter() - t0:.1f} s")
    return len(products)


def warm_batch(model, max_batch: int, say: Callable[[str], None] = lambda _: None) -> int:
    """On CUDA, for a server that batches past kernels_metal.GEMV_MAX_ROWS rows: build the traced step's
    kernels and the batch's own (paged attention, the row sampler) now, for every padded batch size up to
    `max_batch` (metalgen.batch_step.ROW_BUCKET apart). Prompts of 4 tokens join 8 at a time (a prefill
    group), so the batch grows through each size, then generates 3 more tokens. `say` as warm_up's.
    Returns the most rows run (0 when nothing was to do)."""
    from ..batch import BatchGenerator
    from ..batch_step import ROW_BUCKET

    least = K.GEMV_MAX_ROWS + 1
    if not _on_cuda() or max_batch < least:
        return 0
    gen = BatchGenerator(model, max_batch=max_batch, prefill_batch=ROW_BUCKET)
    say(f"preparing the batched step's kernels ({least} to {max_batch} rows)")
    t0 = time.perf_counter()
    joins = -(-max_batch // ROW_BUCKET)  # steps until the last group is in: every row must still be running then
    for i in range(max_batch):
        gen.insert([1 + i, 2, 3, 4], joins + 3)
    while gen.busy:
        gen.step()
    say(f"batched step ready in {time.perf_counter() - t0:.1f} s")
    return max_batch
