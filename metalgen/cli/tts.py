"""`metalgen tts`: text -> speech (WAV) with a Qwen3-TTS checkpoint."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tts",
        help="synthesize speech from text (Qwen3-TTS)",
        description="Synthesize speech with a Qwen3-TTS 12 Hz checkpoint (CustomVoice: --speaker; "
                    "VoiceDesign: --instruct; Base: --ref-audio [--ref-text]).",
    )
    p.add_argument("--model", default="dummy:qwen3-tts-0.6b",
                   help="checkpoint folder, Hugging Face hub id, or dummy:<shape> (random weights); "
                        "default: %(default)s")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="cast the talker's weights (default: as stored; bfloat16 for dummy models)")
    p.add_argument("--text", "-t", required=True, help="the text to speak; '-' reads stdin")
    p.add_argument("--out", "-o", required=True, help="output WAV file")
    p.add_argument("--speaker", default=None, help="named speaker (CustomVoice models)")
    p.add_argument("--language", default=None, help="language (default: auto)")
    p.add_argument("--instruct", default=None,
                   help="instruction: speaking style (CustomVoice 1.7B) or the voice described in words (VoiceDesign)")
    p.add_argument("--ref-audio", default=None, help="reference clip whose voice to clone (Base models)")
    p.add_argument("--ref-text", default=None, help="transcript of --ref-audio (in-context cloning)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stream", action="store_true",
                   help="decode audio in chunks while frames are generated, appending to --out as it goes")
    p.add_argument("--chunk-frames", type=int, default=12, help="frames per streamed chunk (80 ms each)")
    p.add_argument("--first-chunk-frames", type=int, default=None,
                   help="frames in the first streamed chunk (later chunks double up to --chunk-frames); "
                        "default 2")
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode path of the talker and code predictor (docs/decode.md); default: %(default)s")
    p.add_argument("--temp", type=float, default=None, help="talker temperature (default 0.9; 0 is greedy)")
    p.add_argument("--top-k", type=int, default=None, help="talker top-k (default 50)")
    p.add_argument("--top-p", type=float, default=None, help="talker top-p (default 1.0)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="default 1.05")
    p.add_argument("--sub-temp", type=float, default=None, help="code-predictor temperature (default 0.9)")
    p.add_argument("--sub-top-k", type=int, default=None, help="code-predictor top-k (default 50)")
    p.add_argument("--max-frames", type=int, default=None, help="stop after this many 80 ms frames")
    p.add_argument("--text-input", choices=["whole", "streamed"], default=None,
                   help="the whole text in the prompt, or streamed in beside the first frames "
                        "(default: whole, streamed for Base models)")
    p.add_argument("--verbose", action="store_true")


def read_text(args) -> str:
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        raise MetalgenError("the text is empty")
    return text


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import tts as tts_api

    text = read_text(args)
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise MetalgenError(f"the folder of --out does not exist: {out.parent}")
    if args.chunk_frames < 1 or (args.first_chunk_frames is not None and args.first_chunk_frames < 1):
        raise MetalgenError("--chunk-frames and --first-chunk-frames must be >= 1")
    tic = time.perf_counter()
    model = tts_api.load(args.model, dtype=args.dtype, revision=args.revision)
    if args.verbose:
        print(f"loaded {args.model} ({model.model_type}) in {time.perf_counter() - tic:.2f} s", file=sys.stderr)
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its audio is noise", file=sys.stderr)
    options = dict(speaker=args.speaker, language=args.language, instruct=args.instruct,
                   ref_audio=args.ref_audio, ref_text=args.ref_text, seed=args.seed,
                   temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                   repetition_penalty=args.repetition_penalty, sub_temperature=args.sub_temp,
                   sub_top_k=args.sub_top_k, max_frames=args.max_frames,
                   non_streaming=None if args.text_input is None else args.text_input == "whole",
                   decode=args.decode)
    sr = model.sample_rate
    tic = time.perf_counter()
    first = None
    if args.stream:
        import soundfile as sf

        samples = 0
        try:
            with sf.SoundFile(str(out), "w", samplerate=sr, channels=1, subtype="PCM_16") as f:
                first_chunk = {} if args.first_chunk_frames is None else dict(first_chunk_frames=args.first_chunk_frames)
                for chunk in model.stream(text, chunk_frames=args.chunk_frames, **first_chunk, **options):
                    if first is None:
                        first = time.perf_counter() - tic
                    f.write(chunk)
                    f.flush()
                    samples += chunk.shape[0]
        except RuntimeError as e:  # soundfile's errors for unwritable paths
            raise MetalgenError(f"could not write {out}: {e}")
    else:
        wav, sr = model.synthesize(text, **options)
        tts_api.write_wav(out, wav, sr)
        samples = int(np.asarray(wav).shape[0])
    elapsed = time.perf_counter() - tic
    seconds = samples / sr
    print(f"wrote {out}: {seconds:.2f} s of audio at {sr} Hz in {elapsed:.2f} s "
          f"(real-time factor {elapsed / max(seconds, 1e-9):.2f})"
          + (f"; first audio after {first:.2f} s" if first is not None else ""), file=sys.stderr)
    return 0
