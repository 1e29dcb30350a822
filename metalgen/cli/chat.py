"""`metalgen chat`: a conversation in the terminal, each turn on the prompt cache of the one before."""

from __future__ import annotations

import argparse
import sys

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError
from .sampling_flags import add_sampling_flags

HELP = "/reset forgets the conversation, /exit (or end of input) leaves"


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat with a model, turn after turn",
                       description="Chat in the terminal: one message a line; " + HELP + ". Every turn "
                                   "feeds only what the prompt cache does not hold yet.")
    p.add_argument("--model", default="dummy:qwen2.5-0.5b",
                   help="model folder, Hugging Face hub id, or dummy:<shape> (random weights); default: %(default)s")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--system", "--system-prompt", dest="system", default=None, help="system message")
    p.add_argument("--max-tokens", "-m", type=int, default=512, help="per reply; default: %(default)s")
    add_sampling_flags(p)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode path (docs/decode.md); default: %(default)s")
    p.add_argument("--verbose", action="store_true", help="report the backend and per-turn speed")


def run(args: argparse.Namespace) -> int:
    import kernels_metal

    from ..api import load
    from ..chat import ChatSession

    if args.max_tokens < 1:
        raise MetalgenError("--max-tokens must be >= 1")
    if args.verbose:
        kernels_metal.set_verbose(True)
    model, tokenizer = load(args.model, dtype=args.dtype, revision=args.revision)
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its text is noise", file=sys.stderr)
    session = ChatSession(model, tokenizer, system=args.system, decode=args.decode, temperature=args.temp,
                          top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty,
                          repetition_context_size=args.repetition_context_size, seed=args.seed)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"[{HELP}]", file=sys.stderr)
    out = sys.stdout
    while True:
        if interactive:
            print(">> ", end="", file=sys.stderr, flush=True)
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            return 0
        if not line or line.strip() == "/exit":
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            session.reset()
            continue
        last = None
        try:
            for last in session.send(text, max_tokens=args.max_tokens):
                out.write(last.text)
                out.flush()
        except KeyboardInterrupt:  # stops this reply, not the conversation
            pass
        out.write("\n")
        out.flush()
        if args.verbose and last is not None:
            print(f"[{last.prompt_tokens} new prompt tokens at {last.prompt_tps:.1f} tok/s, "
                  f"{last.generation_tokens} tokens at {last.generation_tps:.1f} tok/s]", file=sys.stderr)
