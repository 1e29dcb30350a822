"""`metalgen tts`: text -> speech (WAV) with a Qwen3-TTS or a Magpie TTS checkpoint.

Both model kinds share the flow (read the text, load, check the request, write the WAV whole or
streamed, report); what differs is the options each one takes, gathered by `_qwen_options` and
`_magpie_options`. A flag the loaded kind does not take is a one-line error, never ignored.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

from ..decode.modes import DECODE_MODES
from ..errors import MetalgenError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tts",
        help="synthesize speech from text (Qwen3-TTS, Magpie TTS)",
        description="Synthesize speech with a Qwen3-TTS 12 Hz checkpoint (CustomVoice: --speaker; "
                    "VoiceDesign: --instruct; Base: --ref-audio [--ref-text]) or a Magpie TTS checkpoint "
                    "(a .nemo, its folder, nvidia/magpie_tts_multilingual_357m or dummy:magpie-*: "
                    "--speaker, --language).",
    )
    p.add_argument("--model", default="dummy:qwen3-tts-0.6b",
                   help="checkpoint folder or .nemo file, Hugging Face hub id, or dummy:<shape> (random "
                        "weights); default: %(default)s")
    p.add_argument("--revision", default=None, help="hub branch, tag or commit")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="cast the talker's (Magpie: the transformer's) weights (default: as stored; "
                        "bfloat16 for dummy Qwen3-TTS models)")
    p.add_argument("--text", "-t", default=None, help="the text to speak; '-' reads stdin")
    p.add_argument("--out", "-o", default=None, help="output WAV file")
    p.add_argument("--list-speakers", action="store_true", help="print the checkpoint's speakers and exit")
    p.add_argument("--list-languages", action="store_true", help="print the checkpoint's languages and exit")
    p.add_argument("--speaker", default=None,
                   help="named speaker (CustomVoice models; Magpie: a name or an index, default the first)")
    p.add_argument("--language", default=None, help="language (Qwen3-TTS default: auto; Magpie default: en)")
    p.add_argument("--instruct", default=None,
                   help="instruction: speaking style (CustomVoice 1.7B) or the voice described in words (VoiceDesign)")
    p.add_argument("--ref-audio", default=None,
                   help="reference clip whose voice to clone (Qwen3-TTS Base models; Magpie checkpoints with a "
                        "context encoder)")
    p.add_argument("--ref-text", default=None, help="transcript of --ref-audio (in-context cloning)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stream", action="store_true",
                   help="decode audio in chunks while frames are generated, appending to --out as it goes")
    p.add_argument("--chunk-frames", type=int, default=None,
                   help="frames per streamed chunk, at most (default 12 Qwen3-TTS frames = 0.96 s; 64 Magpie frames = 3.0 s)")
    p.add_argument("--first-chunk-frames", type=int, default=None,
                   help="frames in the first streamed chunk (later chunks grow, x2 for Qwen3-TTS and x4 for Magpie, "
                        "up to --chunk-frames); "
                        "default 2 (Qwen3-TTS), 4 (Magpie)")
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode path of the talker and code predictor (docs/decode.md); default: %(default)s")
    p.add_argument("--temp", type=float, default=None,
                   help="temperature (Qwen3-TTS talker default 0.9, Magpie: the checkpoint's); 0 is greedy")
    p.add_argument("--top-k", type=int, default=None, help="top-k (Qwen3-TTS talker default 50, Magpie 80)")
    p.add_argument("--top-p", type=float, default=None, help="talker top-p (default 1.0)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="default 1.05")
    p.add_argument("--sub-temp", type=float, default=None, help="code-predictor temperature (default 0.9)")
    p.add_argument("--sub-top-k", type=int, default=None, help="code-predictor top-k (default 50)")
    p.add_argument("--max-frames", type=int, default=None,
                   help="stop after this many frames (Qwen3-TTS: 80 ms each; Magpie: 46 ms codec frames)")
    p.add_argument("--text-input", choices=["whole", "streamed"], default=None,
                   help="the whole text in the prompt, or streamed in beside the first frames "
                        "(default: whole, streamed for Base models)")
    m = p.add_argument_group("Magpie TTS")
    m.add_argument("--codec", default=None,
                   help="the NanoCodec .nemo (default: the config's codecmodel_path, a .nemo beside the model, "
                        "or the codec's hub repo)")
    m.add_argument("--cfg-scale", type=float, default=None,
                   help="classifier-free guidance scale (default: the checkpoint's, 2.5)")
    m.add_argument("--no-cfg", action="store_true",
                   help="turn classifier-free guidance off (one decoder row instead of two)")
    p.add_argument("--verbose", action="store_true")


def read_text(args) -> str:
    text = sys.stdin.read() if args.text == "-" else args.text
    if text is None:
        raise MetalgenError("give the text to speak: --text TEXT (or --text - to read stdin)")
    if not text.strip():
        raise MetalgenError("the text is empty")
    return text


def _flags_given(flags: Dict[str, object]) -> Optional[str]:
    """The first flag of `flags` ({flag: its value}) that was given, or None."""
    for flag, value in flags.items():
        if value not in (None, False):
            return flag
    return None


def _qwen_options(args) -> Dict[str, object]:
    bad = _flags_given({"--codec": args.codec, "--cfg-scale": args.cfg_scale, "--no-cfg": args.no_cfg})
    if bad:
        raise MetalgenError(f"{bad} applies to Magpie checkpoints, not Qwen3-TTS")
    return dict(speaker=args.speaker, language=args.language, instruct=args.instruct,
                ref_audio=args.ref_audio, ref_text=args.ref_text, seed=args.seed,
                temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                repetition_penalty=args.repetition_penalty, sub_temperature=args.sub_temp,
                sub_top_k=args.sub_top_k, max_frames=args.max_frames,
                non_streaming=None if args.text_input is None else args.text_input == "whole",
                decode=args.decode)


def _magpie_options(args) -> Dict[str, object]:
    bad = _flags_given({
        "--instruct": args.instruct, "--ref-text": args.ref_text,
        "--top-p": args.top_p, "--repetition-penalty": args.repetition_penalty, "--sub-temp": args.sub_temp,
        "--sub-top-k": args.sub_top_k, "--text-input": args.text_input,
        "--decode": None if args.decode == "auto" else args.decode,
    })
    if bad:
        raise MetalgenError(f"{bad} applies to Qwen3-TTS checkpoints, not Magpie")
    if args.ref_audio is not None and args.speaker is not None:
        raise MetalgenError("give either --speaker or --ref-audio, not both")
    return dict(speaker=args.speaker, language=args.language, seed=args.seed, temperature=args.temp,
                top_k=args.top_k, cfg_scale=args.cfg_scale, cfg=not args.no_cfg, max_frames=args.max_frames,
                ref_audio=args.ref_audio)


def _stream_kw(args) -> Dict[str, object]:
    """chunk_frames / first_chunk_frames for `model.stream`; the model's own defaults where not given."""
    if (args.chunk_frames is not None and args.chunk_frames < 1) or \
            (args.first_chunk_frames is not None and args.first_chunk_frames < 1):
        raise MetalgenError("--chunk-frames and --first-chunk-frames must be >= 1")
    return {k: v for k, v in (("chunk_frames", args.chunk_frames), ("first_chunk_frames", args.first_chunk_frames))
            if v is not None}


