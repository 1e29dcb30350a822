"""Magpie TTS transformer (metalgen/models/magpie/model.py) against NeMo 3.0.0 on the tiny reference
dump (tests/magpie_ref/make_reference.py): text encoder, decoder (conditional and CFG-unconditional
rows), final_proj and teacher-forced local-transformer logits. Skipped, with the reason, until
`bash tests/magpie_ref/setup_venv.sh` has been run."""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest

from magpie_ref.harness import reference_folder, reference_model


@pytest.fixture(scope="module")
def ref():
    return reference_model(reference_folder())


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def run(ref):
    """Our forward passes on the dump's inputs, as make_reference.py made each array."""
    m, z = ref["model"], ref["npz"]
    ids = mx.array(z["text_ids"])
    memory = m.encode_text(ids)
    ctx = m.speaker_context(ref["meta"]["speaker_index"])
    dec_in = mx.concatenate([ctx, m.embed_codes(mx.array(z["teacher_decoder_input_codes"]))], axis=1)
    h = m.decoder_hidden(dec_in, memory)
    # CFG's unconditional row: zero memory with only text position 0 valid, zero context rows.
    L, n_ctx = memory.shape[1], ctx.shape[1]
    u_mask = mx.arange(L)[None] == 0
    u_in = mx.concatenate([mx.zeros_like(ctx), dec_in[:, n_ctx:]], axis=1)
    h_u = m.decoder_hidden(u_in, mx.zeros_like(memory), memory_mask=u_mask)
    out = dict(
        text_embedded=m.text_embedding(ids),
        text_encoder_out=memory,
        baked_context=ctx,
        decoder_input_embedded=dec_in,
        decoder_out=h,
        decoder_logits=m.logits(h),
        decoder_logits_uncond=m.logits(h_u),
        local_transformer_logits=m.local_transformer_logits(h[:, n_ctx:], mx.array(z["teacher_codes"])),
    )
    mx.eval(out)
    return {k: np.array(v) for k, v in out.items()}


def test_args_from_config_and_shapes(ref):
    from metalgen.models.magpie.model import MagpieArgs

    a, meta = ref["model"].args, ref["meta"]
    ids, cfg = meta["ids"], meta["magpie_config"]
    assert (a.num_codebooks, a.num_tokens_per_codebook, a.codebook_size) == (
        ids["num_codebooks"], ids["num_all_tokens_per_codebook"], ids["codebook_size"])
    assert (a.audio_bos_id, a.audio_eos_id, a.context_audio_bos_id, a.context_audio_eos_id, a.mask_token_id) == (
        ids["audio_bos_id"], ids["audio_eos_id"], ids["context_audio_bos_id"], ids["context_audio_eos_id"],
        ids["mask_token_id"])
    assert (a.text_bos_id, a.text_eos_id) == (ids["text_bos_id"], ids["text_eos_id"])
    assert a.frame_stacking_factor == cfg["frame_stacking_factor"]
    assert a.lt_in_projection and a.local_transformer.d_model == cfg["local_transformer_hidden_dim"]
    assert a.local_transformer.max_length_causal_mask == a.n_heads_out + 2
    assert (a.n_speakers, a.baked_context_len) == (2, ref["npz"]["baked_context"].shape[1])
    # The codec's FSQ config gives the same C and V when the tensors are not at hand.
    codec = meta["codec_config"]
    shapes = {"text_embedding.weight": ref["weights"]["text_embedding.weight"].shape}
    b = MagpieArgs.from_config(ref["cfg"], shapes=shapes, codec_cfg=codec)
    assert (b.num_codebooks, b.num_tokens_per_codebook, b.codebook_size) == (
        a.num_codebooks, a.num_tokens_per_codebook, a.codebook_size)


def test_strict_load_reports_a_missing_tensor(ref):
    from metalgen.errors import MetalgenError
    from metalgen.models.magpie.model import Model

    weights = {k: v for k, v in ref["weights"].items() if k != "decoder.layers.0.norm_self.weight"}
    with pytest.raises(MetalgenError, match="decoder.layers.0.norm_self.weight"):
        Model.from_weights(ref["cfg"], weights)


