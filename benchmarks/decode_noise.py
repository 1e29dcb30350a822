"""The bf16 noise floor next to the megakernel's error: teacher-forced (plain bf16 greedy tokens),
logits of plain bf16, plain float32 (same weights upcast) and the chosen decode path, per step.

    PYTHONPATH=. python benchmarks/decode_noise.py shape [steps] [mode]
"""
import sys

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

from metalgen.api import load
from metalgen.cache import make_prompt_cache
from metalgen.decode.path import make_step, rel_err

shape = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 256
mode = sys.argv[3] if len(sys.argv) > 3 else "megakernel"
m, _ = load(f"dummy:{shape}")
m32, _ = load(f"dummy:{shape}")
m32.update(tree_map(lambda a: a.astype(mx.float32), m.parameters()))
mx.eval(m.parameters(), m32.parameters())
prompt = mx.array(np.random.default_rng(0).integers(0, m.spec.vocab_size, 128), mx.int32)
c16, c32, cf = make_prompt_cache(m), make_prompt_cache(m32), make_prompt_cache(m)
lg = m.logits(m.hidden(prompt[None], cache=c16)[:, -1, :])
m32.hidden(prompt[None], cache=c32)
m.hidden(prompt[None], cache=cf)
mx.eval(lg, [c.state for c in c16], [c.state for c in c32], [c.state for c in cf])
fast = make_step(m, cf, 128, steps, mode) if mode != "none" else None
e16, ef, efb = [], [], []
for _ in range(steps):
    tok = mx.argmax(lg, axis=-1).astype(mx.int32)
    lg = m.logits(m.hidden(tok[None], cache=c16)[:, -1, :])
    l32 = m32.logits(m32.hidden(tok[None], cache=c32)[:, -1, :])
    e16.append(rel_err(lg.astype(mx.float32), l32))
    if fast is not None:
        got = fast(tok)
        ef.append(rel_err(got.astype(mx.float32), l32))
        efb.append(rel_err(got, lg))
print(f"NOISE {shape} {steps} steps: plain bf16 vs fp32 max {max(e16):.4f} mean {np.mean(e16):.4f}"
      + (f"; {mode} vs fp32 max {max(ef):.4f} mean {np.mean(ef):.4f}; {mode} vs plain bf16 max {max(efb):.4f}"
         f" mean {np.mean(efb):.4f}" if ef else ""), flush=True)
