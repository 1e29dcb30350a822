"""Magpie voice cloning (metalgen/magpie/clone.py, the NanoCodec encoder, the context encoder) against
NeMo 3.0.0 on the tiny cloning dump of tests/magpie_ref/make_clone_reference.py: the encoder's codes
for each encoder kind, the context window, the context encoder's output, the decoder input and
logits with that context, and greedy codes over 16 frames with and without CFG in both decoder
modes. The parity tests skip without the reference venv (`bash tests/magpie_ref/setup_venv.sh`);
the refusals at the end need no dump."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from magpie_ref.harness import clone_reference_folder
from metalgen.errors import MetalgenError
from metalgen.magpie.clone import context_seconds, context_window, reference_context
from metalgen.magpie.codec_file import load_codec
from metalgen.models.magpie.codec import NanoCodec, NanoCodecArgs
from metalgen.models.magpie.model import MagpieArgs, Model

REL = 1e-4


def assert_rel(got, want, tol=REL):
    got = np.array(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err


@pytest.fixture(scope="module")
def ref():
    folder = clone_reference_folder()
    return folder, np.load(folder / "clone.npz"), json.loads((folder / "clone.json").read_text())


def _model(folder, name):
    from metalgen.magpie.nemo_file import read_nemo

    cfg, weights = read_nemo(folder / name)
    return cfg, Model.from_weights(cfg, weights, source=name)


@pytest.fixture(scope="module")
def plain(ref):
    """The frame-stacking-1 model, its codec loaded without the encoder (clone.py adds it), and the
    context it makes from clip.wav."""
    folder, npz, _ = ref
    cfg, model = _model(folder, "clone.nemo")
    codec = load_codec(folder / "codec_replicate.nemo")
    ctx = reference_context(model, codec, folder / "clip.wav", min_seconds=0.1)
    return cfg, model, codec, ctx


@pytest.mark.parametrize("kind", ["replicate", "reflect", "causal"])
def test_encoder_codes_match_nemo(ref, kind):
    folder, npz, _ = ref
    codec = load_codec(folder / f"codec_{kind}.nemo", encoder=True)
    latent = codec.encode_latent(mx.array(npz["clip_long"][None]))  # (1, T, 32)
    assert_rel(np.array(latent).transpose(0, 2, 1), npz[f"enc_{kind}_latent"])
    codes = np.array(codec.quantize(latent))
    np.testing.assert_array_equal(codes, npz[f"enc_{kind}_codes"])


def test_context_window_and_codes_match_nemo(ref, plain):
    folder, npz, meta = ref
    _, model, codec, _ = plain
    assert codec.has_encoder  # added from the codec's file by reference_context
    a, sr, spf = model.args, codec.args.sample_rate, codec.args.samples_per_frame
    clip = npz["clip"]
    window = context_window(clip, context_seconds(a.context_duration, len(clip) / sr), sr, spf)
    np.testing.assert_array_equal(window, npz["context_audio"])  # the clip tiled to 206 frames
    want = npz["context_codes"]  # (1, 8, 208) with the context BOS and EOS
    assert (want[:, :, 0] == a.context_audio_bos_id).all() and (want[:, :, -1] == a.context_audio_eos_id).all()
    np.testing.assert_array_equal(np.array(codec.encode(mx.array(window[None]))), want[:, :, 1:-1])


def test_context_encoder_and_decoder_input_match_nemo(ref, plain):
    _, npz, _ = ref
    _, model, _, ctx = plain
    assert_rel(ctx, npz["context_encoder_out"])
    x = mx.concatenate([ctx, model.embed_codes(mx.array(npz["teacher_decoder_input_codes"]))], axis=1)
    assert_rel(x, npz["decoder_input_embedded"])
    memory = model.encode_text(mx.array(npz["text_ids"]))
    assert_rel(model.logits(model.decoder_hidden(x, memory)), npz["decoder_logits"])


@pytest.mark.parametrize("use_cfg", [False, True], ids=["nocfg", "cfg"])
@pytest.mark.parametrize("recompute", [True, False], ids=["uncached", "cached"])
def test_greedy_codes_with_cloned_context_match_nemo(ref, plain, use_cfg, recompute):
    from metalgen.magpie.generate import MagpieSampling, generate_codes

    _, npz, meta = ref
    cfg, model, _, ctx = plain
    codes = generate_codes(model, npz["text_ids"][0], ctx, MagpieSampling.from_config(cfg), cfg=use_cfg,
                           max_frames=meta["greedy_frames"], recompute=recompute)
    tag = ("" if recompute else "cached_") + ("cfg" if use_cfg else "nocfg")
    np.testing.assert_array_equal(codes, npz[f"greedy_codes_{tag}"])


def test_text_conditioning_and_frame_stacking_context_match_nemo(ref):
    """Frame stacking 2 with use_text_conditioning_encoder: NeMo pads the 51 stacked context rows
    with zero rows to 102 (the padded "no text context" length) before the context encoder."""
    folder, npz, _ = ref
    _, model = _model(folder, "clone_s2tc.nemo")
    codec = load_codec(folder / "codec_lowrate.nemo")
    ctx = reference_context(model, codec, npz["s2tc_clip"], sample_rate=codec.args.sample_rate, min_seconds=1.0)
    assert_rel(ctx, npz["s2tc_context_encoder_out"])
    x = mx.concatenate([ctx, model.embed_codes(mx.array(npz["s2tc_teacher_decoder_input_codes"]))], axis=1)
    assert_rel(x, npz["s2tc_decoder_input_embedded"])


# --- no dump needed ---------------------------------------------------------------------------


def _stack(layers, causal=True, kernel=1, **kw):
    return dict(n_layers=layers, d_model=16, d_ffn=32, sa_n_heads=2, kernel_size=kernel, is_causal=causal,
                max_length_causal_mask=512, use_learnable_pos_emb=True, apply_norm_out=True, **kw)


def _tiny(baked: bool):
    """A random-free (zero-weight) decoder_ce model: baked speakers, or a context encoder; 5 s of
    context (the published configs' value) and a 16-sample codec frame at 1600 Hz."""
    cfg = dict(model_type="decoder_ce", embedding_dim=16, frame_stacking_factor=2, local_transformer_type="none",
               context_duration_min=5.0, context_duration_max=5.0,
               encoder=_stack(1, kernel=3), context_encoder=_stack(1, causal=False, kernel=3),
               decoder=_stack(1, has_xattn=True, xa_d_memory=16, xa_n_heads=1))
    shapes = {f"audio_embeddings.{j}.weight": (2024, 16) for j in range(16)}
    shapes["text_embedding.weight"] = (12, 16)
    if baked:
        shapes["baked_context_embedding.weight"] = (3, 4 * 16)
    model = Model(MagpieArgs.from_config(cfg, shapes=shapes))
    codec_cfg = {"sample_rate": 1600, "samples_per_frame": 16,
                 "vector_quantizer": {"_target_": "x.GroupFiniteScalarQuantizer", "num_groups": 8,
                                      "num_levels_per_group": [8, 7, 6, 6]},
                 "audio_encoder": {"_target_": "x.HiFiGANEncoder", "encoded_dim": 32, "down_sample_rates": [4, 4],
                                   "base_channels": 2, "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [1]},
                 "audio_decoder": {"_target_": "x.CausalHiFiGANDecoder", "input_dim": 32, "up_sample_rates": [4, 4],
                                   "base_channels": 8}}
    return model, NanoCodec(NanoCodecArgs.from_config(codec_cfg), encoder=True)


def _error(*args, **kw) -> str:
    with pytest.raises(MetalgenError) as e:
        reference_context(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_baked_checkpoint_refuses_cloning():
    model, codec = _tiny(baked=True)
    assert "context_encoder" not in model
    msg = _error(model, codec, np.ones(3200, np.float32), sample_rate=1600)
    assert "needs a Magpie checkpoint with a context encoder" in msg and "speaker=0..2" in msg


def test_bad_clips_are_refused(tmp_path):
    model, codec = _tiny(baked=False)
    rng = np.random.default_rng(0)
    assert "too short: 0.50 s, the minimum is 1 s" in _error(model, codec, rng.standard_normal(800), sample_rate=1600)
    assert "is silent" in _error(model, codec, np.zeros(3200, np.float32), sample_rate=1600)
    assert "does not exist" in _error(model, codec, tmp_path / "missing.wav")
    (tmp_path / "junk.wav").write_text("not audio")
    assert "could not read" in _error(model, codec, tmp_path / "junk.wav")
    import soundfile as sf

    sf.write(str(tmp_path / "short.wav"), rng.standard_normal(8000) * 0.1, 16000)
    assert "short.wav is too short: 0.50 s, the minimum is 1 s" in _error(model, codec, tmp_path / "short.wav")


def test_context_shape_and_window_rules():
    model, codec = _tiny(baked=False)
    # 2 s at 16 kHz: resampled to 1600 Hz, tiled to 5 s = 500 frames, + BOS / EOS, stacked by 2.
    wav = 0.1 * np.random.default_rng(1).standard_normal(32000).astype(np.float32)
    ctx = reference_context(model, codec, (wav, 16000))
    assert ctx.shape == (1, 251, 16)
    assert context_seconds((3.0, 10.0), 7.0) == 5.0  # NeMo's runner fixes a range around 5 s at 5 s
    assert context_seconds((5.0, 10.0), 7.0) == 7.0 and context_seconds((5.0, 10.0), 2.0) == 5.0
    clip = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(context_window(clip, 1.5, 10, 4), np.concatenate([clip, clip[:2]]))
    np.testing.assert_array_equal(context_window(clip, 0.5, 10, 4), clip[:4])


def test_codec_encoder_comes_from_the_codec_file_only():
    from metalgen.magpie.codec_file import load_encoder

    model, codec = _tiny(baked=False)
    bare = NanoCodec(codec.args)  # decoder only, made in memory: no file to read the encoder from
    with pytest.raises(MetalgenError, match="not loaded from a file"):
        load_encoder(bare)
    assert "not loaded from a file" in _error(model, bare, np.ones(16000, np.float32), sample_rate=1600)
    assert load_encoder(codec) is codec  # has one already: nothing to read


def test_api_and_cli_clone_from_ref_audio(ref, tmp_path, capsys):
    """MagpieTTS.codes(ref_audio=...) is generation on reference_context's context; the CLI's
    --ref-audio reaches it (a clip under the API's one-second minimum is refused in one line)."""
    import soundfile as sf

    from metalgen import magpie
    from metalgen.cli import main
    from metalgen.magpie.generate import generate_codes

    folder, _, _ = ref
    tts = magpie.load(folder / "clone.nemo", codec=folder / "codec_replicate.nemo")
    wav, sr = sf.read(folder / "clip.wav", dtype="float32")
    long_clip = tmp_path / "long.wav"
    sf.write(long_clip, np.tile(wav, 12), sr)  # 1.3 s
    got = tts.codes("Hello there.", ref_audio=long_clip, temperature=0.0, max_frames=8)
    ctx = reference_context(tts.model, tts.codec, long_clip)
    want = generate_codes(tts.model, tts.encode("Hello there."), ctx, tts.sampling_for(temperature=0.0, max_frames=8))
    np.testing.assert_array_equal(got, want)

    out = tmp_path / "x.wav"
    args = ["tts", "--model", str(folder / "clone.nemo"), "--codec", str(folder / "codec_replicate.nemo"),
            "--text", "Hello.", "--out", str(out), "--max-frames", "4"]
    assert main([*args, "--ref-audio", str(folder / "clip.wav")]) == 1
    assert "too short" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--ref-audio", str(long_clip)]) == 0 and out.exists()