@pytest.mark.parametrize("name", ["text_embedded", "text_encoder_out", "baked_context"])
def test_text_side_within_1e5(run, ref, name):
    assert rel_err(run[name], ref["npz"][name]) < 1e-5


@pytest.mark.parametrize("name", ["decoder_input_embedded", "decoder_out", "decoder_logits",
                                  "decoder_logits_uncond", "local_transformer_logits"])
def test_decoder_and_local_transformer_within_1e4(run, ref, name):
    assert rel_err(run[name], ref["npz"][name]) < 1e-4


def test_uncond_branch_differs_from_cond(run):
    """Guards the test above against a memory mask or zeroed context that has no effect."""
    assert rel_err(run["decoder_logits_uncond"], run["decoder_logits"]) > 1e-2


def test_explicit_cross_attention_path(ref, run):
    """With a prior of ones (a no-op after renormalizing) the hand-written softmax path runs; it
    must give the fused path's values, and its probabilities are distributions over the text."""
    m, z = ref["model"], ref["npz"]
    memory = mx.array(run["text_encoder_out"])
    dec_in = mx.array(run["decoder_input_embedded"])
    kv = m.decoder_memory(memory)
    prior = mx.ones((1, 1, memory.shape[1]))
    h, probs = m.decoder_hidden(dec_in, kv, attn_prior=prior, return_attention=True)
    assert rel_err(np.array(h), z["decoder_out"]) < 1e-4
    a = m.args.decoder
    assert len(probs) == a.n_layers
    p = np.array(probs[0])
    assert p.shape == (1, a.xa_n_heads, dec_in.shape[1], memory.shape[1])
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    # A prior that hides all but text position 3 puts all of every row's weight there.
    one_hot = (mx.arange(memory.shape[1]) == 3).astype(mx.float32)[None, None]
    _, probs = m.decoder_hidden(dec_in, kv, attn_prior=one_hot, return_attention=True)
    np.testing.assert_allclose(np.array(probs[-1])[..., 3], 1.0, atol=1e-5)


@pytest.mark.parametrize("explicit", [False, True])
def test_padded_memory_is_hidden(ref, run, explicit):
    """The dump's unconditional row cannot test the memory mask (a zero memory gives zero keys and
    values, masked or not), so: text padded with other rows, masked, must change nothing."""
    m, z = ref["model"], ref["npz"]
    ids = mx.array(z["text_ids"])
    L, pad = ids.shape[1], 5
    padded = mx.concatenate([ids, ids[:, :pad]], axis=1)
    valid = mx.arange(L + pad)[None] < L
    memory = m.encode_text(padded, mask=valid)
    assert rel_err(np.array(memory[:, :L]), z["text_encoder_out"]) < 1e-5
    assert float(mx.abs(memory[:, L:]).max()) == 0.0  # NeMo zeroes padded rows
    memory = mx.concatenate([memory[:, :L], mx.array(np.random.default_rng(0).normal(size=(1, pad, m.args.d_model)),
                                                     dtype=mx.float32)], axis=1)
    dec_in = mx.array(run["decoder_input_embedded"])
    if explicit:
        h, probs = m.decoder_hidden(dec_in, memory, memory_mask=valid, return_attention=True)
        assert float(mx.abs(probs[0][..., L:]).max()) == 0.0
    else:
        h = m.decoder_hidden(dec_in, memory, memory_mask=valid)
    assert rel_err(np.array(h), z["decoder_out"]) < 1e-4


