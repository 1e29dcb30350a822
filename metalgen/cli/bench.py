"""`metalgen bench`: prefill and decode speed, optionally next to mlx-lm on the same weights."""

from __future__ import annotations

import argparse
import json

from ..decode.modes import DECODE_MODES
from .sampling_flags import add_sampling_flags


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure prefill and decode speed",
                       description="Measure time to first token, prefill and decode tokens/s.")
    p.add_argument("--model", default=None,
                   help="default: dummy:qwen2.5-0.5b, or dummy:qwen3-tts-0.6b with --tts")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up; medians")
    p.add_argument("--compare", choices=["mlx-lm"], default=None,
                   help="also run mlx-lm, in its own process on its own weights (the same seeded values "
                        "for a dummy: shape)")
    p.add_argument("--json", metavar="OUT.json", default=None, help="also write the figures here")
    p.add_argument("--decode", choices=DECODE_MODES,
                   default="auto", help="decode path after prefill (docs/decode.md); default: %(default)s")
    p.add_argument("--profile", action="store_true",
                   help="also count MLX operations and host-device syncs per token (plain vs ours)")
    g = p.add_argument_group("sampling (text models; greedy by default, mlx-lm given the same settings)")
    add_sampling_flags(g, repetition_penalty=1.0)
    t = p.add_argument_group("text to speech (--tts)")
    t.add_argument("--tts", action="store_true",
                   help="benchmark a TTS frame loop: ms per frame by part (Qwen3-TTS: talker, 15 code-predictor "
                        "steps, speech decoder; Magpie: text encoder, decoder step, local transformer, codec), "
                        "real-time factor, time to first audio (docs/tts.md)")
    t.add_argument("--frames", type=int, default=None,
                   help="frames per run; default 64 for Qwen3-TTS (80 ms each: 5.1 s) and 128 for Magpie (46 ms "
                        "codec frames: 5.9 s, about the bench sentence's length)")
    t.add_argument("--chunk-frames", type=int, default=None,
                   help="streamed decoder chunk in frames, as `metalgen tts --stream`; default 12 (Qwen3-TTS), "
                        "64 (Magpie)")
    t.add_argument("--first-chunk-frames", type=int, default=None,
                   help="frames in the first streamed chunk (then growing up to --chunk-frames); "
                        "default 2 (Qwen3-TTS), 4 (Magpie)")
    t.add_argument("--chunk-growth", type=int, default=None,
                   help="Magpie: each streamed chunk after the first is this many times the one before "
                        "(default: metalgen.magpie.streaming.CHUNK_GROWTH)")
    t.add_argument("--no-cfg", action="store_true", help="Magpie: classifier-free guidance off (default on)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompt and the draws")


def format_table(report) -> str:
    lines = [
        f"backend {report['backend']} ({report['device']}), weights {report['weight_gb']:.2f} GB "
        f"({report['active_weight_gb']:.2f} GB read a token), copy bandwidth {report['copy_bandwidth_gbs']:.0f} GB/s, "
        f"decode floor {report['floor_decode_tps']:.0f} tok/s, decode path {report.get('decode_path', '?')}",
        f"{'engine':<10} {'prompt':>6} {'gen':>5} {'ttft ms':>9} {'prefill tok/s':>14} "
        f"{'decode tok/s':>13} {'% floor':>8} {'peak GB':>8}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['engine']:<10} {r['prompt_tokens']:>6} {r['gen_tokens']:>5} {r['ttft_ms']:>9.1f} "
            f"{r['prefill_tps']:>14.0f} {r['decode_tps']:>13.1f} "
            f"{100 * r['decode_tps'] / report['floor_decode_tps']:>7.1f}% {r['peak_memory_gb']:>8.2f}"
        )
    sampling = report.get("sampling", {})
    if sampling.get("temperature") or sampling.get("repetition_penalty", 1.0) != 1.0:
        lines.append("sampling: " + ", ".join(f"{k} {v}" for k, v in sampling.items()))
    if "decode_ratio" in report:
        lines.append(f"metalgen / mlx-lm: decode {report['decode_ratio']:.2f}x, "
                     f"prefill {report['prefill_ratio']:.2f}x")
    for path, figures in report.get("profile", {}).items():
        lines.append(f"profile {path:<10} MLX ops/token {figures['ops_per_token']:>5}, "
                     f"host-device syncs/token {figures['syncs_per_token']:.2f}")
    return "\n".join(lines)


