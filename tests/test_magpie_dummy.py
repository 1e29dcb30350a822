"""dummy:magpie-357m / -357m-v2512 (shapes only: nothing is allocated) and dummy:magpie-tiny (built
and run): the configs read by the loader's own parsers give docs/magpie.md's shapes."""

from __future__ import annotations

import numpy as np
import pytest

import metalgen.tts
from metalgen.errors import MetalgenError


def _shapes(shape):
    """Parameter shapes of the dummy's Model, without evaluating (allocating) any of them."""
    from mlx.utils import tree_flatten

    from metalgen.magpie.dummy import dummy_args
    from metalgen.models.magpie.model import Model

    return {k: tuple(v.shape) for k, v in tree_flatten(Model(dummy_args(shape)).parameters())}


# docs/magpie.md's table: (S, tables, final_proj rows, LT layers / width / heads, in-projection,
# LT positions, baked context frames, text rows)
@pytest.mark.parametrize("shape, S, lt, in_proj, ctx, vocab", [
    ("magpie-357m", 2, (2, 768, 12), False, 217, 3359),
    ("magpie-357m-v2512", 1, (1, 256, 1), True, 110, 2380),
])
def test_real_shapes(shape, S, lt, in_proj, ctx, vocab):
    from metalgen.magpie.dummy import dummy_args

    a = dummy_args(shape)
    assert (a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook, a.codebook_size) == (8, S, 2024, 2016)
    assert (a.d_model, a.encoder.n_layers, a.decoder.n_layers, a.encoder.kernel_size) == (768, 6, 12, 3)
    assert (a.decoder.xa_n_heads, a.decoder.xa_head_dim) == (1, 128)
    assert (a.local_transformer.n_layers, a.local_transformer.d_model, a.local_transformer.sa_n_heads) == lt
    assert a.lt_in_projection is in_proj
    assert (a.n_speakers, a.baked_context_len, a.text_vocab_size) == (5, ctx, vocab)
    assert (a.text_bos_id, a.text_eos_id, a.audio_bos_id, a.audio_eos_id) == (vocab - 2, vocab - 1, 2016, 2017)
    shapes = _shapes(shape)
    assert shapes["final_proj.weight"] == (8 * 2024 * S, 768)
    assert sum(k.startswith("audio_embeddings.") for k in shapes) == 8 * S
    assert shapes["local_transformer.position_embeddings.weight"] == (8 * S + 2, lt[1])
    assert shapes["baked_context_embedding.weight"] == (5, ctx * 768)
    assert ("local_transformer_in_projection.weight" in shapes) is in_proj


def test_nanocodec_shapes():
    from metalgen.magpie.dummy import NANOCODEC
    from metalgen.models.magpie.codec import NanoCodecArgs

    c = NanoCodecArgs.from_config(NANOCODEC)
    assert (c.num_codebooks, c.num_levels_per_group, c.codebook_size, c.input_dim) == (8, [8, 7, 6, 6], 2016, 32)
    assert (c.base_channels, c.up_sample_rates) == (864, [8, 8, 4, 2, 2])
    assert (c.sample_rate, c.samples_per_frame) == (22050, 1024)
    assert (c.activation, c.output_activation) == ("half_snake", "clamp")


@pytest.fixture(scope="module")
def tiny():
    return metalgen.tts.load("dummy:magpie-tiny")


def test_tiny(tiny):
    from metalgen.magpie import MagpieTTS

    assert isinstance(tiny, MagpieTTS) and tiny.model_type == "magpie" and tiny.name == "dummy:magpie-tiny"
    assert tiny.speakers == ["Aria", "Jason", "John", "Leo", "Sofia"]
    assert tiny.languages == ["de", "en", "es", "fr", "hi", "it", "ja", "vi"]
    assert tiny.frame_rate == pytest.approx(21.5)
    a = tiny.model.args
    ids = tiny.encode("Hello.", "english")  # names as well as codes
    assert ids[-1] == a.text_eos_id == tiny.text.text_eos_id and max(ids[:-1]) < a.text_bos_id
    assert int(tiny.model.baked_context_embedding_len[0]) == a.baked_context_len
    wav, sr = tiny.synthesize("Hello.", "en", "sofia", seed=1, max_frames=6)
    again, _ = tiny.synthesize("Hello.", "EN", 4, seed=1, max_frames=6)
    assert sr == 344 and wav.shape == (6 * 16,) and np.isfinite(wav).all() and np.abs(wav).max() > 0
    np.testing.assert_array_equal(wav, again)  # a name and its index, a code in any case


def test_tiny_errors(tiny, monkeypatch):
    import metalgen.magpie.ja_g2p as ja

    def missing(name):
        raise MetalgenError(f"the Magpie tokenizer '{name}' (Japanese) needs pyopenjtalk, which is not installed")

    monkeypatch.setattr(ja, "_frontend", missing)  # the published Japanese entry, on a machine without pyopenjtalk
    with pytest.raises(MetalgenError, match="tokenizer 'japanese_phoneme' .Japanese. needs pyopenjtalk"):
        tiny.synthesize("こんにちは。", "ja")
    with pytest.raises(MetalgenError, match="unknown dummy Magpie shape 'magpie-huge'"):
        metalgen.tts.load("dummy:magpie-huge")
    with pytest.raises(MetalgenError, match="Magpie does not take the option"):
        tiny.synthesize("Hi.", "en", top_p=0.9)
