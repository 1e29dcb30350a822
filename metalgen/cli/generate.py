"""`metalgen generate`: stream a completion to stdout, statistics to stderr."""

from __future__ import annotations

import argparse
import sys
import time

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError
from .sampling_flags import add_sampling_flags


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Generate text. Flags follow mlx_lm.generate where they mean the same.",
    )
    p.add_argument("--model", default="dummy:qwen2.5-0.5b",
                   help="model folder, Hugging Face hub id, or dummy:<shape> (random weights); "
                        "default: %(default)s")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="cast weights (default: as stored; bfloat16 for dummy models)")
    p.add_argument("--prompt", "-p", default="Hello", help="the prompt; '-' reads stdin")
    p.add_argument("--system", "--system-prompt", dest="system", default=None,
                   help="system message for the chat template")
    p.add_argument("--ignore-chat-template", action="store_true",
                   help="feed the prompt as raw text, without the chat template")
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    add_sampling_flags(p)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text is generated (repeatable)")
    p.add_argument("--prefill-step-size", type=int, default=512)
    p.add_argument("--profile", metavar="TRACE.jsonl", default=None,
                   help="write a JSONL trace of every phase and step")
    p.add_argument("--decode", choices=DECODE_MODES,
                   default="auto", help="decode path after prefill (docs/decode.md); default: %(default)s")
    p.add_argument("--verbose", action="store_true", help="report backend, load time, kernel choices")


def read_prompt(args) -> str:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise MetalgenError("the prompt is empty")
    return prompt


def build_prompt(tokenizer, args, text: str):
    """Chat messages through the template, or raw text with --ignore-chat-template."""
    if args.ignore_chat_template:
        return tokenizer.encode(((args.system + "\n") if args.system else "") + text)
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)


def print_stats(last, interrupted: bool = False) -> None:
    err = sys.stderr
    print("=" * 10, file=err)
    if last is None:
        print("no tokens generated", file=err)
        return
    print(f"Prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.3f} tokens-per-sec", file=err)
    print(f"Generation: {last.generation_tokens} tokens, {last.generation_tps:.3f} tokens-per-sec",
          file=err)
    print(f"Peak memory: {last.peak_memory:.3f} GB", file=err)
    reason = "interrupted" if interrupted else last.finish_reason
    print(f"Finish: {reason}", file=err)


def run(args: argparse.Namespace) -> int:
    import kernels_metal
    import profiling

    from ..api import load, stream

    text = read_prompt(args)
    if args.prefill_step_size < 1:
        raise MetalgenError("--prefill-step-size must be >= 1")
    if args.verbose:
        kernels_metal.set_verbose(True)
    tracer = profiling.make_tracer(args.profile)
    tic = time.perf_counter()
    with tracer.span("load", sync=True):
        model, tokenizer = load(args.model, dtype=args.dtype, revision=args.revision)
    if args.verbose:
        print(f"backend: {kernels_metal.backend()}; loaded {args.model} in "
              f"{time.perf_counter() - tic:.2f} s", file=sys.stderr)
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its text is noise", file=sys.stderr)
    prompt = build_prompt(tokenizer, args, text)
    tracer.meta(model=args.model, backend=kernels_metal.backend(), prompt_tokens=len(prompt))

    last = None
    out = sys.stdout
    try:
        for last in stream(
            model, tokenizer, prompt,
            max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
            top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            repetition_context_size=args.repetition_context_size, seed=args.seed,
            stop=args.stop, prefill_step_size=args.prefill_step_size, decode=args.decode,
            tracer=tracer,
        ):
            if last.text:
                out.write(last.text)
                out.flush()
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
        print_stats(last, interrupted=True)
        return 130
    finally:
        tracer.close()
    out.write("\n")
    out.flush()
    print_stats(last)
    return 0