def test_cached_decoder_equals_full_pass(ref, run):
    """Row-by-row decoding on per-layer KV caches gives the full pass's hidden states."""
    m = ref["model"]
    memory = m.decoder_memory(mx.array(run["text_encoder_out"]))
    dec_in = mx.array(run["decoder_input_embedded"])
    n_ctx = ref["npz"]["baked_context"].shape[1]
    cache = m.decoder.make_cache()
    rows = [m.decoder_hidden(dec_in[:, :n_ctx], memory, cache=cache)]
    for t in range(n_ctx, dec_in.shape[1]):
        rows.append(m.decoder_hidden(dec_in[:, t : t + 1], memory, cache=cache))
    assert rel_err(np.array(mx.concatenate(rows, axis=1)), run["decoder_out"]) < 1e-5


@pytest.mark.parametrize("cached", [False, True])
def test_local_step_matches_teacher_forcing(ref, run, cached):
    """The per-code step API, fed the teacher codes, reproduces NeMo's teacher-forced LT logits."""
    m, z = ref["model"], ref["npz"]
    a = m.args
    n_ctx, V = z["baked_context"].shape[1], a.num_tokens_per_codebook
    codes = z["teacher_codes"][0]  # (C, T), S = 1 here
    want = z["local_transformer_logits"][0]  # (T, C * V)
    for t in (0, codes.shape[1] - 1):
        h = mx.array(run["decoder_out"][:, n_ctx + t])  # (1, d)
        cache = m.make_local_cache() if cached else None
        seq = m.local_start(h)
        new = seq
        for j in range(a.n_heads_out):
            logits = m.local_step(new if cached else seq, j, cache)
            assert rel_err(np.array(logits)[0], want[t, j * V : (j + 1) * V]) < 1e-4
            new = m.local_embed(mx.array([int(codes[j % a.num_codebooks, t])]), j)
            seq = mx.concatenate([seq, new], axis=1)


def test_frame_stacking_layout(ref):
    """The current published revision's layout (S = 2, an LT as wide as the decoder, so no
    in-projection) on the dump's config with random weights: shapes, and the step API against
    teacher forcing, since the dump itself has S = 1."""
    from metalgen.models.magpie.model import MagpieArgs, Model

    cfg = dict(ref["cfg"], frame_stacking_factor=2, local_transformer_n_layers=2, local_transformer_n_heads=2,
               local_transformer_hidden_dim=ref["cfg"]["embedding_dim"])
    C, V, d = 8, 2024, cfg["embedding_dim"]
    shapes = {f"audio_embeddings.{j}.weight": (V, d) for j in range(2 * C)}
    shapes.update({"text_embedding.weight": (701, d), "baked_context_embedding.weight": (2, 6 * d)})
    a = MagpieArgs.from_config(cfg, shapes=shapes)
    assert (a.num_codebooks, a.frame_stacking_factor, a.n_heads_out, a.lt_in_projection) == (C, 2, 16, False)
    assert a.local_transformer.max_length_causal_mask == 18
    mx.random.seed(0)
    m = Model(a)
    assert "local_transformer_in_projection" not in m and m.final_proj.weight.shape == (2 * C * V, d)
    codes = mx.random.randint(0, 2016, (1, C, 5))  # odd: padded to 6 frames = 3 positions
    emb = m.embed_codes(codes)
    assert emb.shape == (1, 3, d)
    h = mx.random.normal((1, 3, d))
    want = np.array(m.local_transformer_logits(h, codes))
    assert want.shape == (1, 3, 2 * C * V)
    padded = np.pad(np.array(codes)[0], [(0, 0), (0, 1)])  # (C, 6)
    t = 1
    seq = m.local_start(h[:, t])
    for j in range(a.n_heads_out):
        got = np.array(m.local_step(seq, j))[0]
        assert rel_err(got, want[0, t, j * V : (j + 1) * V]) < 1e-5
        i, c = divmod(j, C)  # stacked frame i, codebook c
        seq = mx.concatenate([seq, m.local_embed(mx.array([int(padded[c, 2 * t + i])]), j)], axis=1)


def test_speaker_index_checked(ref):
    from metalgen.errors import MetalgenError

    with pytest.raises(MetalgenError, match="speaker index"):
        ref["model"].speaker_context(ref["model"].args.n_speakers)
