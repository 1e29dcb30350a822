"""The transformers baseline for benchmarks/omni_bench.py: Qwen3OmniMoeForConditionalGeneration.generate
on a dummy config's shapes (random bf16 weights, on the GPU), timed per part.

    python benchmarks/omni_transformers.py --model dummy:qwen3-omni-30b-a3b [--tokens 64] [--frames 96]

The thinker and talker lengths are forced with min_new_tokens (random weights would stop anywhere);
the thinker greedy, the talker with its default sampling. Prints one JSON line: thinker tokens/s,
talker + code predictor ms per frame, Code2Wav ms per frame, wall seconds and the real-time factor
(audio seconds / wall seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="dummy:qwen3-omni-30b-a3b")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from benchmarks.omni_bench import QUESTION
    from metalgen.dummy import tokenizer_folder
    from metalgen.omni.dummy import dummy_config
    from tokenizer import Tokenizer

    config = {k: v for k, v in dummy_config(a.model.removeprefix("dummy:")).items() if k != "eos_token_ids"}
    cfg = Qwen3OmniMoeConfig(**config)
    tic = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly: fp32 first would need twice the memory
    with torch.device(a.device):
        model = Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    torch.set_default_dtype(torch.float32)
    load_s = time.perf_counter() - tic
    tok = Tokenizer.from_pretrained(tokenizer_folder())
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)
    input_ids = torch.tensor([ids], device=a.device)

    times = {}

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    def wrap(obj, name, key):
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            sync()
            t = time.perf_counter()
            out = original(*args, **kwargs)
            sync()
            times[key] = times.get(key, 0.0) + time.perf_counter() - t
            return out

        setattr(obj, name, timed)

    wrap(model.thinker, "generate", "thinker")
    wrap(model.talker, "generate", "talker")
    wrap(model.code2wav, "chunked_decode", "code2wav")

    def run(tokens, frames):
        times.clear()
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            _, wav = model.generate(input_ids=input_ids, thinker_max_new_tokens=tokens, thinker_min_new_tokens=tokens,
                                    thinker_do_sample=False, talker_max_new_tokens=frames + 1,
                                    talker_min_new_tokens=frames + 1)
        sync()
        return time.perf_counter() - t, wav.numel()

    run(4, 4)  # warm-up, short: each run takes minutes at full length
    wall, samples = run(a.tokens, a.frames)
    frames = samples / 1920
    row = dict(engine="transformers", model=a.model, load_s=round(load_s, 1), tokens=a.tokens, frames=round(frames, 1),
               thinker_tok_s=round(a.tokens / times["thinker"], 2),
               frame_ms=round(1000 * times["talker"] / max(frames, 1), 2),
               code2wav_ms_per_frame=round(1000 * times["code2wav"] / max(frames, 1), 3),
               wall_s=round(wall, 2), audio_s=round(samples / 24000, 2), rtf=round(samples / 24000 / wall, 3),
               torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
