"""Magpie TTS (NeMo `MagpieTTSModel`, model_type decoder_ce with baked speakers) in MLX.

The text encoder, the decoder and the local transformer (LT) are one kind of stack, NeMo's
`transformer_2501.Transformer`: pre-norm layers of bias-free LayerNorm, fused-QKV self-attention
(causal or not), optional cross-attention to a memory, a convolutional feed-forward (kernel k,
left-padded when causal) and learned absolute positions. Module attributes carry the checkpoint's
key names so that `load_weights(strict=True)` maps the `.nemo` state dict one to one after
`Model.sanitize`.

The model returns hidden states and logits only: the generation loop (CFG rows, attention prior
construction, sampling, EOS) lives elsewhere and calls the methods below. docs/magpie.md holds the
plan and the NeMo facts this file follows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...cache import KVCache
from ...errors import MetalgenError
from ..layers import Linear
from ..qwen3_tts.speech_decoder import conv1d_gemm

# NeMo's SpecialAudioToken enum: ids codebook_size + k for these k; the tables hold 8 of them.
N_SPECIAL_AUDIO_TOKENS = 8
AUDIO_BOS, AUDIO_EOS, CONTEXT_BOS, CONTEXT_EOS, MASK_TOKEN = 0, 1, 2, 3, 4
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which NeMo keeps

# float32's smallest normal number: NeMo adds torch.finfo(dtype).tiny to the prior before
# multiplying it in, so that a zero prior never zeroes a whole row.
_TINY = float(np.finfo(np.float32).tiny)


# --------------------------------------------------------------------------------------- config


@dataclasses.dataclass
class StackArgs:
    """One `transformer_2501.Transformer`'s constructor arguments (defaults are NeMo's)."""

    n_layers: int
    d_model: int
    d_ffn: int
    sa_n_heads: int
    kernel_size: int
    has_xattn: bool = False
    xa_d_memory: Optional[int] = None
    xa_n_heads: Optional[int] = None
    xa_d_head: Optional[int] = None
    is_causal: bool = True
    apply_norm_to_cond: bool = True
    apply_norm_out: bool = False
    max_length_causal_mask: int = 4096
    use_learnable_pos_emb: bool = False

    @classmethod
    def from_dict(cls, name: str, cfg: Mapping[str, Any]) -> "StackArgs":
        if cfg.get("use_moe", False):
            raise MetalgenError(f"Magpie {name}: mixture-of-experts feed-forwards are not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = [k for k in ("n_layers", "d_model", "d_ffn", "sa_n_heads", "kernel_size") if k not in cfg]
        if missing:
            raise MetalgenError(f"Magpie config '{name}' lacks {', '.join(missing)}")
        args = cls(**{k: v for k, v in cfg.items() if k in fields})
        if args.has_xattn and (args.xa_d_memory is None or args.xa_n_heads is None):
            raise MetalgenError(f"Magpie config '{name}' has cross-attention without xa_d_memory/xa_n_heads")
        if not args.is_causal and args.kernel_size % 2 == 0:
            raise MetalgenError(f"Magpie config '{name}': a non-causal conv feed-forward needs an odd kernel")
        return args

    @property
    def head_dim(self) -> int:
        return self.d_model // self.sa_n_heads

    @property
    def xa_head_dim(self) -> int:
        return self.xa_d_head if self.xa_d_head is not None else self.d_model // self.xa_n_heads


def _shape(shapes: Optional[Mapping[str, Any]], key: str) -> Optional[Tuple[int, ...]]:
    """The shape of `key` in a {name: array or shape} mapping, or None."""
    if shapes is None or key not in shapes:
        return None
    v = shapes[key]
    return tuple(int(d) for d in (v.shape if hasattr(v, "shape") else v))


@dataclasses.dataclass
class MagpieArgs:
    """Everything the model's shapes depend on, from model_config.yaml and the tensor shapes.

    The codebook count C and the table width V (codes + 8 specials) come from the codec in NeMo,
    not from the Magpie config, so they are read off the `audio_embeddings.*` tables (or the
    codec's config when no weights are at hand); the text vocabulary and the baked speakers are
    read off their tensors. Nothing is hard-coded: the published revisions differ in frame
    stacking and LT width (docs/magpie.md)."""

    d_model: int
    encoder: StackArgs
    decoder: StackArgs
    local_transformer: Optional[StackArgs]
    local_transformer_type: str  # "autoregressive", "maskgit" or "none"
    lt_in_projection: bool  # a Linear into the LT when its width differs from the decoder's
    num_codebooks: int  # C
    frame_stacking_factor: int  # S: codec frames per decoder position
    num_tokens_per_codebook: int  # V = codebook_size + specials
    codebook_size: int
    text_vocab_size: int
    n_speakers: int
    baked_context_len: int  # T_ctx frames per baked speaker
    audio_bos_id: int
    audio_eos_id: int
    context_audio_bos_id: int
    context_audio_eos_id: int
    mask_token_id: int
    # Reference-audio cloning (checkpoints without baked speakers): the context encoder's stack,
    # the context duration NeMo's inference feeds it (min, max seconds) and whether the checkpoint
    # was trained with text conditioning (which pads the audio context, see Model.encode_context).
    context_encoder: Optional[StackArgs] = None
    context_duration: Tuple[float, float] = (5.0, 5.0)
    text_conditioning: bool = False

    @property
    def n_heads_out(self) -> int:
        """Audio tables / LT heads / final_proj blocks: one per (stacked frame, codebook)."""
        return self.num_codebooks * self.frame_stacking_factor

    @property
    def text_bos_id(self) -> int:
        return self.text_vocab_size - 2

    @property
    def text_eos_id(self) -> int:
        return self.text_vocab_size - 1

    @classmethod
    def from_config(
        cls,
        cfg: Mapping[str, Any],
        shapes: Optional[Mapping[str, Any]] = None,
        codec_cfg: Optional[Mapping[str, Any]] = None,
    ) -> "MagpieArgs":
        """`cfg`: the `.nemo`'s model_config.yaml as a dict. `shapes`: the state dict (arrays) or
        {key: shape}; it supplies C, V, the text vocabulary and the baked speakers. `codec_cfg`
        (the codec's config) is the fallback for C and V when `shapes` lacks the audio tables."""
        model_type = cfg.get("model_type")
        if model_type != "decoder_ce":
            raise MetalgenError(f"Magpie model_type '{model_type}' is not supported (only decoder_ce)")
        if cfg.get("use_bpe_char_tokenizer", False):
            raise MetalgenError("Magpie checkpoints with the char-aware subword encoder are not supported")
        d_model = int(cfg["embedding_dim"])
        encoder = StackArgs.from_dict("encoder", cfg["encoder"])
        decoder = StackArgs.from_dict("decoder", cfg["decoder"])
        if encoder.d_model != d_model or decoder.d_model != d_model:
            raise MetalgenError("Magpie: encoder/decoder d_model differ from embedding_dim")
        S = int(cfg.get("frame_stacking_factor", 1))

        # C and V: from the tables first, the codec's FSQ config second.
        n_tables = 0
        while _shape(shapes, f"audio_embeddings.{n_tables}.weight") is not None:
            n_tables += 1
        codebook_size = None
        if n_tables:
            if n_tables % S:
                raise MetalgenError(f"Magpie: {n_tables} audio tables is not a multiple of frame_stacking_factor {S}")
            C = n_tables // S
            V = _shape(shapes, "audio_embeddings.0.weight")[0]
        elif codec_cfg is not None and "vector_quantizer" in codec_cfg:
            vq = cfg.get("vector_quantizer") or codec_cfg["vector_quantizer"]
            C = int(vq["num_groups"])
            codebook_size = int(np.prod(vq["num_levels_per_group"]))
            V = int(cfg.get("forced_num_all_tokens_per_codebook", codebook_size + N_SPECIAL_AUDIO_TOKENS))
        else:
            raise MetalgenError("Magpie: the codebook count needs the audio_embeddings tensors or the codec config")
        if codebook_size is None:
            if "forced_num_all_tokens_per_codebook" in cfg and codec_cfg is not None:
                codebook_size = int(np.prod(codec_cfg["vector_quantizer"]["num_levels_per_group"]))
            else:
                codebook_size = V - N_SPECIAL_AUDIO_TOKENS

        text = _shape(shapes, "text_embedding.weight")
        if text is None:
            raise MetalgenError("Magpie: the text vocabulary size needs the text_embedding.weight tensor")

        baked = _shape(shapes, "baked_context_embedding.weight")
        n_speakers, baked_t = 0, 0
        if baked is not None:
            n_speakers = baked[0]
            if baked[1] % d_model:
                raise MetalgenError(f"Magpie: baked_context_embedding {baked} is not a multiple of d_model {d_model}")
            baked_t = baked[1] // d_model

        lt_type = str(cfg.get("local_transformer_type", "none")).lower()
        if lt_type not in ("none", "autoregressive", "maskgit"):
            raise MetalgenError(f"Magpie local_transformer_type '{lt_type}' is unknown")
        lt, lt_in = None, False
        if lt_type != "none":
            hidden = int(cfg.get("local_transformer_hidden_dim", 256))
            lt = StackArgs(
                n_layers=int(cfg.get("local_transformer_n_layers", 2)),
                d_model=hidden,
                d_ffn=4 * hidden,
                sa_n_heads=int(cfg.get("local_transformer_n_heads", 1)),
                kernel_size=1,
                is_causal=lt_type == "autoregressive",
                apply_norm_out=False,  # MagpieTTSModel builds the LT without a final norm
                max_length_causal_mask=C * S + 2,
                use_learnable_pos_emb=True,
            )
            lt_in = hidden != decoder.d_model

        special = lambda k: codebook_size + k  # noqa: E731
        return cls(
            d_model=d_model,
            encoder=encoder,
            decoder=decoder,
            local_transformer=lt,
            local_transformer_type=lt_type,
            lt_in_projection=lt_in,
            num_codebooks=C,
            frame_stacking_factor=S,
            num_tokens_per_codebook=V,
            codebook_size=codebook_size,
            text_vocab_size=text[0],
            n_speakers=n_speakers,
            baked_context_len=baked_t,
            audio_bos_id=int(cfg.get("forced_audio_bos_id", special(AUDIO_BOS))),
            audio_eos_id=int(cfg.get("forced_audio_eos_id", special(AUDIO_EOS))),
            context_audio_bos_id=int(cfg.get("forced_context_audio_bos_id", special(CONTEXT_BOS))),
            context_audio_eos_id=int(cfg.get("forced_context_audio_eos_id", special(CONTEXT_EOS))),
            mask_token_id=int(cfg.get("forced_mask_token_id", special(MASK_TOKEN))),
            # NeMo builds the context encoder for decoder_ce but leaves it out of baked checkpoints.
            context_encoder=(StackArgs.from_dict("context_encoder", cfg["context_encoder"])
                             if not n_speakers and cfg.get("context_encoder") else None),
            context_duration=(float(cfg.get("context_duration_min", 5.0)), float(cfg.get("context_duration_max", 5.0))),
            text_conditioning=bool(cfg.get("use_text_conditioning_encoder", False)),
        )


# --------------------------------------------------------------------------------------- layers


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm(d, bias=False): a weight, no bias, eps 1e-5 (not an RMSNorm)."""

    def __init__(self, dims: int):
        super().__init__()
        self.weight = mx.ones((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.layer_norm(x, self.weight, None, LAYER_NORM_EPS)


def _split_heads(y: mx.array, parts: int, heads: int, head_dim: int) -> List[mx.array]:
    """(B, T, parts * H * dh) -> `parts` arrays (B, H, T, dh): NeMo's fused projections lay the
    parts out as consecutive row blocks (Q | K | V, or K | V), each split into heads."""
    B, T, _ = y.shape
    y = y.reshape(B, T, parts, heads, head_dim).transpose(2, 0, 3, 1, 4)  # (parts, B, H, T, dh)
    return [y[i] for i in range(parts)]


def _merge_heads(y: mx.array) -> mx.array:
    """(B, H, T, dh) -> (B, T, H * dh)."""
    B, H, T, dh = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, H * dh)


class SelfAttention(nn.Module):
    """Fused-QKV self-attention without biases or rotary positions (positions are learned)."""

    def __init__(self, d_model: int, n_heads: int, is_causal: bool):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.is_causal = is_causal
        self.scale = self.head_dim ** -0.5
        self.qkv_net = Linear(d_model, 3 * n_heads * self.head_dim, bias=False)
        self.o_net = Linear(n_heads * self.head_dim, d_model, bias=False)

    def __call__(self, x: mx.array, x_mask: Optional[mx.array] = None, cache: Optional[KVCache] = None) -> mx.array:
        T = x.shape[1]
        q, k, v = _split_heads(self.qkv_net(x), 3, self.n_heads, self.head_dim)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        if x_mask is not None:
            # Padded keys are hidden. NeMo also hides padded *query* rows (their probabilities
            # are zeroed); here they attend normally, and the layer zeroes those rows itself, so
            # the valid rows get the same values without a fully masked (NaN) softmax row.
            mask = x_mask[:, None, None, :].astype(mx.bool_)  # (B, 1, 1, Tk)
            if self.is_causal:
                Tk = k.shape[2]
                tri = mx.tril(mx.ones((T, Tk), dtype=mx.bool_), k=Tk - T)
                mask = mask & tri
        elif getattr(cache, "key_mask", None) is not None:
            # A fixed-capacity cache (StaticKVCache) returns its whole buffer: hide the positions
            # not yet written. One new row sees every written one, so this is also the causal mask.
            if T != 1:
                raise MetalgenError("a static KV cache takes one row at a time")
            mask = cache.key_mask
        elif self.is_causal and T > 1:
            mask = "causal"  # lower-right aligned: also right for rows appended to a cache
        else:
            mask = None
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_net(_merge_heads(y))


class CrossAttention(nn.Module):
    """Attention from the stream to a memory (the text-encoder output), with its own head count
    and head width. Its keys and values depend only on the memory, so `memory_kv` computes them
    once per utterance. The attention prior of NeMo's inference multiplies the probabilities and
    renormalizes, so with a prior (or when the probabilities are wanted) the softmax is explicit."""

    def __init__(self, d_model: int, d_memory: int, n_heads: int, head_dim: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.q_net = Linear(d_model, n_heads * head_dim, bias=False)
        self.kv_net = Linear(d_memory, 2 * n_heads * head_dim, bias=False)
        self.o_net = Linear(n_heads * head_dim, d_model, bias=False)

    def memory_kv(self, memory: mx.array) -> Tuple[mx.array, mx.array]:
        """(B, L, d_memory) (already normalized) -> keys, values (B, H, L, dh)."""
        k, v = _split_heads(self.kv_net(memory), 2, self.n_heads, self.head_dim)
        return k, v

    def __call__(
        self,
        x: mx.array,
        kv: Tuple[mx.array, mx.array],
        memory_mask: Optional[mx.array] = None,
        prior: Optional[mx.array] = None,
        want_probs: bool = False,
    ) -> Tuple[mx.array, Optional[mx.array]]:
        """x (B, T, d) -> (output (B, T, d), probabilities (B, H, T, L) or None).

        `memory_mask` (B, L), true where the memory is valid. `prior` (B, T or 1, L) multiplies
        the probabilities of every head (NeMo: `p * (prior + tiny)`, renormalized)."""
        k, v = kv
        (q,) = _split_heads(self.q_net(x), 1, self.n_heads, self.head_dim)
        mask = None if memory_mask is None else memory_mask[:, None, None, :].astype(mx.bool_)  # (B, 1, 1, L)
        if prior is None and not want_probs:
            y = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
            return self.o_net(_merge_heads(y)), None
        scores = (q @ k.transpose(0, 1, 3, 2)) * self.scale  # (B, H, T, L)
        if mask is not None:
            scores = mx.where(mask, scores, -mx.inf)
        p = mx.softmax(scores, axis=-1, precise=True)
        if prior is not None:
            p = p * (prior[:, None] + _TINY)  # (B, 1, T|1, L): the same prior for every head
            p = p / p.sum(axis=-1, keepdims=True)
        if mask is not None:
            p = mx.where(mask, p, 0.0)
        y = p @ v
        return self.o_net(_merge_heads(y)), p


class _ConvWeight(nn.Module):
    """A bias-free Conv1d's weight, stored in MLX's (out, k, in) layout."""

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.weight = mx.zeros((cout, kernel, cin))

    def __call__(self, x: mx.array) -> mx.array:
        return conv1d_gemm(x, self.weight, None)


class ConvolutionLayer(nn.Module):
    """NeMo's ConvolutionLayer without bias, on (B, T, C) rows: causal stacks pad k - 1 zeros on
    the left only, the others (k - 1) / 2 on each side. A kernel of 1 is a plain Linear (the
    checkpoint's (out, in, 1) weight squeezed by `Model.sanitize`)."""

    def __init__(self, cin: int, cout: int, kernel: int, is_causal: bool):
        super().__init__()
        self.kernel = kernel
        self.pad = (kernel - 1, 0) if is_causal else ((kernel - 1) // 2, (kernel - 1) // 2)
        self.conv = Linear(cin, cout, bias=False) if kernel == 1 else _ConvWeight(cin, cout, kernel)

    def __call__(self, x: mx.array, x_mask: Optional[mx.array] = None) -> mx.array:
        if x_mask is not None:
            x = x * x_mask[..., None]  # padding must not leak into valid rows through the taps
        if self.kernel > 1:
            x = mx.pad(x, [(0, 0), self.pad, (0, 0)])
        y = self.conv(x)
        return y if x_mask is None else y * x_mask[..., None]


class PositionwiseConvFF(nn.Module):
    """proj (d -> d_ffn, kernel k) -> GELU (tanh form) -> o_net (d_ffn -> d, kernel k)."""

    def __init__(self, d_model: int, d_ffn: int, kernel: int, is_causal: bool):
        super().__init__()
        self.proj = ConvolutionLayer(d_model, d_ffn, kernel, is_causal)
        self.o_net = ConvolutionLayer(d_ffn, d_model, kernel, is_causal)

    def __call__(self, x: mx.array, x_mask: Optional[mx.array] = None) -> mx.array:
        # nn.gelu_approx is torch's GELU(approximate="tanh") formula.
        return self.o_net(nn.gelu_approx(self.proj(x, x_mask)), x_mask)


class TransformerLayer(nn.Module):
    """x += SA(LN(x)); [x += XA(LN(x), LN_mem(memory))]; x += FF(LN(x)), rows masked at both ends."""

    def __init__(self, a: StackArgs):
        super().__init__()
        self.has_xattn = a.has_xattn
        self.kernel_size = a.kernel_size
        self.norm_self = LayerNorm(a.d_model)
        self.self_attention = SelfAttention(a.d_model, a.sa_n_heads, a.is_causal)
        if a.has_xattn:
            self.norm_xattn_query = LayerNorm(a.d_model)
            self.cross_attention = CrossAttention(a.d_model, a.xa_d_memory, a.xa_n_heads, a.xa_head_dim)
            if a.apply_norm_to_cond:
                self.norm_xattn_memory = LayerNorm(a.xa_d_memory)
        self.norm_pos_ff = LayerNorm(a.d_model)
        self.pos_ff = PositionwiseConvFF(a.d_model, a.d_ffn, a.kernel_size, a.is_causal)

    def memory_kv(self, memory: mx.array) -> Tuple[mx.array, mx.array]:
        """This layer's cross-attention keys and values of `memory` (B, L, d_memory)."""
        if "norm_xattn_memory" in self:
            memory = self.norm_xattn_memory(memory)
        return self.cross_attention.memory_kv(memory)

    def __call__(
        self,
        x: mx.array,
        x_mask: Optional[mx.array] = None,
        cache: Optional[KVCache] = None,
        memory_kv: Optional[Tuple[mx.array, mx.array]] = None,
        memory_mask: Optional[mx.array] = None,
        prior: Optional[mx.array] = None,
        want_probs: bool = False,
    ) -> Tuple[mx.array, Optional[mx.array]]:
        if x_mask is not None:
            x = x * x_mask[..., None]
        x = x + self.self_attention(self.norm_self(x), x_mask, cache)
        probs = None
        if self.has_xattn and memory_kv is not None:
            y, probs = self.cross_attention(self.norm_xattn_query(x), memory_kv, memory_mask, prior, want_probs)
            x = x + y
        x = x + self.pos_ff(self.norm_pos_ff(x), x_mask)
        if x_mask is not None:
            x = x * x_mask[..., None]
        return x, probs


MemoryArg = Union[mx.array, Sequence[Tuple[mx.array, mx.array]], None]


class Transformer(nn.Module):
    """NeMo's `transformer_2501.Transformer`: learned positions, layers, optional norm_out."""

    def __init__(self, a: StackArgs):
        super().__init__()
        self.args = a
        self.layers = [TransformerLayer(a) for _ in range(a.n_layers)]
        if a.use_learnable_pos_emb:
            self.position_embeddings = nn.Embedding(a.max_length_causal_mask, a.d_model)
        if a.apply_norm_out:
            self.norm_out = LayerNorm(a.d_model)

    def make_cache(self) -> List[KVCache]:
        """One self-attention KVCache per layer, for row-by-row decoding (kernel-1 stacks only)."""
        if self.args.kernel_size != 1:
            raise MetalgenError("a conv feed-forward wider than 1 has no incremental form here")
        return [KVCache() for _ in self.layers]

    def memory_kv(self, memory: mx.array) -> List[Tuple[mx.array, mx.array]]:
        """Per-layer cross-attention keys and values of `memory` (B, L, d_memory): compute them
        once per utterance and pass the list as `memory` to every call."""
        return [layer.memory_kv(memory) for layer in self.layers]

    def __call__(
        self,
        x: mx.array,
        x_mask: Optional[mx.array] = None,
        cache: Optional[List[KVCache]] = None,
        memory: MemoryArg = None,
        memory_mask: Optional[mx.array] = None,
        attn_prior: Union[mx.array, Sequence[Optional[mx.array]], None] = None,
        return_attention: bool = False,
    ):
        """x (B, T, d) -> (B, T, d), or (that, per-layer cross-attention probabilities) when
        `return_attention`.

        `x_mask` (B, T): valid rows (padding). `cache`: per-layer KVCaches; x then holds only
        the new rows and positions continue from the cache's offset. `memory`: (B, L, d_memory)
        or `memory_kv(memory)`'s list. `attn_prior`: one (B, T|1, L) array for every layer, or a
        per-layer list with None where a layer gets none."""
        T = x.shape[1]
        offset = cache[0].offset if cache else 0
        if cache is not None and x_mask is not None:
            raise MetalgenError("Magpie stacks take no padding mask together with a cache")
        if cache is not None and self.args.kernel_size != 1:
            raise MetalgenError("a conv feed-forward wider than 1 has no incremental form here")
        if "position_embeddings" in self:
            table = self.position_embeddings.weight
            if isinstance(offset, mx.array):
                # A static cache's position is an array (one trace serves every position); its
                # capacity was checked against the table when it was made.
                x = x + mx.take(table, offset + mx.arange(T), axis=0)
            else:
                if offset + T > table.shape[0]:
                    raise MetalgenError(
                        f"Magpie sequence of {offset + T} positions exceeds the learned position table ({table.shape[0]})"
                    )
                x = x + table[offset : offset + T]
        kvs: List[Optional[Tuple[mx.array, mx.array]]] = [None] * len(self.layers)
        if memory is not None:
            kvs = list(self.memory_kv(memory)) if isinstance(memory, mx.array) else list(memory)
        if attn_prior is None or isinstance(attn_prior, mx.array):
            priors = [attn_prior] * len(self.layers)
        else:
            priors = list(attn_prior)
        probs = []
        for i, layer in enumerate(self.layers):
            x, p = layer(x, x_mask, None if cache is None else cache[i], kvs[i], memory_mask, priors[i],
                         return_attention)
            probs.append(p)
        if "norm_out" in self:
            x = self.norm_out(x)
        return (x, probs) if return_attention else x


# --------------------------------------------------------------------------------------- model


class Model(nn.Module):
    """MagpieTTSModel's inference modules, attribute names = state-dict keys:
    text_embedding, encoder, decoder, final_proj, audio_embeddings.{j}, local_transformer(+ its
    in-projection when narrower than the decoder), local_transformer_out_projections.{j},
    baked_context_embedding (+ baked_context_embedding_len), or context_encoder when no speakers
    are baked (reference-audio cloning)."""

    def __init__(self, args: MagpieArgs):
        super().__init__()
        self.args = args
        a = args
        n_out = a.n_heads_out
        self.text_embedding = nn.Embedding(a.text_vocab_size, a.d_model)
        self.encoder = Transformer(a.encoder)
        self.decoder = Transformer(a.decoder)
        self.final_proj = Linear(a.decoder.d_model, n_out * a.num_tokens_per_codebook, bias=True)
        self.audio_embeddings = [nn.Embedding(a.num_tokens_per_codebook, a.d_model) for _ in range(n_out)]
        if a.local_transformer is not None:
            h = a.local_transformer.d_model
            if a.lt_in_projection:
                self.local_transformer_in_projection = Linear(a.decoder.d_model, h, bias=True)
            self.local_transformer = Transformer(a.local_transformer)
            self.local_transformer_out_projections = [
                Linear(h, a.num_tokens_per_codebook, bias=True) for _ in range(n_out)
            ]
        if a.n_speakers:
            self.baked_context_embedding = nn.Embedding(a.n_speakers, a.baked_context_len * a.d_model)
            self.baked_context_embedding_len = mx.zeros((a.n_speakers,), dtype=mx.int32)
        if a.context_encoder is not None:
            self.context_encoder = Transformer(a.context_encoder)

    # ----------------------------------------------------------------------------- loading

    def sanitize(self, weights: Mapping[str, Any]) -> Dict[str, mx.array]:
        """The `.nemo` state dict (numpy or MLX arrays) -> this module's parameters: the causal-mask
        buffers and the baked T/D scalars (checked) are dropped, conv weights go from PyTorch's
        (out, in, k) to a Linear's (out, in) for k = 1 or MLX's (out, k, in) otherwise."""
        a = self.args
        out: Dict[str, mx.array] = {}
        for key, value in weights.items():
            if key.endswith(".causal_mask") or key.startswith("_codec_model."):
                continue
            if key.startswith("context_encoder.") and a.n_speakers:
                continue  # NeMo drops it on save when speakers are baked; never used then
            if key.startswith("context_text_embedding."):
                continue  # legacy text conditioning's own table: only a text context reads it
            if key in ("_baked_embedding_T", "_baked_embedding_D"):
                want = a.baked_context_len if key.endswith("T") else a.d_model
                if int(np.asarray(value)) != want:
                    raise MetalgenError(f"Magpie {key} = {int(np.asarray(value))} disagrees with the tensors ({want})")
                continue
            arr = value if isinstance(value, mx.array) else mx.array(np.asarray(value))
            if key.endswith(".conv.weight") and arr.ndim == 3:
                # (out, in, k) -> (out, in) when k = 1, else (out, k, in)
                arr = arr[..., 0] if arr.shape[2] == 1 else arr.transpose(0, 2, 1)
            if key == "baked_context_embedding_len":
                arr = arr.astype(mx.int32)
            out[key] = arr
        return out

    @classmethod
    def from_weights(
        cls, cfg: Mapping[str, Any], weights: Mapping[str, Any], source: str = "the checkpoint"
    ) -> "Model":
        """Build from model_config.yaml's dict and the state dict, load strictly, evaluate."""
        model = cls(MagpieArgs.from_config(cfg, shapes=weights))
        try:
            model.load_weights(list(model.sanitize(weights).items()), strict=True)
        except ValueError as e:
            why = " ".join(str(e).split())  # MLX lists the keys over several lines
            raise MetalgenError(f"Magpie weights in {source} do not match the config: {why}") from e
        mx.eval(model.parameters())
        return model

    # ----------------------------------------------------------------------------- text

    def encode_text(self, ids: mx.array, mask: Optional[mx.array] = None) -> mx.array:
        """Token ids (B, L) -> the cross-attention memory (B, L, d): text_embedding + encoder.
        `mask` (B, L) marks valid tokens when rows are right-padded."""
        return self.encoder(self.text_embedding(ids), x_mask=mask)

    def decoder_memory(self, memory: mx.array) -> List[Tuple[mx.array, mx.array]]:
        """Per decoder layer, the cross-attention keys and values of the text memory (after each
        layer's own memory norm): compute once per utterance, pass as `memory` afterwards."""
        return self.decoder.memory_kv(memory)

    # ----------------------------------------------------------------------------- audio side

    def speaker_context(self, index: int) -> mx.array:
        """Baked speaker `index`'s context (1, T_ctx, d): the decoder's first T_ctx input rows."""
        a = self.args
        if not a.n_speakers:
            raise MetalgenError("this Magpie checkpoint has no baked speakers")
        if not 0 <= int(index) < a.n_speakers:
            raise MetalgenError(f"Magpie speaker index {index} is outside [0, {a.n_speakers - 1}]")
        row = self.baked_context_embedding.weight[int(index)]  # (T_ctx * d,)
        return row.reshape(1, a.baked_context_len, a.d_model)

    def encode_context(self, codes: mx.array, rows: Optional[int] = None) -> mx.array:
        """A reference clip's codec codes (B, C, T), without special tokens -> the speaker context
        (B, T_ctx, d) that `speaker_context` gives for a baked speaker, as NeMo's inference makes it:
        context BOS and EOS around the codes, `embed_codes` (T_ctx = ceil((T + 2) / S)), then the
        non-causal context encoder with every row valid.

        `rows`: the row count when NeMo pads the context with zero rows first (text-conditioning
        checkpoints; metalgen.magpie.clone computes it); None: no padding."""
        a = self.args
        if "context_encoder" not in self:
            raise MetalgenError("this Magpie checkpoint has no context encoder, so it cannot clone a voice")
        B, C, _ = codes.shape
        bos = mx.full((B, C, 1), a.context_audio_bos_id, dtype=mx.int32)
        eos = mx.full((B, C, 1), a.context_audio_eos_id, dtype=mx.int32)
        x = self.embed_codes(mx.concatenate([bos, codes.astype(mx.int32), eos], axis=2))  # (B, ceil((T + 2) / S), d)
        if rows is not None:
            if rows > x.shape[1]:
                x = mx.pad(x, [(0, 0), (0, rows - x.shape[1]), (0, 0)])
            x = x[:, :rows]
        return self.context_encoder(x)

    def embed_codes(self, codes: mx.array) -> mx.array:
        """Codes (B, C, T) -> decoder input rows (B, ceil(T / S), d): the mean over the C * S
        tables of stacked frame i, codebook c (table c + i * C); T is zero-padded to a multiple of
        S first, as NeMo's `embed_audio_tokens` does."""
        a = self.args
        C, S = a.num_codebooks, a.frame_stacking_factor
        B, _, T = codes.shape
        if codes.shape[1] != C:
            raise MetalgenError(f"Magpie codes have {codes.shape[1]} codebooks, the model {C}")
        if T % S:
            codes = mx.pad(codes, [(0, 0), (0, 0), (0, S - T % S)])
        total = None
        for i in range(S):
            for c in range(C):
                e = self.audio_embeddings[c + i * C](codes[:, c, i::S])  # (B, T / S, d)
                total = e if total is None else total + e
        return total / (C * S)

    # ----------------------------------------------------------------------------- decoder

    def decoder_hidden(
        self,
        inputs: mx.array,
        memory: MemoryArg,
        memory_mask: Optional[mx.array] = None,
        attn_prior: Union[mx.array, Sequence[Optional[mx.array]], None] = None,
        return_attention: bool = False,
        cache: Optional[List[KVCache]] = None,
    ):
        """Decoder rows (B, T, d) = [context ; embedded codes] -> hidden states (B, T, d) after
        norm_out (NeMo's `dec_out`), or (that, per-layer cross-attention probabilities (B, H, T,
        L)) when `return_attention`.

        `memory`: the text memory (B, L, d) or `decoder_memory(memory)`. `memory_mask` (B, L):
        valid text positions (None: all); CFG's unconditional row is a zero memory with only
        position 0 valid. `attn_prior`: see `Transformer.__call__`. `cache`:
        `decoder.make_cache()` for incremental decoding (then `inputs` holds only new rows);
        NeMo's default loop recomputes the whole sequence instead (docs/magpie.md 2.6)."""
        return self.decoder(inputs, cache=cache, memory=memory, memory_mask=memory_mask,
                            attn_prior=attn_prior, return_attention=return_attention)

    def logits(self, h: mx.array) -> mx.array:
        """Decoder hidden states (B, T, d) -> final_proj logits (B, T, S * C * V); block j = i * C
        + c holds stacked frame i, codebook c."""
        return self.final_proj(h)

    # ----------------------------------------------------------------------------- local transformer

    def _require_lt(self):
        if "local_transformer" not in self:
            raise MetalgenError("this Magpie checkpoint has no local transformer")

    def _lt_in(self, x: mx.array) -> mx.array:
        return self.local_transformer_in_projection(x) if "local_transformer_in_projection" in self else x

    def local_transformer_logits(self, dec_out: mx.array, codes: mx.array) -> mx.array:
        """Teacher-forced LT logits, as NeMo's `LocalTransformerHelper.compute_logits` (AR layout):
        for each decoder position t, the LT runs on [dec_out[t], emb_0(code 0), ..., emb_{CS-1}]
        and head j reads row j, so block j predicts code j from the codes before it.

        dec_out (B, T', d), codes (B, C, T) with T' = ceil(T / S) -> (B, T', S * C * V)."""
        self._require_lt()
        a = self.args
        C, S, n = a.num_codebooks, a.frame_stacking_factor, a.n_heads_out
        B, Tp, d = dec_out.shape
        if codes.shape[2] % S:
            codes = mx.pad(codes, [(0, 0), (0, 0), (0, S - codes.shape[2] % S)])
        rows = [dec_out]
        for i in range(S):
            for c in range(C):
                rows.append(self.audio_embeddings[c + i * C](codes[:, c, i::S]))  # (B, T', d)
        seq = mx.stack(rows, axis=2).reshape(B * Tp, n + 1, d)  # one LT sequence per decoder position
        y = self.local_transformer(self._lt_in(seq))[:, :-1]  # (B * T', n, h): row j predicts code j
        logits = [self.local_transformer_out_projections[j](y[:, j]) for j in range(n)]  # n x (B * T', V)
        return mx.concatenate(logits, axis=-1).reshape(B, Tp, n * a.num_tokens_per_codebook)

    def local_start(self, dec_hidden: mx.array) -> mx.array:
        """The LT's first input row (B, 1, h) from one decoder hidden state per row (B, d)."""
        self._require_lt()
        return self._lt_in(dec_hidden[:, None, :])

    def local_embed(self, codes: mx.array, j: int) -> mx.array:
        """The LT input row (B, 1, h) for code j (= stacked frame i * C + codebook c) just drawn,
        codes (B,): the decoder's own audio table j, through the LT in-projection."""
        self._require_lt()
        return self._lt_in(self.audio_embeddings[j](codes)[:, None, :])

    def make_local_cache(self) -> List[KVCache]:
        """Fresh LT caches: one per decoder step (NeMo resets the LT cache every step)."""
        self._require_lt()
        return self.local_transformer.make_cache()

    def local_step(self, x: mx.array, j: int, cache: Optional[List[KVCache]] = None) -> mx.array:
        """Logits (B, V) for code j of the current decoder step.

        Without a cache `x` is the whole LT sequence so far (B, j + 1, h): `local_start(h)` then
        `local_embed` of codes 0..j-1. With `cache` (`make_local_cache()`), `x` is only the rows
        not yet fed (the start row at j = 0, then the last code's row). Both equal NeMo's
        cached and uncached LT (kernel-1 feed-forward, causal)."""
        self._require_lt()
        y = self.local_transformer(x, cache=cache)[:, -1]  # (B, h)
        return self.local_transformer_out_projections[j](y)
