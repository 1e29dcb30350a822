"""`metalgen serve`: the OpenAI-compatible HTTP server (docs/serve.md)."""

from __future__ import annotations

import argparse
import os
import sys

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="Serve /v1/chat/completions and /v1/completions (a text model) or /v1/audio/speech "
                                   "(a speech model: Qwen3-TTS or Magpie TTS), /v1/models and /health.")
    p.add_argument("--model", default="dummy:qwen2.5-0.5b",
                   help="model folder, Hugging Face hub id, Magpie .nemo file, or dummy:<shape>; default: %(default)s")
    p.add_argument("--served-model-name", default=None, help="the name clients ask for; default: --model")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    # loopback unless told otherwise: a server reachable from elsewhere is a choice, made with --host 0.0.0.0
    p.add_argument("--host", default="127.0.0.1", help="address to bind; default: %(default)s (this machine only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-tokens", type=int, default=512, help="for requests that give none; default: %(default)s")
    p.add_argument("--max-batch", type=int, default=1,
                   help="requests decoded together, one forward pass a token for all of them, on the plain path; "
                        "1 (the default) serves one at a time on the fast decode path with prefix reuse across "
                        "requests; a batch pays off from several concurrent clients (docs/serve.md)")
    p.add_argument("--prefix-cache-gb", type=float, default=1.0,
                   help="with --max-batch above 1: GiB of earlier requests' KV kept for prompts that begin the same "
                        "way (a system prompt, a chat's earlier turns), least recently used out; 0: none; "
                        "default: %(default)s")
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode path (docs/decode.md); a batch of requests takes the plain path")
    p.add_argument("--codec", default=None, metavar="NEMO",
                   help="a Magpie TTS model's NanoCodec .nemo (default: the config's codecmodel_path, a .nemo "
                        "beside the model, or the codec's hub repo)")
    p.add_argument("--voice", action="append", default=[], metavar="NAME=CLIP",
                   help="a voice requests may name, cloned from a reference clip (repeatable): for a Qwen3-TTS Base "
                        "model, or a Magpie checkpoint with a context encoder")
    p.add_argument("--voice-text", action="append", default=[], metavar="NAME=TRANSCRIPT",
                   help="the transcript of --voice NAME's clip, for Qwen3-TTS in-context cloning (optional)")
    p.add_argument("--max-request-bytes", type=int, default=8 * 2**20,
                   help="a request body past this many bytes is refused (413) before more of it is read; "
                        "default: %(default)s (8 MiB)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests that may wait for the engine beyond those it is running; past them a request "
                        "is refused (429, Retry-After); 0: none wait; default: %(default)s")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health; default: the "
                        "environment variable METALGEN_API_KEY, else no key")
    p.add_argument("--no-warmup", action="store_true",
                   help="take requests at once, without first having MLX compile its quantized matmul kernels "
                        "(on CUDA, for quantized weights) and the batched step's (on CUDA, --max-batch above 4; "
                        "docs/serve.md)")
    p.add_argument("--prefill-step-size", type=int, default=512,
                   help="prompt tokens fed in one chunk at most (batched: a step's chunk, padding included, "
                        "enqueued ahead of the running rows' decode); default: %(default)s")
    p.add_argument("--profile", metavar="TRACE.jsonl", default=None,
                   help="write a JSONL trace of the generation's phases: prefill chunks, decode steps, readbacks "
                        "and, batched, each step's delivery of its tokens (`python -m profiling summarize`)")
    p.add_argument("--verbose", action="store_true", help="log every request and the kernel choices")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve.app import make_app
    except ImportError as e:
        raise MetalgenError(f"metalgen serve needs its extra ({e.name} is missing): pip install 'metalgen[serve]'")
    import kernels_metal
    import profiling

    from ..api import load
    from ..serve.engine import Engine
    from ..serve.speech import SpeechEngine, model_kind, parse_voices
    from ..serve.warmup import warm_batch, warm_up

    if args.max_tokens < 1:
        raise MetalgenError("--max-tokens must be >= 1")
    if args.max_batch < 1:
        raise MetalgenError(f"--max-batch must be >= 1, got {args.max_batch}")
    if not args.prefix_cache_gb >= 0:  # (NaN too)
        raise MetalgenError(f"--prefix-cache-gb must be >= 0, got {args.prefix_cache_gb}")
    if args.prefill_step_size < 1:
        raise MetalgenError(f"--prefill-step-size must be >= 1, got {args.prefill_step_size}")
    if args.max_request_bytes < 1:
        raise MetalgenError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    if args.max_queue < 0:
        raise MetalgenError(f"--max-queue must be >= 0, got {args.max_queue}")
    if not 0 <= args.port < 65536:
        raise MetalgenError(f"--port must be in 0..65535, got {args.port}")
    # read once, here: the app holds the key, and nothing later looks at the environment
    api_key = args.api_key if args.api_key is not None else os.environ.get("METALGEN_API_KEY") or None
    if api_key is not None and not api_key.strip():
        raise MetalgenError("--api-key is empty")
    if args.verbose:
        kernels_metal.set_verbose(True)
    name = args.served_model_name or args.model
    voices = parse_voices(args.voice, args.voice_text)
    kind = model_kind(args.model, args.revision)
    speech = None
    if kind == "speech":  # as metalgen.tts.load tells them
        from ..tts import load as load_tts

        if args.max_batch > 1:
            print("metalgen: note: speech requests run one at a time (--max-batch is for text)", file=sys.stderr)
        tts = load_tts(args.model, dtype=args.dtype, revision=args.revision, codec=args.codec)
        if tts.model_type == "magpie" and args.decode != "auto":
            print("metalgen: note: --decode is for text and Qwen3-TTS models; Magpie has one path", file=sys.stderr)
        engine = SpeechEngine(tts, name, decode=args.decode, ref_voices=voices, max_queue=args.max_queue)
    else:
        if voices:
            raise MetalgenError("--voice is for a speech model (Qwen3-TTS Base, or Magpie with a context encoder)")
        if args.codec is not None:
            raise MetalgenError("--codec is for a Magpie TTS model")
        if kind == "text+speech":
            # Qwen3-Omni: one load for both routes, the text engine on its thinker (the audio encoder is left
            # out: the server takes no audio in)
            from ..omni import load as load_omni

            parts = load_omni(args.model, dtype=args.dtype, revision=args.revision,
                              parts=("thinker", "talker", "code2wav"))
            model, tokenizer = parts.model.thinker, parts.tokenizer
            if "talker" in parts.model and "code2wav" in parts.model:
                speech = SpeechEngine(parts, name, decode=args.decode, max_queue=args.max_queue)
        else:
            model, tokenizer = load(args.model, dtype=args.dtype, revision=args.revision)
        if not args.no_warmup:
            def say(line):
                print(f"metalgen: {line}", file=sys.stderr, flush=True)

            warm_up(model, say)
            warm_batch(model, args.max_batch, say)
        tracer = profiling.make_tracer(args.profile)
        tracer.meta(model=args.model, backend=kernels_metal.backend(), max_batch=args.max_batch)
        engine = Engine(model, tokenizer, name, decode=args.decode, prefill_step_size=args.prefill_step_size,
                        max_batch=args.max_batch, prefix_cache_gb=args.prefix_cache_gb, max_queue=args.max_queue,
                        tracer=tracer)
    print(f"metalgen: serving {engine.name} on http://{args.host}:{args.port}/v1"
          + (" (text, and speech at /v1/audio/speech)" if speech is not None else "")
          + (" (API key required)" if api_key else ""), file=sys.stderr)
    try:
        uvicorn.run(make_app(engine, args.max_tokens, api_key=api_key, max_request_bytes=args.max_request_bytes,
                             speech=speech),
                    host=args.host, port=args.port,
                    log_level="info" if args.verbose else "warning")
    except OSError as e:  # e.g. the port is taken
        raise MetalgenError(f"cannot serve on {args.host}:{args.port}: {e}")
    return 0
