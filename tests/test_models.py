"""Loading models: local folders with real safetensors headers, the catalog, the cache."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.errors import (
    CorruptWeightsError,
    ModelError,
    ModelNotFoundError,
    UnsupportedConfigError,
)
from oominfer.model.catalog import catalog_entry, catalog_ids
from oominfer.model.folder import checkpoint_from_headers, safetensors_header, spec_from_folder
from oominfer.model.load import load_spec

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


def model_folder(folder: Path, config: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or TINY_CONFIG))
    return folder


# ------------------------------------------------------------------------- local folders


def test_folder_with_one_safetensors_file(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny")
    tensor_bytes = write_safetensors(
        folder / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [256, 64]),  # 16384 elements
            "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),  # 4096
            "model.norm.weight": ("F32", [64]),  # 64
            "model.layers.0.mlp.qweight": ("I32", [8, 128]),  # 1024 (packed 4-bit)
        },
    )
    # 16384 x 2 + 4096 x 2 + 64 x 4 + 1024 x 4 = 32768 + 8192 + 256 + 4096 = 45312
    assert tensor_bytes == 45312
    spec = load_spec(str(folder))
    assert dict(spec.checkpoint.parameters) == {"BF16": 20480, "F32": 64, "I32": 1024}
    assert spec.checkpoint.total_bytes == 45312
    assert spec.checkpoint.tensor_bytes == 45312
    assert spec.checkpoint.float_params is None  # packed int32 tensors: not all-float
    assert spec.model_id == str(folder) and spec.source == str(folder)
    assert spec.num_layers == 2 and spec.num_kv_heads == 2


def test_sharded_folder_sums_both_files(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "sharded")
    first = write_safetensors(
        folder / "model-00001-of-00002.safetensors",
        {"model.embed_tokens.weight": ("BF16", [256, 64]), "model.norm.weight": ("BF16", [64])},
    )
    second = write_safetensors(
        folder / "model-00002-of-00002.safetensors",
        {"lm_head.weight": ("BF16", [256, 64]), "model.layers.1.x": ("F16", [3, 5, 7])},
    )
    (folder / "model.safetensors.index.json").write_text("{}")  # not a safetensors file
    checkpoint = checkpoint_from_headers(folder)
    # BF16: 256 x 64 + 64 + 256 x 64 = 32832; F16: 3 x 5 x 7 = 105
    assert dict(checkpoint.parameters) == {"BF16": 32832, "F16": 105}
    assert checkpoint.total_bytes == first + second == (32832 + 105) * 2
    assert checkpoint.float_params == 32937
    assert spec_from_folder(folder).checkpoint == checkpoint


def test_folder_without_weights(tmp_path: Path) -> None:
    spec = load_spec(str(model_folder(tmp_path / "bare")))
    assert spec.checkpoint.parameters == {}
    assert spec.checkpoint.total_bytes is None and spec.checkpoint.tensor_bytes is None
    assert spec.params.total > 0  # from the architecture


def test_path_to_config_json(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "cfg")
    spec = load_spec(str(folder / "config.json"))
    assert spec.model_id == str(folder)
    assert spec.hidden_size == 64


def test_folder_named_like_a_catalog_model_wins(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    model_folder(tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct")
    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    assert spec.hidden_size == 64
    assert spec.source != "catalog"


# --------------------------------------------------------------------------------- errors


def test_folder_without_config(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(ModelNotFoundError, match=r"no config\.json") as info:
        load_spec(str(folder))
    assert info.value.hint is not None


def test_truncated_config(tmp_path: Path) -> None:
    folder = tmp_path / "trunc"
    folder.mkdir()
    text = json.dumps(TINY_CONFIG)
    (folder / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(UnsupportedConfigError, match="not valid JSON") as info:
        load_spec(str(folder))
    assert "line 1" in str(info.value)
    assert info.value.hint is not None


@pytest.mark.parametrize("content", ["[1, 2]", '"config"', "null", "42"])
def test_config_not_an_object(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "list"
    folder.mkdir()
    (folder / "config.json").write_text(content)
    with pytest.raises(UnsupportedConfigError, match="JSON object"):
        load_spec(str(folder))


def test_config_missing_a_field(tmp_path: Path) -> None:
    config = {k: v for k, v in TINY_CONFIG.items() if k != "num_hidden_layers"}
    with pytest.raises(UnsupportedConfigError, match="num_hidden_layers"):
        load_spec(str(model_folder(tmp_path / "nolayers", config)))


def corrupt(path: Path, kind: str) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    match kind:
        case "empty":
            path.write_bytes(b"")
        case "too-short":
            path.write_bytes(b"\x10\x00\x00")
        case "huge-length":
            path.write_bytes(struct.pack("<Q", 2**40) + header)
        case "truncated-header":
            path.write_bytes(struct.pack("<Q", 1000) + header)
        case "not-json":
            path.write_bytes(struct.pack("<Q", 12) + b"\x00\xffnot json!!")
        case "not-an-object":
            path.write_bytes(struct.pack("<Q", 6) + b"[1, 2]")
        case "malformed-entry":
            bad = json.dumps({"w": {"dtype": "BF16", "data_offsets": [0, 4]}}).encode()
            path.write_bytes(struct.pack("<Q", len(bad)) + bad + bytes(4))
        case "text-file":
            path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")


CORRUPTIONS = [
    ("empty", "too short"),
    ("too-short", "too short"),
    ("huge-length", "header"),
    ("truncated-header", "truncated"),
    ("not-json", "not JSON"),
    ("not-an-object", "JSON object"),
    ("text-file", "header"),  # a Git LFS pointer instead of the weights
]


@pytest.mark.parametrize(("kind", "message"), CORRUPTIONS)
def test_corrupt_safetensors(tmp_path: Path, kind: str, message: str) -> None:
    path = tmp_path / "model.safetensors"
    corrupt(path, kind)
    with pytest.raises(CorruptWeightsError, match=message) as info:
        safetensors_header(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("kind", "message"), [*CORRUPTIONS, ("malformed-entry", "malformed")])
def test_corrupt_safetensors_in_folder(tmp_path: Path, kind: str, message: str) -> None:
    folder = model_folder(tmp_path / "m")
    corrupt(folder / "model.safetensors", kind)
    with pytest.raises(CorruptWeightsError, match=message):
        load_spec(str(folder))


def test_missing_nested_path() -> None:
    with pytest.raises(ModelNotFoundError, match="no model folder"):
        load_spec("./no/such/folder")


def test_unknown_model_offline_is_a_model_error() -> None:
    start = time.monotonic()
    with pytest.raises(ModelError):
        load_spec("nobody-at-all/no-such-model-3b")
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("name", ["nobody-at-all/no-such-model-3b", "no-slash-model"])
def test_unknown_model_offline_is_not_found(name: str) -> None:
    with pytest.raises(ModelNotFoundError, match="offline"):
        load_spec(name)


# ---------------------------------------------------------------------- catalog and cache


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.1-8b-instruct",
        "Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
        "META-LLAMA/LLAMA-3.1-8B-INSTRUCT",
        "llama_3_1_8b_instruct",
    ],
)
def test_catalog_lookup(name: str) -> None:
    spec = load_spec(name)
    assert spec.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.source == "catalog"
    assert spec.params.total == 8_030_261_248


def test_catalog_entry() -> None:
    entry = catalog_entry("mixtral-8x7b-v0.1")
    assert entry is not None
    assert entry.model_id == "mistralai/Mixtral-8x7B-v0.1"
    assert entry.checkpoint.total_bytes == 93_405_585_408
    assert entry.checkpoint.float_params == 46_702_792_704
    assert catalog_entry("no-such-model") is None
    assert all(catalog_entry(m) is not None for m in catalog_ids())


def test_revision_skips_the_catalog() -> None:
    # A revision asks the Hub, which is offline here: the catalog is not consulted.
    with pytest.raises(ModelError):
        load_spec("meta-llama/Llama-3.1-8B-Instruct", revision="main")


def test_hf_cache_before_catalog(offline_hub: Path) -> None:  # noqa: F811
    repo = offline_hub / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = model_folder(repo / "snapshots" / commit)
    write_safetensors(snapshot / "model.safetensors", {"w": ("BF16", [4, 4])})
    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    assert spec.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.source.startswith("hf-cache:")
    assert spec.hidden_size == 64
    assert dict(spec.checkpoint.parameters) == {"BF16": 16}
