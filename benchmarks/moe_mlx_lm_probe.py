"""mlx-lm on a Qwen3-30B-A3B shape with random weights: the baseline the MoE issue measures against,
and where its time goes (GPU machine, mlx-lm installed).

    python3 benchmarks/moe_mlx_lm_probe.py [--bits 0,4] [--layers 48] [--out DIR]

Prints decode tok/s (prompt 128), prefill tok/s at 128 and 2048 tokens, and for one sparse layer at
T tokens: the whole MoE block, its three gathered expert products (mx.gather_mm / gather_qmm, the
sorted grouped GEMM mlx-lm uses) and, for scale, the same products as one dense batched matmul with
T*k/E rows per expert (what a perfectly balanced grouped GEMM would cost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import mlx.core as mx
import mlx.nn as nn

CONFIG = dict(
    model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=768, rms_norm_eps=1e-6,
    vocab_size=151936, rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=40960,
    norm_topk_prob=True,
)


def fill_random(model, seed=0, dtype=mx.bfloat16):
    """N(0, 0.02) weights (ones for norms), made and evaluated one layer at a time."""
    from mlx.utils import tree_flatten, tree_unflatten

    key = mx.random.key(seed)
    groups = [model.model.embed_tokens] + list(model.model.layers) + [model.model.norm]
    if hasattr(model, "lm_head"):
        groups.append(model.lm_head)
    for i, mod in enumerate(groups):
        params = tree_flatten(mod.parameters())
        new = []
        for j, (name, p) in enumerate(params):
            k = mx.random.fold_in(key, i * 1000 + j) if hasattr(mx.random, "fold_in") else mx.random.key(i * 1000 + j)
            if name.endswith("norm.weight"):
                new.append((name, mx.ones(p.shape, dtype)))
            else:
                new.append((name, (0.02 * mx.random.normal(p.shape, key=k)).astype(dtype)))
        mod.update(tree_unflatten(new))
        mx.eval(mod.parameters())


def timed(fn, runs=3):
    fn()
    ts = []
    for _ in range(runs):
        mx.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def decode_rate(model, prompt_len=128, n=256):
    from mlx_lm.generate import generate_step

    prompt = mx.array(list(range(1, prompt_len + 1)), mx.int32)
    res = []
    for run in range(3):
        mx.synchronize()
        t0 = time.perf_counter()
        it = generate_step(prompt, model, max_tokens=n, prefill_step_size=2048)
        next(it)
        t1 = time.perf_counter()
        k = sum(1 for _ in it)
        t2 = time.perf_counter()
        if run:
            res.append((t1 - t0, k / (t2 - t1)))
    return statistics.median(r[0] for r in res), statistics.median(r[1] for r in res)


def prefill_rate(model, T):
    from mlx_lm.models.cache import make_prompt_cache

    prompt = mx.array([(7 * i) % min(150000, CONFIG["vocab_size"]) for i in range(T)], mx.int32)[None]

    def run():
        cache = make_prompt_cache(model)
        out = model(prompt, cache=cache)
        mx.eval(out, [c.state for c in cache])

    return T / timed(run)


def layer_probe(model, T, log):
    cfg = CONFIG
    mlp = model.model.layers[0].mlp
    H, E, k, I = cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    dt = mlp.gate.weight.dtype if not hasattr(mlp.gate, 'scales') else mlp.gate.scales.dtype
    x = (mx.random.normal((1, T, H)) * 0.5).astype(dt)
    mx.eval(x)
    t_block = timed(lambda: mx.eval(mlp(x)), runs=5)
    gates = mx.softmax(mlp.gate(x), axis=-1, precise=True)
    inds = mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]
    mx.eval(inds)
    t_switch = timed(lambda: mx.eval(mlp.switch_mlp(x, inds)), runs=5)
    quant = hasattr(mlp.switch_mlp.gate_proj, "scales")
    row = dict(T=T, block_ms=t_block * 1e3, switch_ms=t_switch * 1e3, quantized=quant)
    if not quant:
        r = max(1, T * k // E)
        a = (mx.random.normal((E, r, H)) * 0.5).astype(dt)
        wg = mlp.switch_mlp.gate_proj.weight
        wd = mlp.switch_mlp.down_proj.weight
        b = (mx.random.normal((E, r, I)) * 0.5).astype(dt)
        mx.eval(a, b)

        def dense():
            g = a @ wg.swapaxes(-1, -2)
            u = a @ mlp.switch_mlp.up_proj.weight.swapaxes(-1, -2)
            d = b @ wd.swapaxes(-1, -2)
            mx.eval(g, u, d)

        row["dense_batched_ms"] = timed(dense, runs=5) * 1e3
        flops = 2 * 3 * T * k * I * H
        row["switch_tflops"] = flops / t_switch / 1e12
        row["dense_tflops"] = flops / (row["dense_batched_ms"] / 1e3) / 1e12
    log(json.dumps(row))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", default="0,4")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--float32", action="store_true", help="float32 weights (MLX's CPU gather_mm needs them)")
    args = ap.parse_args()
    from mlx_lm.models import qwen3_moe

    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    cfg = dict(CONFIG, num_hidden_layers=args.layers)
    log(f"mlx {mx.__version__} device {mx.default_device()} config {json.dumps(cfg)}")
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(cfg))
    t0 = time.perf_counter()
    fill_random(model, dtype=mx.float32 if args.float32 else mx.bfloat16)
    log(f"random weights in {time.perf_counter() - t0:.1f} s, active memory {mx.get_active_memory() / 1e9:.1f} GB")
    for bits in [int(b) for b in args.bits.split(",")]:
        if bits:
            def pred(path, module):
                if path.endswith("mlp.gate"):
                    return {"group_size": 64, "bits": 8}
                return hasattr(module, "to_quantized")

            nn.quantize(model, 64, bits, class_predicate=pred)
            mx.eval(model.parameters())
            mx.clear_cache()
            log(f"quantized to {bits} bits, active memory {mx.get_active_memory() / 1e9:.1f} GB")
        tag = f"bits={bits or 16}"
        mx.reset_peak_memory()
        ttft, rate = decode_rate(model)
        log(f"{tag} decode: ttft {ttft * 1e3:.1f} ms (prompt 128), {rate:.1f} tok/s, peak {mx.get_peak_memory() / 1e9:.1f} GB")
        for T in (128, 2048):
            log(f"{tag} prefill T={T}: {prefill_rate(model, T):.0f} tok/s")
        for T in (1, 128, 2048):
            layer_probe(model, T, log)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "moe_mlx_lm_probe.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
