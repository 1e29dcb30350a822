"""Qwen3-Omni against transformers' `qwen3_omni_moe` (fp32, CPU) on a tiny random checkpoint saved by
its own `save_pretrained` (tests/omni_reference.py): thinker logits and greedy tokens, the exact
states the talker receives from the thinker, talker and code-predictor logits and greedy codes over
32 frames, and the waveform."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_omni_moe")

import mlx.core as mx  # noqa: E402

from hf_checkpoints import rel_err  # noqa: E402
from omni_reference import reference_run, save_tiny_omni  # noqa: E402

FRAMES = 32
TOKENS = 8
MESSAGES = [{"role": "system", "content": "You are a helpful voice assistant."},
            {"role": "user", "content": "Say hello to the world."},
            {"role": "assistant", "content": "Hello, world!"},
            {"role": "user", "content": "Once more, with feeling."}]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    import metalgen.omni.loading as loading
    from metalgen.omni.prompt import thinker_ids

    folder = tmp_path_factory.mktemp("omni_tiny")
    torch_model = save_tiny_omni(folder)
    parts = loading.load(str(folder), dtype="float32")
    ids = thinker_ids(parts.tokenizer, parts.args, MESSAGES)
    # transformers drops the last frame's residual codes: one frame more gives FRAMES of them
    run = reference_run(torch_model, ids, thinker_tokens=TOKENS, frames=FRAMES + 1)
    return dict(folder=folder, torch=torch_model, parts=parts, ids=ids, run=run)


@pytest.fixture(scope="module")
def ours(ref):
    from metalgen.omni.generate import stream, talker_sampling

    frames, record = [], {}
    pieces, tokens = [], []
    for r in stream(ref["parts"], MESSAGES, max_tokens=TOKENS, talker=talker_sampling(temperature=0.0,
                    max_frames=FRAMES), first_chunk=None, gapless=False, frames_out=frames, record=record):
        if r.token is not None:
            tokens.append(r.token)
        if r.audio is not None:
            pieces.append(r.audio)
    loop = record["frames"]
    return dict(tokens=tokens, codes=np.stack(frames), wav=np.concatenate(pieces), loop=loop,
                talker_logits=np.stack(loop.talker_logits), cp_logits=np.stack(loop.cp_logits))


def test_thinker_logits_match(ref):
    import torch

    from metalgen.loading import load

    model, _ = load(str(ref["folder"]), dtype="float32")  # the text-only model of `metalgen generate`
    with torch.no_grad():
        want = ref["torch"].thinker(input_ids=torch.tensor([ref["ids"]])).logits[0].numpy()
    got = np.array(model(mx.array([ref["ids"]]))[0])
    assert rel_err(got, want) < 1e-4
    got_parts = np.array(ref["parts"].model.thinker(mx.array([ref["ids"]]))[0])
    assert rel_err(got_parts, want) < 1e-4


def test_greedy_text_tokens_match(ref, ours):
    assert ours["tokens"] == ref["run"]["tokens"]


def test_text_model_generates_the_same_tokens(ref):
    from metalgen.generate import generate_step
    from metalgen.loading import load

    model, _ = load(str(ref["folder"]), dtype="float32")
    got = [t for t, _ in generate_step(mx.array(ref["ids"]), model, max_tokens=TOKENS)]
    assert got == ref["run"]["tokens"]


def test_talker_receives_exactly_the_thinker_states_transformers_passes(ref, ours):
    """The talker's prompt (user turns text-projected, the assistant turn with its codec control
    ids and speaker), the trailing text it reads a frame at a time, and tts_pad."""
    loop, run = ours["loop"], ref["run"]
    prompt = np.array(loop.prompt.embeddings[0])
    assert prompt.shape == run["talker_embeds"].shape
    assert rel_err(prompt, run["talker_embeds"]) < 1e-5
    text = loop.text
    trailing = np.concatenate([np.array(text.entry(j)[0]) for j in range(run["trailing"].shape[0])])
    assert rel_err(trailing, run["trailing"]) < 1e-5
    assert rel_err(np.array(text.entry(run["trailing"].shape[0])[0, 0]), run["tts_pad"]) < 1e-5


def test_talker_and_code_predictor_logits_match(ref, ours):
    run = ref["run"]
    n = min(len(ours["talker_logits"]), len(run["talker_logits"]))
    assert n >= FRAMES
    assert rel_err(ours["talker_logits"][:n], run["talker_logits"][:n]) < 1e-4
    m = min(len(ours["cp_logits"]), len(run["cp_logits"]))
    assert m >= FRAMES
    assert rel_err(ours["cp_logits"][:m], run["cp_logits"][:m]) < 1e-4


def test_greedy_codes_match_over_32_frames(ref, ours):
    want = ref["run"]["codes"]
    assert want.shape == (FRAMES, 16)
    np.testing.assert_array_equal(ours["codes"], want)


def test_waveform_matches(ref, ours):
    want = ref["run"]["wav"]
    got = ours["wav"]
    assert got.shape == want.shape
    assert np.corrcoef(got, want)[0, 1] > 0.9999


AUDIO_FRAMES = 12


@pytest.fixture(scope="module")
def audio_case(ref):
    """A spoken question (a 2.3 s chirp): transformers fed our log-mel features (test_omni_audio checks
    they equal its feature extractor's) and the same ids."""
    import torch

    from metalgen.omni.features import audio_token_count, log_mel
    from metalgen.omni.generate import stream, talker_sampling
    from metalgen.omni.prompt import thinker_ids

    t = np.arange(int(16000 * 2.3)) / 16000
    wav = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)
    feats = log_mel(wav)
    parts = ref["parts"]
    messages = [{"role": "user", "content": "What is this sound?"}]
    ids = thinker_ids(parts.tokenizer, parts.args, messages, [audio_token_count(feats.shape[1])])
    run = reference_run(ref["torch"], ids, thinker_tokens=TOKENS, frames=AUDIO_FRAMES + 1,
                        input_features=torch.tensor(feats)[None],
                        feature_attention_mask=torch.ones((1, feats.shape[1]), dtype=torch.long))
    frames, record, tokens = [], {}, []
    for r in stream(parts, messages, audio=[(wav, 16000)], max_tokens=TOKENS,
                    talker=talker_sampling(temperature=0.0, max_frames=AUDIO_FRAMES), frames_out=frames, record=record):
        if r.token is not None:
            tokens.append(r.token)
    return dict(ids=ids, run=run, tokens=tokens, codes=np.stack(frames), loop=record["frames"])


def test_audio_question_tokens_match(audio_case):
    assert audio_case["ids"].count(151675) > 10  # the clip's audio tokens are in the prompt
    assert audio_case["tokens"] == audio_case["run"]["tokens"]


def test_talker_receives_the_audio_hidden_states(audio_case):
    """At audio positions the talker reads hidden_projection(thinker state after accept_hidden_layer
    layers): the part of the hand-off that a port can get wrong without any text-only test noticing."""
    prompt = np.array(audio_case["loop"].prompt.embeddings[0])
    want = audio_case["run"]["talker_embeds"]
    assert prompt.shape == want.shape
    assert rel_err(prompt, want) < 1e-5
    np.testing.assert_array_equal(audio_case["codes"], audio_case["run"]["codes"])
