"""The bf16 noise floor next to the megakernel's error: teacher-forced (plain bf16 greedy tokens),
logits of plain bf16, plain float32 (same weights upcast) and the chosen decode path, per step
(metalgen.decode.check.step_errors_vs_float32).

    PYTHONPATH=. python benchmarks/decode_noise.py shape [steps] [mode]
"""
import sys

import numpy as np

from metalgen.api import load
from metalgen.decode.check import step_errors_vs_float32

shape = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 256
mode = sys.argv[3] if len(sys.argv) > 3 else "megakernel"
m, _ = load(f"dummy:{shape}")
vs_plain, ef, e16 = step_errors_vs_float32(m, mode, prompt_tokens=128, steps=steps)
print(f"NOISE {shape} {steps} steps: plain bf16 vs fp32 max {max(e16):.4f} mean {np.mean(e16):.4f}; "
      f"{mode} vs fp32 max {max(ef):.4f} mean {np.mean(ef):.4f}; {mode} vs plain bf16 max {max(vs_plain):.4f}"
      f" mean {np.mean(vs_plain):.4f}", flush=True)
