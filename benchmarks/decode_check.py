"""Issue 5 on a GPU: check the fused and megakernel decode paths against the plain path (256
teacher-forced steps, logits within 2e-2 relative at every step), then benchmark against mlx-lm.

    PYTHONPATH=. python benchmarks/decode_check.py [shape ...]   # logs under $OUT (or /tmp)

DECODE_MODES=megakernel (default megakernel,fused) checks and benches only those paths;
DECODE_LONG=0 skips the prompt-2048 bench (to fit a short lease).
"""

import json
import os
import sys
import time
import traceback

import mlx.core as mx

from metalgen.api import load
from metalgen.bench import add_comparison, decode_path_name, mlx_lm_bench, run_bench
from metalgen.cli.bench import format_table
from metalgen.decode.check import step_errors
from metalgen.decode.gpu import grid_blocks

OUT = os.environ.get("OUT", "/tmp")
SHAPES = sys.argv[1:] or ["qwen2.5-0.5b", "qwen3-0.6b", "qwen3-4b"]
MODES = os.environ.get("DECODE_MODES", "megakernel,fused").split(",")
LONG = os.environ.get("DECODE_LONG", "1") != "0"


def log(*a):
    print(*a, flush=True)


def main():
    import kernels_metal

    kernels_metal.set_verbose(True)
    log("device", mx.device_info(), "backend", kernels_metal.backend(), "blocks", grid_blocks())
    summary = []
    for shape in SHAPES:
        rec = {"shape": shape}
        tic = time.time()
        model, _ = load(f"dummy:{shape}")
        mx.eval(model.parameters())
        log(f"== {shape} loaded in {time.time() - tic:.1f}s")
        for mode in MODES:
            try:
                tic = time.time()
                log(mode, "path:", decode_path_name(model, mode), f"({time.time() - tic:.1f}s)")
                errs = step_errors(model, mode, prompt_tokens=128, steps=256)
                rec[f"{mode}_max_err"] = max(errs)
                rec[f"{mode}_errs"] = errs
                log(f"{mode}: max rel logit err over 256 steps {max(errs):.4g} (first {errs[0]:.3g}, "
                    f"last {errs[-1]:.3g}) in {time.time() - tic:.1f}s")
            except Exception:
                log(traceback.format_exc())
        for decode, compare, prompt, gen, runs, prof in (
                ("megakernel", "mlx-lm", 128, 256, 3, True),
                ("fused", None, 128, 256, 1, False),
                ("megakernel", "mlx-lm", 2048, 8, 2, False)):
            if decode not in MODES or (prompt > 128 and not LONG):
                continue
            try:
                rep = run_bench(model, prompt_tokens=prompt, gen_tokens=gen, runs=runs, decode=decode, profile=prof)
                if compare == "mlx-lm":  # in its own process, on its own weights
                    add_comparison(rep, mlx_lm_bench(f"dummy:{shape}", prompt_tokens=prompt, gen_tokens=gen,
                                                     runs=runs))
                rep["model"] = f"dummy:{shape}"
                rec[f"bench_{decode}_{prompt}"] = rep
                log(format_table(rep))
            except Exception:
                log(traceback.format_exc())
        summary.append(rec)
        with open(os.path.join(OUT, f"decode_check_{'_'.join(SHAPES)}.json"), "w") as f:
            json.dump(summary, f, indent=1)
        del model
        mx.clear_cache()
    log("\n==== summary (decode tok/s, prompt 128, gen 256, bf16, batch 1)")
    log(f"{'shape':<14}{'ours':>8}{'mlx-lm':>8}{'ratio':>7}{'%floor':>8}{'fused':>8}{'mk err':>9}"
        f"{'fu err':>9}{'pf ours':>9}{'pf mlx':>9}{'ops':>11}")
    for r in summary:
        b = r.get("bench_megakernel_128", {})
        res = {x["engine"]: x for x in b.get("results", [])}
        f = {x["engine"]: x for x in r.get("bench_fused_128", {}).get("results", [])}
        p = {x["engine"]: x for x in r.get("bench_megakernel_2048", {}).get("results", [])}
        ours = res.get("metalgen", {}).get("decode_tps", 0)
        lm = res.get("mlx-lm", {}).get("decode_tps", 0)
        fl = b.get("floor_decode_tps", 1)
        prof = b.get("profile", {})
        ops = "/".join(str(v["ops_per_token"]) for v in prof.values())
        log(f"{r['shape']:<14}{ours:>8.0f}{lm:>8.0f}{ours / max(lm, 1e-9):>7.2f}{100 * ours / fl:>7.1f}%"
            f"{f.get('metalgen', {}).get('decode_tps', 0):>8.0f}{r.get('megakernel_max_err', -1):>9.3g}"
            f"{r.get('fused_max_err', -1):>9.3g}{p.get('metalgen', {}).get('prefill_tps', 0):>9.0f}"
            f"{p.get('mlx-lm', {}).get('prefill_tps', 0):>9.0f}{ops:>11}")


if __name__ == "__main__":
    main()