def write_streamed(out: Path, rate: int, chunks: Callable[[], Iterable]) -> tuple:
    """Write the chunks of `chunks()` to `out` as they come: (samples written, seconds to the first
    chunk). On any failure the partial file is removed, so no truncated WAV is left behind."""
    import soundfile as sf

    samples = 0
    first = None
    tic = time.perf_counter()
    it = chunks()  # a model that checks its request eagerly fails here, before the file exists
    try:
        f = sf.SoundFile(str(out), "w", samplerate=rate, channels=1, subtype="PCM_16")
    except RuntimeError as e:  # soundfile's errors for unwritable paths
        raise MetalgenError(f"could not write {out}: {e}")
    try:
        with f:
            for chunk in it:
                if first is None:
                    first = time.perf_counter() - tic
                f.write(chunk)
                f.flush()
                samples += chunk.shape[0]
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return samples, first


def _list(args) -> int:
    from .. import tts as tts_api

    model = tts_api.load(args.model, dtype=args.dtype, revision=args.revision, codec=args.codec)
    if args.list_speakers:
        print("\n".join(model.speakers) if model.speakers else "(no named speakers)")
    if args.list_languages:
        print("\n".join(model.languages))
    return 0


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from .. import tts as tts_api

    if args.list_speakers or args.list_languages:
        return _list(args)
    text = read_text(args)
    if args.out is None:
        raise MetalgenError("give the output WAV file: --out FILE.wav")
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise MetalgenError(f"the folder of --out does not exist: {out.parent}")
    tic = time.perf_counter()
    model = tts_api.load(args.model, dtype=args.dtype, revision=args.revision, codec=args.codec)
    magpie = model.model_type == "magpie"
    options = _magpie_options(args) if magpie else _qwen_options(args)
    stream_kw = _stream_kw(args)
    if args.verbose:
        print(f"loaded {args.model} ({model.model_type}) in {time.perf_counter() - tic:.2f} s", file=sys.stderr)
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its audio is noise", file=sys.stderr)
    sr = model.sample_rate
    tic = time.perf_counter()
    first = None
    if args.stream:
        samples, first = write_streamed(out, sr, lambda: model.stream(text, **stream_kw, **options))
    else:
        wav, sr = model.synthesize(text, **options)
        tts_api.write_wav(out, wav, sr)
        samples = int(np.asarray(wav).shape[0])
    elapsed = time.perf_counter() - tic
    seconds = samples / sr
    print(f"wrote {out}: {seconds:.2f} s of audio at {sr} Hz in {elapsed:.2f} s "
          f"({seconds / max(elapsed, 1e-9):.2f}x real time)"
          + (f"; first audio after {first:.2f} s" if first is not None else ""), file=sys.stderr)
    return 0
