"""metalgen.models.magpie.codec (NanoCodec's FSQ dequantization and causal HiFi-GAN decoder)
against NeMo.

The parity tests read the Magpie reference dump (tests/magpie_ref/, NeMo 3.0.0) and skip without
it. The small tests below need no dump: the grouped transposed conv and the weight-norm folding
and layouts against torch (skipped without torch), the activations against their formulas."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from magpie_ref.harness import reference_folder
from metalgen.errors import MetalgenError
from metalgen.magpie.codec_file import load_codec
from metalgen.models.magpie.codec import (
    CodecActivation,
    NanoCodecArgs,
    SymmetricConv,
    grouped_conv_transpose1d,
    sanitize,
)


@pytest.fixture(scope="module")
def ref():
    folder = reference_folder()
    return folder, np.load(folder / "magpie.npz")


@pytest.fixture(scope="module")
def codec(ref):
    return load_codec(ref[0] / "codec.nemo")


def assert_audio_close(got: mx.array, want: np.ndarray):
    got = np.array(got).reshape(-1)
    assert got.dtype == np.float32 and got.shape == want.shape
    corr = np.corrcoef(got, want)[0, 1]
    err = np.abs(got - want).max()
    # Different codes through this tiny random codec still correlate ~0.98 and differ by ~6e-3
    # (its output is mostly a DC offset), so the error bound is what tells a wrong decoder apart.
    assert corr > 0.9999, corr
    assert err < 1e-5, err


def test_dequantize_matches_nemo(ref, codec):
    _, npz = ref
    latent = codec.dequantize(mx.array(npz["codec_codes"]))
    assert latent.shape == npz["codec_latent"].shape
    np.testing.assert_allclose(np.array(latent), npz["codec_latent"], rtol=0, atol=1e-5)


def test_decode_random_codes_matches_nemo(ref, codec):
    _, npz = ref
    assert_audio_close(codec.decode(mx.array(npz["codec_codes"])), npz["codec_audio"])


@pytest.mark.parametrize("tag", ["nocfg", "cfg"])
def test_decode_generated_codes_matches_nemo(ref, codec, tag):
    _, npz = ref
    codes = mx.array(npz[f"greedy_codes_{tag}"])[None]  # (8, T) -> (1, 8, T)
    assert_audio_close(codec.decode(codes), npz[f"greedy_audio_{tag}"])


def test_codes_shape_is_checked(ref, codec):
    with pytest.raises(MetalgenError, match="codec codes"):
        codec.decode(mx.zeros((1, 7, 4), dtype=mx.int32))


# --- no dump needed ---------------------------------------------------------------------------


CONFIG = {
    "sample_rate": 22050,
    "samples_per_frame": 16,
    "vector_quantizer": {"_target_": "x.GroupFiniteScalarQuantizer", "num_groups": 2, "num_levels_per_group": [8, 7]},
    "audio_decoder": {"_target_": "x.CausalHiFiGANDecoder", "input_dim": 4, "up_sample_rates": [4, 4],
                      "base_channels": 8, "activation": "half_snake", "output_activation": "clamp"},
}


@pytest.mark.parametrize("cin, cout, groups, stride", [(8, 4, 4, 4), (6, 3, 3, 2), (4, 6, 1, 3), (8, 4, 2, 2)])
def test_grouped_conv_transpose_and_layout_match_torch(cin, cout, groups, stride):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(cin * 100 + cout * 10 + groups)
    conv = torch.nn.ConvTranspose1d(cin, cout, 2 * stride, stride, groups=groups)
    conv = torch.nn.utils.parametrizations.weight_norm(conv)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(2, cin, 5, generator=g)
    with torch.no_grad():
        want = conv(x).numpy()
    # sanitize folds the weight norm and converts the layout; the group rule is the decoder's
    # (one group per output channel), so only that case goes through it.
    prefix = "audio_decoder.up_sample_conv_layers.0.conv."
    state = {prefix + k: v.detach().numpy() for k, v in conv.state_dict().items()}
    if groups == cout:
        args = NanoCodecArgs.from_config(CONFIG)
        w = sanitize(args, state, "test")["audio_decoder.up_sample_conv_layers.0.conv.weight"]
    else:  # the same layout rule by hand for other group counts
        folded = conv.weight.detach().numpy()
        w = mx.array(folded.reshape(groups, cin // groups, cout // groups, -1).transpose(0, 2, 3, 1)
                     .reshape(cout, -1, cin // groups))
    got = grouped_conv_transpose1d(mx.array(x.numpy().transpose(0, 2, 1)), w, mx.array(conv.bias.detach().numpy()),
                                   stride)
    np.testing.assert_allclose(np.array(got).transpose(0, 2, 1), want, rtol=1e-5, atol=1e-5)


def test_activations_follow_nemo_formulas():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7)).astype(np.float32)
    alpha = (1.0 + 0.3 * rng.standard_normal(3)).astype(np.float32)
    half = CodecActivation("half_snake", 7)
    half.activation.snake_act.alpha = mx.array(alpha)
    got = np.array(half(mx.array(x)))
    snake = x[..., :3] + np.sin(alpha * x[..., :3]) ** 2 / (alpha + 1e-9)
    lrelu = np.where(x[..., 3:] > 0, x[..., 3:], 0.01 * x[..., 3:])
    np.testing.assert_allclose(got, np.concatenate([snake, lrelu], -1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(CodecActivation("lrelu", 7)(mx.array(x))), np.where(x > 0, x, 0.01 * x),
                               rtol=1e-6)


def test_fsq_values_and_config_refusals():
    from metalgen.models.magpie.codec import NanoCodec

    args = NanoCodecArgs.from_config(CONFIG)
    codec = NanoCodec(args)
    # code n -> digits (n % 8, n // 8 % 7) -> (d - 4) / 4 and (d - 3) / 3, per group.
    codes = mx.array([[[0, 55, 9], [17, 3, 54]]])
    want = []
    for n0, n1 in zip([0, 55, 9], [17, 3, 54]):
        want.append([(n0 % 8 - 4) / 4, (n0 // 8 % 7 - 3) / 3, (n1 % 8 - 4) / 4, (n1 // 8 % 7 - 3) / 3])
    np.testing.assert_allclose(np.array(codec.dequantize(codes))[0], np.array(want, np.float32).T, rtol=0, atol=1e-7)
    assert np.array(codec.decode(codes)).shape == (1, 3 * 16)
    bad = {**CONFIG, "audio_decoder": {**CONFIG["audio_decoder"], "activation": "gelu"}}
    with pytest.raises(MetalgenError, match="activation 'gelu'"):
        NanoCodecArgs.from_config(bad)
    bad = {**CONFIG, "vector_quantizer": {"_target_": "x.ResidualVectorQuantizer"}}
    with pytest.raises(MetalgenError, match="quantizer"):
        NanoCodecArgs.from_config(bad)


# --- the encoder (cloning); its parity with NeMo is in tests/test_magpie_clone.py -----------------


ENCODER = {"_target_": "x.HiFiGANEncoder", "encoded_dim": 4, "down_sample_rates": [4, 4], "base_channels": 2,
           "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [1], "pad_mode": "replicate"}


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("kernel, stride, dilation, padding", [(7, 1, 1, None), (3, 1, 3, None), (8, 4, 1, 2)])
def test_symmetric_conv_matches_torch(mode, kernel, stride, dilation, padding):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(kernel * 10 + dilation)
    pad = padding if padding else (kernel * dilation - dilation) // 2
    conv = torch.nn.Conv1d(3, 5, kernel, stride, padding=pad, dilation=dilation, padding_mode=mode)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(2, 3, 24, generator=g)
    with torch.no_grad():
        want = conv(x).numpy()
    ours = SymmetricConv(3, 5, kernel, stride, dilation, padding, mode)
    ours.conv.weight = mx.array(conv.weight.detach().numpy().transpose(0, 2, 1))
    ours.conv.bias = mx.array(conv.bias.detach().numpy())
    got = np.array(ours(mx.array(x.numpy().transpose(0, 2, 1)))).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fsq_quantize_inverts_dequantize_and_encoder_shapes():
    from metalgen.models.magpie.codec import NanoCodec

    cfg = {**CONFIG, "samples_per_frame": 16, "audio_encoder": ENCODER}
    codec = NanoCodec(NanoCodecArgs.from_config(cfg), encoder=True)
    codes = mx.array(np.arange(56).reshape(1, 2, 28) % 56)
    # Dequantized values times L // 2 are the integer levels k; inputs whose compressed value is
    # 0.99 k (the ends are only reached asymptotically) round back to k, so give the same codes.
    L = np.array([8, 7], np.float32)
    scale = (L - 1) / 2 * (1 - 1e-3)
    offset = np.where(L % 2 == 0, 0.5, 0.0).astype(np.float32)
    grid = np.array(codec.dequantize(codes)).transpose(0, 2, 1).reshape(1, 28, 2, 2) * (L // 2) * 0.99
    x = np.arctanh((grid + offset) / scale) - np.tan(offset / scale)
    got = codec.quantize(mx.array(x.reshape(1, 28, 4).astype(np.float32)))
    np.testing.assert_array_equal(np.array(got), np.array(codes))
    assert codec.encode(mx.zeros((1, 50))).shape == (1, 2, 4)  # 50 samples -> 4 frames of 16


def test_encoder_config_refusals():
    from metalgen.models.magpie.codec import NanoCodec

    args = NanoCodecArgs.from_config({**CONFIG, "audio_encoder": {**ENCODER, "_target_": "x.ResNetEncoder"}})
    assert args.encoder is None and "ResNetEncoder" in args.encoder_error
    with pytest.raises(MetalgenError, match="cannot encode audio: unsupported codec encoder 'ResNetEncoder'"):
        NanoCodec(args, encoder=True)
    args = NanoCodecArgs.from_config({**CONFIG, "audio_encoder": {**ENCODER, "down_sample_rates": [4, 2]}})
    assert "down-samples by 8, not samples_per_frame 16" in args.encoder_error
    with pytest.raises(MetalgenError, match="loaded without its encoder"):
        NanoCodec(NanoCodecArgs.from_config(CONFIG)).encode(mx.zeros((1, 32)))


def test_half_snake_is_snake_then_leaky_relu():
    # HalfSnake's one fused kernel against its definition: Snake on the first half of the channels,
    # LeakyReLU(0.01) on the rest
    import mlx.core as mx

    from metalgen.models.magpie.codec import HalfSnake, snake

    act = HalfSnake(10)
    act.snake_act.alpha = mx.array(np.random.default_rng(1).uniform(0.2, 3.0, 5).astype(np.float32))
    x = mx.array(np.random.default_rng(2).standard_normal((2, 7, 10)).astype(np.float32) * 3)
    want = mx.concatenate([snake(x[..., :5], act.snake_act.alpha), mx.maximum(0.01 * x[..., 5:], x[..., 5:])], axis=-1)
    np.testing.assert_array_equal(np.array(act(x)), np.array(want))


def test_a_codec_built_here_decodes_on_another_threads_stream():
    # the server decodes on its worker thread's own stream: nothing of the codec may be a pending
    # computation bound to the building thread's stream (HalfSnake's channel mask once was: a 500)
    import threading

    import mlx.core as mx

    from metalgen.magpie.dummy import load_dummy

    codec = load_dummy("magpie-tiny").codec
    codes = mx.array(np.random.default_rng(3).integers(0, 2016, (1, 8, 6)).astype(np.int32))
    out = {}

    def work():
        try:
            with mx.stream(mx.new_stream(mx.default_device())):
                out["wav"] = np.array(codec.decode(codes))
        except Exception as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in out, out.get("error")
    np.testing.assert_array_equal(out["wav"], np.array(codec.decode(codes)))
