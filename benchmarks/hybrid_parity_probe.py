"""Where the hybrid stacks' GPU forward parts from the CPU one: the parity cases of
tests/test_models_hybrid.py, logits against transformers on both devices, then each layer (and each
step of the Gated DeltaNet layers) run on the GPU and the CPU from the same CPU input.

    PYTHONPATH=.:tests python3 benchmarks/hybrid_parity_probe.py          # TF32 on, MLX's default
    MLX_ENABLE_TF32=0 PYTHONPATH=.:tests python3 benchmarks/hybrid_parity_probe.py
"""

from __future__ import annotations

import os
import sys

# Pin MLX's own default before the test helpers load: tests/conftest.py (imported through
# test_models_hybrid) sets MLX_ENABLE_TF32=0 when it is unset, which would hide the TF32 case.
os.environ.setdefault("MLX_ENABLE_TF32", "1")
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

import kernels_metal
from metalgen.cache import make_prompt_cache
from metalgen.loading import load_model, read_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hf_checkpoints import rel_err, save_tiny_hf_model  # noqa: E402
from test_models_hybrid import CASES, PROMPT_LEN  # noqa: E402

_GPU_BACKEND = kernels_metal.backend


def on(device: str) -> None:
    """Run what follows on `device` ('cpu' or 'gpu'), kernels dispatched as that backend would."""
    kernels_metal.backend = (lambda: "cpu") if device == "cpu" else _GPU_BACKEND
    # (a dry run on a machine without a GPU compares the CPU with itself)
    mx.set_default_device(mx.cpu if device == "cpu" or _GPU_BACKEND() == "cpu" else mx.gpu)


def both(fn):
    """fn() on the CPU and on the GPU, as numpy (a tuple result compared part by part)."""
    out = {}
    for dev in ("cpu", "gpu"):
        on(dev)
        r = fn()
        r = r if isinstance(r, tuple) else (r,)
        out[dev] = [np.array(t.astype(mx.float32)) for t in r]
    on("cpu")
    return [rel_err(g, c) for g, c in zip(out["gpu"], out["cpu"])]


def _delta_inputs_run(gdn, xn):
    """The gated delta rule alone, on the CPU's inputs to it: (out, state)."""
    on_dev = mx.default_device()
    on("cpu")
    s = gdn.spec
    B, L, _ = xn.shape
    mixed, z, b, a = gdn._project(xn)
    mixed = gdn._conv(mixed, None)
    q = mixed[..., :s.key_dim].reshape(B, L, s.num_key_heads, s.key_head_dim)
    k = mixed[..., s.key_dim:2 * s.key_dim].reshape(B, L, s.num_key_heads, s.key_head_dim)
    v = mixed[..., 2 * s.key_dim:].reshape(B, L, s.num_value_heads, s.value_head_dim)
    beta = mx.sigmoid(b.astype(mx.float32))
    g = -mx.exp(gdn.A_log) * mx.logaddexp(a + gdn.dt_bias, 0.0)
    mx.eval(q, k, v, g, beta)
    on("cpu" if on_dev == mx.cpu else "gpu")
    return kernels_metal.gated_delta(q, k, v, g, beta, None)


def probe(name: str, model_type: str, overrides: dict, folder: Path) -> None:
    import torch

    hf = save_tiny_hf_model(folder, model_type, **overrides)
    ours = load_model(folder, read_config(folder))
    ids = np.random.default_rng(1).integers(0, 512, PROMPT_LEN)
    with torch.no_grad():
        ref = hf(torch.tensor(ids[None])).logits[0].numpy()
    got = {}
    for dev in ("cpu", "gpu"):
        on(dev)
        got[dev] = np.array(ours(mx.array(ids[None]), cache=make_prompt_cache(ours))[0])
    on("cpu")
    print(f"{name}: cpu-vs-hf {rel_err(got['cpu'], ref):.2e}  gpu-vs-hf {rel_err(got['gpu'], ref):.2e}  "
          f"gpu-vs-cpu {rel_err(got['gpu'], got['cpu']):.2e}")

    # each layer from the CPU stack's input to it
    dec = ours.model
    h = dec.embed_tokens(mx.array(ids[None]))
    mask = "causal"
    for i, layer in enumerate(dec.layers):
        x = h

        def run(layer=layer, x=x, i=i):
            return layer(x, mask, ours.make_cache()[i])

        errs = both(run)
        line = f"  layer {i} ({'linear' if 'linear_attn' in layer else 'full'}): {errs[0]:.2e}"
        if "linear_attn" in layer:
            gdn = layer.linear_attn
            xn = layer.input_layernorm(x)
            line += f" | mixer {both(lambda: gdn(xn, mask, ours.make_cache()[i]))[0]:.2e}"
            line += " project " + " ".join(f"{e:.1e}" for e in both(lambda: gdn._project(xn)))
            mixed, z, b, a = gdn._project(xn)
            line += f" conv {both(lambda: gdn._conv(mixed, None))[0]:.1e}"
            line += " delta " + " ".join(f"{e:.1e}" for e in both(lambda: _delta_inputs_run(gdn, xn)))
        else:
            xn = layer.input_layernorm(x)
            line += f" | mixer {both(lambda: layer.self_attn(xn, mask, ours.make_cache()[i]))[0]:.2e}"
        hm = x + (layer.linear_attn if "linear_attn" in layer else layer.self_attn)(
            layer.input_layernorm(x), mask, ours.make_cache()[i])
        line += f" mlp {both(lambda: layer.mlp(layer.post_attention_layernorm(hm)))[0]:.2e}"
        print(line)
        h = layer(x, mask, ours.make_cache()[i])
        mx.eval(h)


def main() -> None:
    print(f"MLX_ENABLE_TF32={os.environ.get('MLX_ENABLE_TF32', '(unset)')} backend={_GPU_BACKEND()}")
    on("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model_type, overrides) in sorted(CASES.items()):
            probe(name, model_type, overrides, Path(tmp) / name)


if __name__ == "__main__":
    main()
