"""Why the hybrid megakernel does or does not take a model: its stacking verdict, the kernel's start-up
self-check error against the plain path, and per-step errors of a short teacher-forced run.
Usage (GPU machine, repo root): PYTHONPATH=. python3 benchmarks/hybrid_mega_check.py SHAPE[@N] ...
(SHAPE@N: the dummy shape, -4bit / -8bit included, cut to its first N layers; such a model also gets the
float32 noise floor beside its errors)"""

import sys
import traceback

import mlx.core as mx

from metalgen.api import load
from metalgen.decode.check import step_errors, step_errors_vs_float32
from metalgen.decode.gpu import MegakernelDecoder
from metalgen.decode.path import self_check_plain, stacked_weights
from metalgen.decode.stacked import unsupported_reason
from metalgen.dummy import SHAPES, parse_shape

for shape in sys.argv[1:]:
    name, _, layers = shape.partition("@")
    if layers:
        base, bits = parse_shape(name)
        SHAPES[f"{base}-cut{layers}"] = SHAPES[base] | {"num_hidden_layers": int(layers)}
        name = f"{base}-cut{layers}" + (f"-{bits}bit" if bits else "")
    model = load(f"dummy:{name}")[0]
    print(f"{shape}: unsupported_reason = {unsupported_reason(model)}", flush=True)
    try:
        dec = MegakernelDecoder(stacked_weights(model))
        print(f"  kernel {dec.kernel_name}, template {dict(dec.template)}", flush=True)
        for steps in (3, 8):
            print(f"  self-check over {steps} steps: {self_check_plain(dec, model, steps=steps):.4f}", flush=True)
        if layers:  # a cut model is small enough for a float32 copy: the bf16 noise floor beside the errors
            vs_plain, fast32, plain32 = step_errors_vs_float32(model, "megakernel", prompt_tokens=16, steps=24)
            for what, e in (("fast vs plain", vs_plain), ("fast vs f32", fast32), ("plain vs f32", plain32)):
                print(f"  {what:14s}" + " ".join(f"{x:.3f}" for x in e), flush=True)
        else:
            errs = step_errors(model, "megakernel", prompt_tokens=16, steps=16)
            print("  teacher-forced vs plain: " + " ".join(f"{e:.3f}" for e in errs), flush=True)
    except Exception:  # noqa: BLE001 - a diagnosis prints what failed
        traceback.print_exc()
    del model
    mx.clear_cache()