def format_tts_table(report) -> str:
    lines = [
        f"backend {report['backend']} ({report['device']}), {report['model']}, weights "
        f"{report['talker_weight_gb']:.2f} GB, prompt {report['prompt_tokens']} tokens, {report['frames']} frames "
        f"x {report['frame_audio_ms']:.0f} ms, chunks of {report['first_chunk_frames']} doubling to "
        f"{report['chunk_frames']} (+{report['left_context']} context), medians of {report['runs']} runs after a "
        f"warm-up, seed {report['seed']}",
        f"metalgen decode paths: talker {report['paths']['talker']}, code predictor "
        f"{report['paths']['code_predictor']}",
        f"{'engine':<10} {'talker':>7} {'15xCP':>7} {'decoder':>8} {'sum':>7} | {'ms/frame':>9} "
        f"{'RTF':>6} {'TTFA ms':>8} {'peak GB':>8}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['engine']:<10} {r['talker_ms']:>7.2f} {r['predictor_ms']:>7.2f} {r['decoder_ms']:>8.2f} "
            f"{r['split_total_ms']:>7.2f} | {r['frame_ms']:>9.2f} {r['rtf']:>6.2f} {r['ttfa_ms']:>8.1f} "
            f"{r['peak_memory_gb']:>8.2f}"
        )
    lines.append("(talker, 15xCP, decoder, sum: ms per frame with a barrier after each part; "
                 "ms/frame, RTF, TTFA: the streamed pipeline)")
    if "frame_ratio" in report:
        lines.append(f"mlx-lm / metalgen time: streamed ms/frame {report['frame_ratio']:.2f}x, "
                     f"split sum {report['split_ratio']:.2f}x, TTFA {report['ttfa_ratio']:.2f}x")
    return "\n".join(lines)


def format_magpie_table(report) -> str:
    lines = [
        f"backend {report['backend']} ({report['device']}), {report['model']}, {report['dtype']} weights "
        f"{report['weight_gb']:.2f} GB "
        f"+ codec {report['codec_weight_gb']:.2f} GB, text {report['text_tokens']} tokens, {report['frames']} frames "
        f"x {report['frame_audio_ms']:.1f} ms ({report['codebooks']} codebooks, stacking {report['frame_stacking']}), "
        f"CFG {'on, scale ' + str(report['cfg_scale']) if report['cfg'] else 'off'}, chunks of "
        f"{report['first_chunk_frames']} growing x{report.get('chunk_growth', 2)} to {report['chunk_frames']} "
        f"(+{report['left_context']} context), medians of {report['runs']} runs after a warm-up, seed {report['seed']}",
        f"{'engine':<10} {'text ms':>8} {'prefill':>8} {'dec/step':>9} {'LT/step':>8} | {'dec':>7} {'LT':>7} {'codec':>7} "
        f"{'sum':>7} | {'ms/frame':>9} {'RTF':>6} {'TTFA ms':>8} {'peak GB':>8}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['engine']:<10} {r['text_encoder_ms']:>8.2f} {r['prefill_ms']:>8.2f} {r['decoder_step_ms']:>9.2f} "
            f"{r['local_transformer_step_ms']:>8.2f} | {r['decoder_frame_ms']:>7.2f} "
            f"{r['local_transformer_frame_ms']:>7.2f} {r['codec_frame_ms']:>7.2f} {r['split_frame_ms']:>7.2f} | "
            f"{r['frame_ms']:>9.2f} {r['rtf']:>6.2f} {r['ttfa_ms']:>8.1f} {r['peak_memory_gb']:>8.2f}"
        )
    lines.append("(text, prefill: once per utterance; dec/step, LT/step: ms per decoder step; dec, LT, codec, sum: ms per "
                 "codec frame with a barrier after each part; ms/frame, RTF, TTFA: the streamed pipeline)")
    return "\n".join(lines)


