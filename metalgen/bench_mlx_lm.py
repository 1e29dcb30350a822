"""mlx-lm's side of `metalgen bench --compare mlx-lm`, run in a process of its own.

mlx-lm holds its own weights here, not views of metalgen's arrays: a model folder or hub id is read by
`mlx_lm.load`; a `dummy:<shape>` is built from mlx-lm's own model class for the shape's config and
filled with the same seeded values metalgen's dummy gets (quantized as `mlx_lm.convert` would, for a
-4bit / -8bit shape). Its own process means its memory is its own too: the parent lets go of its model
first, so a 61 GB model is never held twice.

    python -m metalgen.bench_mlx_lm MODEL PROMPT_TOKENS GEN_TOKENS RUNS SEED [DTYPE|-] [SAMPLING_JSON]

prints one JSON object: the BenchResult fields. SAMPLING_JSON holds the sampling settings of
`metalgen bench` (bench.SAMPLING_DEFAULTS' keys), given to mlx-lm's own sampler and logits processors.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys


def _as_published(config: dict) -> dict:
    """The config as the published checkpoints spell it, which mlx-lm reads: Qwen3-Next's configs
    carry `rope_theta` and `partial_rotary_factor` at the top level, where transformers 5 (and the
    dummy shapes) nest them in `rope_parameters`."""
    rope = config.get("rope_parameters") or {}
    if config["model_type"] == "qwen3_next":
        config = dict(config)
        for key in ("rope_theta", "partial_rotary_factor"):
            config.setdefault(key, rope.get(key))
    return config


def vocab_size(args) -> int:
    """The vocabulary of an mlx-lm ModelArgs: Qwen3.5's wrapper keeps it in `text_config`."""
    if hasattr(args, "vocab_size"):
        return args.vocab_size
    return args.text_config["vocab_size"]


def build_model(source: str, dtype=None):
    """mlx-lm's model for `source` (folder, hub id or dummy:<shape>), with its own weights."""
    import mlx.core as mx

    if not source.startswith("dummy:"):
        from mlx_lm import load

        model, _ = load(source)
        if dtype is not None:
            from mlx.utils import tree_map

            model.update(tree_map(lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                                  model.parameters()))
        return model
    from .dummy import dummy_config, quantize_like_mlx_lm, random_weight_dict

    config = _as_published(dummy_config(source[len("dummy:"):]))
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    if "quantization" in config:
        quantize_like_mlx_lm(model, config)
    weights = random_weight_dict(model, dtype=dtype or mx.bfloat16)
    model.load_weights(list(weights.items()), strict=True)
    del weights
    # made a layer at a time: the float32 draws behind each layer are freed before the next one's
    for layer in model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    model.eval()
    return model


def mlx_lm_sampling(settings: dict):
    """mlx-lm's own sampler and logits processors for `metalgen bench`'s sampling settings (None, None:
    its greedy default). mlx-lm applies top-p and min-p only strictly inside (0, 1), as we do."""
    if not settings:
        return None, None
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    sampler = make_sampler(temp=settings["temperature"], top_p=settings["top_p"], min_p=settings["min_p"],
                           top_k=settings["top_k"])
    penalty = settings["repetition_penalty"]
    return sampler, make_logits_processors(repetition_penalty=penalty if penalty != 1.0 else None,
                                           repetition_context_size=settings["repetition_context_size"])


def main(argv=None) -> int:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step

    from .bench import BenchResult, time_generation
    from .loading import parse_dtype

    source, prompt_tokens, gen_tokens, runs, seed, *rest = (argv or sys.argv[1:])
    prompt_tokens, gen_tokens, runs, seed = int(prompt_tokens), int(gen_tokens), int(runs), int(seed)
    dtype = rest[0] if rest and rest[0] != "-" else None
    model = build_model(source, parse_dtype(dtype) if dtype else None)
    sampler, processors = mlx_lm_sampling(json.loads(rest[1]) if len(rest) > 1 else {})
    mx.random.seed(seed)
    vocab = vocab_size(model.args)
    prompt = mx.array(np.random.default_rng(seed).integers(0, min(vocab, 150000), prompt_tokens), mx.int32)

    def steps(p, n):
        return generate_step(p, model, max_tokens=n, prefill_step_size=2048, sampler=sampler,
                             logits_processors=processors)

    ttft, rate, peak = time_generation(steps, prompt, gen_tokens, runs)
    res = BenchResult("mlx-lm", prompt_tokens, gen_tokens, ttft * 1e3, prompt_tokens / ttft, rate, peak / 1e9)
    print(json.dumps(dataclasses.asdict(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
