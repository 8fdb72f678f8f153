"""Checkpoint folders written by hand for the model-loading tests: real safetensors files
(header and zeroed tensors) and config.json, small enough to write in milliseconds."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1}

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A real safetensors file: an 8-byte little-endian header length, the JSON header
    (dtype, shape, data_offsets of each tensor), then the tensor bytes (zeros).
    Returns the number of tensor bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        size = n * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return offset


def llama_tensors(config: dict[str, Any], *, layers: range | None = None) -> dict[str, Any]:
    """Every tensor of a Llama checkpoint for ``config`` (bf16), by name: what a complete
    download holds. ``layers`` keeps only those decoder layers."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = h // heads
    tensors: dict[str, Any] = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in layers if layers is not None else range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": ("BF16", [heads * d, h]),
            p + "self_attn.k_proj.weight": ("BF16", [kv * d, h]),
            p + "self_attn.v_proj.weight": ("BF16", [kv * d, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, heads * d]),
            p + "mlp.gate_proj.weight": ("BF16", [inter, h]),
            p + "mlp.up_proj.weight": ("BF16", [inter, h]),
            p + "mlp.down_proj.weight": ("BF16", [h, inter]),
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
        }
    tensors |= {"model.norm.weight": ("BF16", [h]), "lm_head.weight": ("BF16", [vocab, h])}
    return tensors


def model_folder(folder: Path, config: dict[str, Any] | None = None) -> Path:
    """A folder holding ``config`` (default: TINY_CONFIG) as its config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or TINY_CONFIG))
    return folder