def _write_json(path, report) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


def run_magpie(args: argparse.Namespace, tts) -> int:
    from ..errors import MetalgenError
    from ..magpie.bench import run_magpie_bench
    from ..magpie.streaming import CHUNK_FRAMES, CHUNK_GROWTH, FIRST_CHUNK_FRAMES

    if args.compare:
        raise MetalgenError("--compare mlx-lm runs Qwen3-TTS models, not Magpie")
    if args.decode != "auto":
        raise MetalgenError("--decode applies to Qwen3-TTS models, not Magpie")
    report = run_magpie_bench(
        tts, frames=128 if args.frames is None else args.frames, runs=args.runs, seed=args.seed, cfg=not args.no_cfg,
        chunk_frames=CHUNK_FRAMES if args.chunk_frames is None else args.chunk_frames,
        first_chunk_frames=FIRST_CHUNK_FRAMES if args.first_chunk_frames is None else args.first_chunk_frames,
        growth=CHUNK_GROWTH if args.chunk_growth is None else args.chunk_growth)
    print(format_magpie_table(report))
    _write_json(args.json, report)
    return 0


def run_tts(args: argparse.Namespace) -> int:
    import metalgen.tts
    from ..errors import MetalgenError
    from ..tts.bench import run_tts_bench

    if args.profile:
        raise MetalgenError("--profile applies to text models, not --tts")
    if (args.frames is not None and args.frames < 2) or args.runs < 1 or \
            any(v is not None and v < 1 for v in (args.chunk_frames, args.first_chunk_frames, args.chunk_growth)):
        raise MetalgenError("need --frames >= 2, --runs >= 1, and --chunk-frames, --first-chunk-frames and "
                            "--chunk-growth >= 1")
    tts = metalgen.tts.load(args.model or "dummy:qwen3-tts-0.6b", dtype=args.dtype)
    if tts.model_type == "magpie":
        return run_magpie(args, tts)
    if args.no_cfg or args.chunk_growth is not None:
        raise MetalgenError("--no-cfg and --chunk-growth apply to Magpie checkpoints, not Qwen3-TTS")
    report = run_tts_bench(tts, frames=64 if args.frames is None else args.frames, runs=args.runs, compare=args.compare, seed=args.seed,
                           chunk_frames=12 if args.chunk_frames is None else args.chunk_frames,
                           first_chunk_frames=2 if args.first_chunk_frames is None else args.first_chunk_frames,
                           decode=args.decode)
    print(format_tts_table(report))
    _write_json(args.json, report)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.tts:
        return run_tts(args)
    from ..api import load
    from ..bench import run_bench

    from ..sampling import make_logits_processors, validate_sampling

    validate_sampling(args.temp, args.top_k, args.top_p, args.min_p)
    make_logits_processors(args.repetition_penalty, args.repetition_context_size)  # its checks
    sampling = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    repetition_penalty=args.repetition_penalty, repetition_context_size=args.repetition_context_size)
    source = args.model or "dummy:qwen2.5-0.5b"
    model, _ = load(source, dtype=args.dtype)
    report = run_bench(model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                       runs=args.runs, decode=args.decode, profile=args.profile, sampling=sampling, seed=args.seed)
    report["model"] = source
    if args.compare == "mlx-lm":
        # mlx-lm in its own process on its own weights; ours are let go first, so that a big model is
        # never held twice
        import gc

        import mlx.core as mx

        from ..bench import add_comparison, mlx_lm_bench

        del model
        gc.collect()
        mx.clear_cache()
        add_comparison(report, mlx_lm_bench(source, dtype=args.dtype, prompt_tokens=args.prompt_tokens,
                                            gen_tokens=args.gen_tokens, runs=args.runs, seed=args.seed,
                                            sampling=sampling))
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0
