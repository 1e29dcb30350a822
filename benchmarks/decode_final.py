"""One shape, one process (benchmarks/decode_final.sh runs it under a timeout, so that a kernel that
hangs costs only its own configuration): the 256-step check against plain (max relative logit
error) of the megakernel versions 1 and 2, then decode tok/s of v1, v2, plain and mlx-lm on the same
weights (prompt 128, 256 tokens, 3 runs each) and % of the weight-bandwidth floor.

    PYTHONPATH=. python3 benchmarks/decode_final.py SHAPE [modes]   # modes: megakernel_v1,megakernel_v2
Writes $OUT/decode_final_SHAPE.json; prints one 'ROW ...' line for the table.
"""
import json
import os
import sys
import time
import traceback

import mlx.core as mx

from metalgen.api import load
from metalgen.bench import copy_bandwidth, metalgen_steps, mlx_lm_bench, time_generation, weight_bytes
from metalgen.decode.check import step_errors
from metalgen.decode.gpu import grid_blocks
from metalgen.decode.path import decoder_for

OUT = os.environ.get("OUT", "/tmp")
SHAPE = sys.argv[1]
MODES = (sys.argv[2] if len(sys.argv) > 2 else "megakernel_v1,megakernel_v2").split(",")
STEPS = int(os.environ.get("FINAL_STEPS", "256"))
if os.environ.get("FINAL_BLOCKS"):  # sweep the megakernel's grid (the engine reads no environment)
    import metalgen.decode.gpu as _gpu

    _gpu.GRID_BLOCKS = int(os.environ["FINAL_BLOCKS"])


def log(*a):
    print(*a, flush=True)


def save(rec):
    with open(os.path.join(OUT, f"decode_final_{rec['shape']}.json"), "w") as f:
        json.dump(rec, f, indent=1)


def check(model, rec, mode):
    try:
        tic = time.time()
        if decoder_for(model, mode) is None:
            raise RuntimeError(f"{mode} unavailable")
        errs = step_errors(model, mode, prompt_tokens=128, steps=STEPS)
        rec[f"{mode}_err"] = max(errs)
        rec[f"{mode}_errs"] = errs
        log(f"{SHAPE} {mode}: max rel logit err over {STEPS} steps {max(errs):.4g} (first {errs[0]:.3g}, "
            f"last {errs[-1]:.3g}) {time.time() - tic:.1f}s")
    except Exception:
        log(traceback.format_exc())
    save(rec)


def bench(rec, name, steps, prompt):
    try:
        _, rate, _ = time_generation(steps, prompt, 256, 3)
        rec[f"{name}_tps"] = rate
        log(f"{SHAPE} {name}: {rate:.1f} tok/s")
    except Exception:
        log(traceback.format_exc())
    save(rec)


def main():
    import kernels_metal
    import numpy as np

    kernels_metal.set_verbose(True)
    log("device", mx.device_info().get("device_name"), "blocks", grid_blocks())
    model, _ = load(f"dummy:{SHAPE}")
    mx.eval(model.parameters())
    rec = {"shape": SHAPE, "blocks": grid_blocks()}
    nbytes = weight_bytes(model)
    bw = copy_bandwidth()
    rec["weight_gb"], rec["copy_gbs"], rec["floor_tps"] = nbytes / 1e9, bw / 1e9, bw / nbytes
    prompt = mx.array(np.random.default_rng(0).integers(0, min(model.spec.vocab_size, 150000), 128), mx.int32)
    # version 1, plain and mlx-lm first: a version 2 that hangs (timeout) leaves their numbers saved
    if "megakernel_v1" in MODES:
        check(model, rec, "megakernel_v1")
        if "megakernel_v1_err" in rec:
            bench(rec, "megakernel_v1", metalgen_steps(model, "megakernel_v1"), prompt)
    if len(MODES) > 1:
        bench(rec, "plain", metalgen_steps(model, "plain"), prompt)
        # mlx-lm in its own process, on its own weights (the same seeded prompt)
        rec["mlx-lm_tps"] = mlx_lm_bench(f"dummy:{SHAPE}", prompt_tokens=128, gen_tokens=256, runs=3).decode_tps
        log(f"{SHAPE} mlx-lm: {rec['mlx-lm_tps']:.1f} tok/s")
    if "megakernel_v2" in MODES:
        check(model, rec, "megakernel_v2")
        if "megakernel_v2_err" in rec:
            bench(rec, "megakernel_v2", metalgen_steps(model, "megakernel_v2"), prompt)
    log(row(rec))


def row(rec):
    g = rec.get
    lm = g("mlx-lm_tps", 0) or 1e-9
    fl = g("floor_tps", 0) or 1e-9
    cells = []
    for m in ("megakernel_v1", "megakernel_v2"):
        t = g(f"{m}_tps", 0)
        cells.append(f"{g(f'{m}_err', -1):7.4f} {t:7.1f} {t / lm:5.2f}x {100 * t / fl:5.1f}%")
    return (f"{g('shape'):<13} {g('blocks'):>4} | " + " | ".join(cells)
            + f" | {g('plain_tps', 0):6.1f} | {g('mlx-lm_tps', 0):6.1f} | {fl:6.0f}")


def table():
    print(f"{'shape':<13} {'grp':>4} | {'v1 err':>7} {'tok/s':>7} {'xlm':>6} {'%fl':>6} | {'v2 err':>7} "
          f"{'tok/s':>7} {'xlm':>6} {'%fl':>6} | {'plain':>6} | {'mlx-lm':>6} | {'floor':>6}")
    for name in sorted(os.listdir(OUT)):
        if name.startswith("decode_final_") and name.endswith(".json"):
            print(row(json.load(open(os.path.join(OUT, name)))))


if __name__ == "__main__":
    table() if SHAPE == "--table" else main()
