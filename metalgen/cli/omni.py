"""`metalgen omni`: ask a Qwen3-Omni checkpoint in text or speech; it answers in text and speech."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError
from .sampling_flags import add_sampling_flags


def add_parser(sub) -> None:
    p = sub.add_parser(
        "omni",
        help="answer in text and speech (Qwen3-Omni)",
        description="Answer a prompt (text, --audio-in clips, or both) with a Qwen3-Omni checkpoint: the text "
                    "streams to stdout, the speech goes to --out.",
    )
    p.add_argument("--model", default="dummy:qwen3-omni-tiny",
                   help="checkpoint folder, Hugging Face hub id, or dummy:<shape> (random weights); "
                        "default: %(default)s")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="cast the decoders' weights (default: as stored; bfloat16 for dummy models)")
    p.add_argument("--prompt", "-p", default=None, help="the question; '-' reads stdin")
    p.add_argument("--system", default=None, help="a system prompt")
    p.add_argument("--audio-in", action="append", default=[], metavar="WAV",
                   help="a spoken question or any sound (repeatable); placed before --prompt's text")
    p.add_argument("--image", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--out", "-o", default=None, help="WAV file for the spoken answer (24 kHz)")
    p.add_argument("--no-audio", action="store_true", help="answer in text only (no talker, no --out)")
    p.add_argument("--speaker", default=None, help="a speaker the checkpoint defines (default: Ethan)")
    p.add_argument("--list-speakers", action="store_true", help="print the checkpoint's speakers and exit")
    p.add_argument("--stream", action="store_true",
                   help="write the audio to --out as it is decoded, a chunk at a time")
    p.add_argument("--max-tokens", "-m", type=int, default=1024, help="most text tokens of the answer")
    add_sampling_flags(p)
    p.add_argument("--talker-temp", type=float, default=None, help="talker temperature (default 0.9; 0 is greedy)")
    p.add_argument("--talker-top-k", type=int, default=None, help="talker top-k (default 50)")
    p.add_argument("--talker-top-p", type=float, default=None, help="talker top-p (default 1.0)")
    p.add_argument("--talker-repetition-penalty", type=float, default=None, help="default 1.05")
    p.add_argument("--max-frames", type=int, default=None, help="most 80 ms speech frames (default 4096)")
    p.add_argument("--chunk-frames", type=int, default=300, help="frames per decoded audio chunk, at most")
    p.add_argument("--first-chunk-frames", type=int, default=4,
                   help="frames in the first audio chunk (later ones double up to --chunk-frames)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode path of the thinker, talker and code predictor (docs/decode.md)")
    p.add_argument("--verbose", action="store_true")


def _open_wav(path: Path, rate: int):
    import soundfile as sf

    try:
        return sf.SoundFile(str(path), "w", samplerate=rate, channels=1, subtype="PCM_16")
    except RuntimeError as e:  # soundfile's errors for unwritable paths
        raise MetalgenError(f"could not write {path}: {e}")


def _messages(args) -> list:
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not args.audio_in and not (text and text.strip()):
        raise MetalgenError("give a question: --prompt TEXT, --audio-in WAV, or both")
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": text or ""})
    return messages


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import omni
    from ..sampling import make_logits_processors, make_sampler

    if args.image:
        raise MetalgenError("image input is not supported yet (the image encoder is not implemented); "
                            "ask with --prompt or --audio-in")
    if args.list_speakers:  # the config's, without reading any weights
        from ..omni.loading import load_args

        talker = load_args(args.model, revision=args.revision).talker
        if talker is None:
            raise MetalgenError(f"{args.model} has no talker: it answers in text only")
        print("\n".join(sorted(talker.speaker_id)))
        return 0
    messages = _messages(args)
    for path in args.audio_in:
        if not Path(path).is_file():
            raise MetalgenError(f"--audio-in {path}: no such file")
    want_audio = not args.no_audio
    out = Path(args.out) if args.out else None
    if want_audio and out is None:
        raise MetalgenError("give --out FILE.wav for the spoken answer, or --no-audio for text only")
    if out is not None and not out.parent.exists():
        raise MetalgenError(f"the folder of --out does not exist: {out.parent}")
    if args.max_tokens < 1:
        raise MetalgenError("--max-tokens must be >= 1")
    if args.chunk_frames < 1 or args.first_chunk_frames < 1:
        raise MetalgenError("--chunk-frames and --first-chunk-frames must be >= 1")

    tic = time.perf_counter()
    wanted = ("thinker", "audio", "talker", "code2wav") if want_audio else ("thinker", "audio")
    parts = omni.load(args.model, dtype=args.dtype, revision=args.revision, parts=wanted)
    if args.verbose:
        print(f"loaded {args.model} in {time.perf_counter() - tic:.2f} s", file=sys.stderr)
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its text and speech are noise", file=sys.stderr)
    talker = None
    if want_audio:
        omni.speaker_id(parts, args.speaker)  # an unknown speaker is refused before any work
        talker = omni.talker_sampling(parts.generation_config, temperature=args.talker_temp, top_k=args.talker_top_k,
                                      top_p=args.talker_top_p, repetition_penalty=args.talker_repetition_penalty,
                                      max_frames=args.max_frames)
    sampler = make_sampler(args.temp, args.top_k, args.top_p, args.min_p, seed=args.seed)
    processors = make_logits_processors(args.repetition_penalty, args.repetition_context_size)
    options = dict(audio=args.audio_in, speaker=args.speaker, return_audio=want_audio, max_tokens=args.max_tokens,
                   sampler=sampler, logits_processors=processors, talker=talker, seed=args.seed,
                   chunk_frames=args.chunk_frames, first_chunk=args.first_chunk_frames, decode=args.decode)

    tic = time.perf_counter()
    first_text = first_audio = None
    samples, pieces, tokens, prompt_tokens = 0, [], 0, 0
    sink = None
    try:
        for r in omni.stream(parts, messages, **options):
            if r.text:
                if first_text is None:
                    first_text = time.perf_counter() - tic
                sys.stdout.write(r.text)
                sys.stdout.flush()
            if r.token is not None:
                tokens, prompt_tokens = r.generation_tokens, r.prompt_tokens
            if r.audio is not None and r.audio.size:
                if first_audio is None:
                    first_audio = time.perf_counter() - tic
                samples += r.audio.shape[0]
                if args.stream:
                    if sink is None:  # opened at the first audio: an error before it leaves no file
                        sink = _open_wav(out, omni.SAMPLE_RATE)
                    sink.write(r.audio)
                    sink.flush()
                else:
                    pieces.append(r.audio)
    except BaseException:
        # no partial WAV left behind, whatever stopped the reply (an error, Ctrl-C)
        if sink is not None:
            sink.close()
            out.unlink(missing_ok=True)
        raise
    if sink is not None:
        sink.close()
    sys.stdout.write("\n")
    elapsed = time.perf_counter() - tic
    if want_audio and sink is None:
        try:
            omni.write_wav(out, np.concatenate(pieces) if pieces else np.zeros((0,), np.float32), omni.SAMPLE_RATE)
        except RuntimeError as e:  # soundfile's errors for unwritable paths
            raise MetalgenError(f"could not write {out}: {e}")
    report = f"{prompt_tokens} prompt tokens, {tokens} text tokens in {elapsed:.2f} s"
    if first_text is not None:
        report += f"; first text after {first_text:.2f} s"
    if want_audio:
        seconds = samples / omni.SAMPLE_RATE
        report += f"; wrote {out}: {seconds:.2f} s of speech ({seconds / max(elapsed, 1e-9):.2f}x real time)"
        if first_audio is not None:
            report += f", first audio after {first_audio:.2f} s"
    print(report, file=sys.stderr)
    return 0
