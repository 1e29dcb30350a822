"""From a path, a hub id or `dummy:<shape>` to a ready (model, tokenizer).

Loading is strict: every tensor the model declares must be in the checkpoint with the
declared shape, and the checkpoint may hold nothing else; each failure is a one-line
MetalgenError naming the file and the tensor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .errors import MetalgenError
from .models import build_model
from .models.moe import SwitchLinear, check_expert_quantization

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
# Files a model folder needs; other repository files (READMEs, PyTorch .bin) are skipped.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"]


def parse_dtype(dtype: Union[None, str, mx.Dtype]) -> Optional[mx.Dtype]:
    """None | 'bfloat16' | 'float16' | 'float32' | an mx float dtype -> mx dtype or None."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    name = str(dtype).replace("torch.", "")
    if name in ("bf16",):
        name = "bfloat16"
    elif name in ("fp16", "half"):
        name = "float16"
    elif name in ("fp32", "float"):
        name = "float32"
    if name not in DTYPES:
        raise MetalgenError(f"unknown dtype '{dtype}' (choose bfloat16, float16 or float32)")
    return DTYPES[name]


def resolve_model_path(path_or_id: str, revision: Optional[str] = None) -> Path:
    """A local folder as is; otherwise a Hugging Face hub id fetched into the standard cache
    (honouring HF_HUB_OFFLINE)."""
    path = Path(path_or_id).expanduser()
    if path.exists():
        if not path.is_dir():
            raise MetalgenError(f"model path {path} is a file; give the model's folder")
        return path
    looks_like_id = path_or_id.count("/") == 1 and not path_or_id.startswith((".", "/", "~"))
    if not looks_like_id:
        raise MetalgenError(f"no model folder at {path_or_id}")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise MetalgenError(f"huggingface_hub is needed to fetch '{path_or_id}': {e}")
    try:
        return Path(snapshot_download(path_or_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise MetalgenError(
            f"model '{path_or_id}' is not in the local Hugging Face cache and {why}"
        )
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MetalgenError(f"could not fetch '{path_or_id}' from the Hugging Face hub: {first}")


def read_json(path: Path, what: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise MetalgenError(f"{what} not found: {path}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MetalgenError(f"{path} is not valid JSON: {e}")
    if not isinstance(data, dict):
        raise MetalgenError(f"{path} must hold a JSON object")
    return data


def read_config(folder: Path) -> Dict[str, Any]:
    """config.json, with generation_config.json's EOS ids merged in as `eos_token_ids`."""
    config = read_json(folder / "config.json", "config.json")
    eos = set(_as_id_list(config.get("eos_token_id")))
    gen_path = folder / "generation_config.json"
    if gen_path.exists():
        eos |= set(_as_id_list(read_json(gen_path, "generation_config.json").get("eos_token_id")))
    config["eos_token_ids"] = sorted(eos)
    return config


def _as_id_list(value) -> list:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def weight_files(folder: Path) -> list:
    """The safetensors shards of a checkpoint, from its index when there is one."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index, "weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise MetalgenError(f"{index} has no 'weight_map'")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (folder / name).exists():
                raise MetalgenError(f"shard {name} listed in {index.name} is missing from {folder}")
        return [folder / name for name in files]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MetalgenError(f"no *.safetensors weights in {folder}")
    return files


def read_weights(folder: Path) -> Tuple[Dict[str, mx.array], Dict[str, str]]:
    """All tensors of all shards, and for each the shard file it came from."""
    weights: Dict[str, mx.array] = {}
    source: Dict[str, str] = {}
    for path in weight_files(folder):
        try:
            shard = mx.load(str(path))
        except Exception as e:
            raise MetalgenError(f"could not read weights file {path}: {e}")
        if not isinstance(shard, dict):
            raise MetalgenError(f"{path} is not a safetensors file")
        for name, value in shard.items():
            if name in weights:
                raise MetalgenError(f"tensor '{name}' appears in both {source[name]} and {path.name}")
            weights[name] = value
            source[name] = path.name
    return weights, source


def quantization_of(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The MLX quantization entry of a config, if the checkpoint is quantized."""
    q = config.get("quantization") or config.get("quantization_config")
    if not q or "bits" not in q or "group_size" not in q:
        return None
    return q


def apply_quantization(model: nn.Module, quant: Dict[str, Any], weights: Dict[str, mx.array]):
    """Swap in quantized layers wherever the checkpoint stores scales (MLX's layout), with
    per-layer overrides where the config gives them."""
    mode = quant.get("mode", "affine")

    def predicate(path: str, module: nn.Module):
        override = quant.get(path)
        if override is False:
            return False
        if f"{path}.scales" not in weights:
            return False
        params = {"group_size": quant["group_size"], "bits": quant["bits"], "mode": mode}
        if isinstance(override, dict):
            params.update(override)
        if isinstance(module, SwitchLinear):
            check_expert_quantization(path, params["group_size"], params["bits"])
        return params if isinstance(override, dict) else True

    nn.quantize(model, quant["group_size"], quant["bits"], mode=mode, class_predicate=predicate)


def check_weights(model: nn.Module, weights: Dict[str, mx.array], source: Dict[str, str], folder: Path):
    """Raise on the first missing, unexpected or misshapen tensor."""
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise MetalgenError(
            f"tensor '{missing[0]}' is missing from the checkpoint in {folder}"
            + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else "")
        )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        name = unexpected[0]
        raise MetalgenError(f"unexpected tensor '{name}' in {source.get(name, folder)}")
    for name, value in weights.items():
        want = tuple(expected[name].shape)
        if tuple(value.shape) != want:
            raise MetalgenError(
                f"tensor '{name}' in {source.get(name, folder)} has shape {tuple(value.shape)}, "
                f"expected {want}"
            )


def cast_weights(weights: Dict[str, mx.array], dtype: Optional[mx.Dtype]) -> Dict[str, mx.array]:
    if dtype is None:
        return weights
    return {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}


def load_weights_strict(module: nn.Module, folder: Path, dtype=None, quantization=None) -> None:
    """Read a folder's safetensors into `module`: sanitized by the module, quantized layers
    swapped in where `quantization` (an MLX config entry) says, every tensor checked, floating
    weights cast to `dtype`, packed where the module says (`pack_weights`: MoE experts stacked
    across layers), then evaluated."""
    weights, source = read_weights(folder)
    weights = module.sanitize(weights)
    if quantization is not None:
        apply_quantization(module, quantization, weights)
    check_weights(module, weights, source, folder)
    weights = cast_weights(weights, parse_dtype(dtype))
    pack = getattr(module, "pack_weights", None)
    if pack is not None:  # MoE experts stacked across layers, a layer at a time
        weights = pack(weights)
    module.load_weights(list(weights.items()), strict=True)
    finish_loading(module)


def finish_loading(module: nn.Module) -> None:
    """After the weights are in: the module's own fusions (`fuse_projections`, hybrid stacks), eval
    mode, every parameter evaluated."""
    fuse = getattr(module, "fuse_projections", None)
    if fuse is not None:
        fuse()
    module.eval()
    mx.eval(module.parameters())


def load_model(folder: Path, config: Dict[str, Any], dtype=None) -> nn.Module:
    """Build the model a folder's config describes and load its weights strictly."""
    model = build_model(config)
    load_weights_strict(model, folder, dtype, quantization_of(config))
    return model


def load_tokenizer(folder: Path, eos_token_ids=()):
    """The folder's tokenizer, with the model's EOS ids added to its own."""
    from tokenizer import Tokenizer, TokenizerError

    try:
        tok = Tokenizer.from_pretrained(folder)
    except TokenizerError as e:
        raise MetalgenError(str(e))
    tok.add_eos_token_ids(eos_token_ids)
    return tok


def load(path_or_id: str, *, dtype=None, revision: Optional[str] = None):
    """Load a model and its tokenizer.

    Args:
        path_or_id: a local folder in Hugging Face layout, a hub id such as
            "Qwen/Qwen3-0.6B", or "dummy:<shape>" (see `metalgen.dummy.SHAPES`).
        dtype: cast floating weights to "bfloat16", "float16" or "float32"; None keeps the
            checkpoint's.
        revision: a hub branch, tag or commit.

    Returns:
        (model, tokenizer)
    """
    if path_or_id.startswith("dummy:"):
        from .dummy import load_dummy

        return load_dummy(path_or_id[len("dummy:") :], dtype=parse_dtype(dtype))
    folder = resolve_model_path(path_or_id, revision)
    config = read_config(folder)
    model = load_model(folder, config, dtype)
    return model, load_tokenizer(folder, config["eos_token_ids"])
