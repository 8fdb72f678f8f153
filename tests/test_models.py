"""Loading models: local folders with real safetensors headers, the catalog, the cache."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from checkpoints import TINY_CONFIG, llama_tensors, model_folder, write_safetensors

from oominfer.base.errors import (
    CorruptWeightsError,
    IncompleteCheckpointError,
    InvalidSettingError,
    ModelError,
    ModelNotFoundError,
    UnsupportedConfigError,
)
from oominfer.model.catalog import catalog_entry, catalog_ids
from oominfer.model.folder import checkpoint_from_headers, safetensors_header, spec_from_folder
from oominfer.model.hub import close_names
from oominfer.model.load import load_spec

# ------------------------------------------------------------------------- local folders


def test_folder_with_one_safetensors_file(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny", {**TINY_CONFIG, "num_hidden_layers": 1})
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
    assert spec.num_layers == 1 and spec.num_kv_heads == 2


def test_sharded_folder_sums_both_files(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "sharded")
    tensors = llama_tensors(TINY_CONFIG)
    shard_1 = {k: v for k, v in tensors.items() if k.startswith(("model.embed", "model.layers.0."))}
    first = write_safetensors(folder / "model-00001-of-00002.safetensors", shard_1)
    second = write_safetensors(
        folder / "model-00002-of-00002.safetensors",
        {k: v for k, v in tensors.items() if k not in shard_1}
        | {"model.layers.1.x": ("F16", [3, 5, 7])},
    )
    (folder / "model.safetensors.index.json").write_text("{}")  # not a safetensors file
    checkpoint = checkpoint_from_headers(folder)
    # BF16: embeddings + LM head 2 x 256 x 64 = 32768, final norm 64, and per layer
    # q, o 64 x 64 each, k, v 32 x 64 each, three MLP 128 x 64, two norms 64 = 36992:
    # 32768 + 64 + 2 x 36992 = 106816. F16: 3 x 5 x 7 = 105.
    assert dict(checkpoint.parameters) == {"BF16": 106816, "F16": 105}
    assert checkpoint.total_bytes == first + second == (106816 + 105) * 2
    assert checkpoint.float_params == 106921
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
    write_safetensors(snapshot / "model.safetensors", llama_tensors(TINY_CONFIG))
    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    assert spec.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.source.startswith("hf-cache:")
    assert spec.hidden_size == 64
    assert dict(spec.checkpoint.parameters) == {"BF16": spec.params.total}


# -------------------------------------------------------------- incomplete checkpoints


def sharded(folder: Path, config: dict[str, Any], *, present: int, shards: int = 2) -> Path:
    """A Llama checkpoint split over ``shards`` files by layer, with its index; only the
    first ``present`` shard files written (what an interrupted download leaves)."""
    model_folder(folder, config)
    tensors = llama_tensors(config)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    layers = config["num_hidden_layers"]
    weight_map = {}
    for name in tensors:
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        index = 0 if layer is None and "embed" in name else shards - 1
        if layer is not None:
            index = layer * shards // layers
        weight_map[name] = names[index]
    for shard in names[:present]:
        in_shard = {k: v for k, v in tensors.items() if weight_map[k] == shard}
        write_safetensors(folder / shard, in_shard)
    index_file = folder / "model.safetensors.index.json"
    index_file.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_a_complete_sharded_checkpoint_loads(tmp_path: Path) -> None:
    spec = load_spec(str(sharded(tmp_path / "m", TINY_CONFIG, present=2)))
    assert spec.checkpoint.float_params == spec.params.total


def test_a_partial_download_names_the_missing_shards(tmp_path: Path) -> None:
    # Shard 1 of 2 present: the index's weight_map names the other one.
    with pytest.raises(IncompleteCheckpointError) as info:
        load_spec(str(sharded(tmp_path / "m", TINY_CONFIG, present=1)))
    assert "lacks 1 of the shards" in info.value.message
    assert "model-00002-of-00002.safetensors" in info.value.message
    assert info.value.exit_status == 5
    assert info.value.hint and "download" in info.value.hint


def test_many_missing_shards_are_counted_not_all_listed(tmp_path: Path) -> None:
    config = {**TINY_CONFIG, "num_hidden_layers": 8}
    with pytest.raises(IncompleteCheckpointError) as info:
        load_spec(str(sharded(tmp_path / "m", config, present=2, shards=8)))
    assert "lacks 6 of the shards" in info.value.message
    assert "and 3 more" in info.value.message


def test_tensors_that_miss_layers_are_refused(tmp_path: Path) -> None:
    # config.json declares 32 layers; the weights hold layers 0 and 1 (a 2-layer model's).
    folder = model_folder(tmp_path / "m", {**TINY_CONFIG, "num_hidden_layers": 32})
    write_safetensors(folder / "model.safetensors", llama_tensors(TINY_CONFIG))
    with pytest.raises(IncompleteCheckpointError, match=r"layers 2-31 of the 32 layers"):
        load_spec(str(folder))


def test_far_too_few_parameters_are_refused(tmp_path: Path) -> None:
    # No layer names to go by: the embedding and LM head only, 32,768 of the 106,816
    # elements config.json describes (under half).
    folder = model_folder(tmp_path / "m")
    tensors = {k: v for k, v in llama_tensors(TINY_CONFIG).items() if "embed" in k or "lm_" in k}
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(IncompleteCheckpointError, match="hold 32,768 parameters") as info:
        load_spec(str(folder))
    assert "config.json describes 106,816." in info.value.message


def test_a_truncated_shard_is_corrupt(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m")
    path = folder / "model.safetensors"
    write_safetensors(path, llama_tensors(TINY_CONFIG))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptWeightsError, match="is truncated") as info:
        load_spec(str(folder))
    assert info.value.exit_status == 5


def test_an_index_that_is_not_json_is_corrupt(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {')
    with pytest.raises(CorruptWeightsError, match=r"index\.json is not valid JSON"):
        load_spec(str(folder))


# -------------------------------------------------- every config read is validated


NEMOTRON_H = "nvidia/Nemotron-H-56B-Base-8K"


@pytest.mark.parametrize(
    ("base", "field", "value"),
    [
        (NEMOTRON_H, "mamba_head_dim", None),  # deleted: a KeyError traceback once
        (NEMOTRON_H, "mamba_head_dim", "64"),
        (NEMOTRON_H, "n_groups", -1),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "linear_key_head_dim", None),
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "full_attention_interval", "4"),
        ("mistralai/Mixtral-8x7B-v0.1", "num_local_experts", [8]),
        ("Qwen/Qwen3-30B-A3B", "mlp_only_layers", ["1"]),
        ("Qwen/Qwen3-30B-A3B", "decoder_sparse_step", "1"),
        ("deepseek-ai/DeepSeek-V3", "q_lora_rank", "1536"),
        ("deepseek-ai/DeepSeek-V3", "n_shared_experts", 1.5j),
        ("google/gemma-3-27b-it", "sliding_window_pattern", "6"),
        ("mistralai/Mistral-7B-v0.1", "sliding_window", "4096"),
        ("meta-llama/Llama-3.1-8B-Instruct", "max_position_embeddings", "131072"),
        ("meta-llama/Llama-3.1-8B-Instruct", "hidden_size", "big"),
    ],
)
def test_a_bad_config_field_is_named_never_a_traceback(
    tmp_path: Path, base: str, field: str, value: Any
) -> None:
    entry = catalog_entry(base)
    assert entry is not None, base
    config = json.loads(json.dumps(entry.config, default=str))
    target = config.get("text_config", config) if field not in config else config
    if value is None:
        del target[field]
    else:
        target[field] = value if not isinstance(value, complex) else "1.5j"
    with pytest.raises(UnsupportedConfigError, match=repr(field)) as info:
        load_spec(str(model_folder(tmp_path / "m", config)))
    assert info.value.exit_status == 5


@pytest.mark.parametrize(
    ("rope", "field"),
    [({"rope_type": "linear", "factor": "4"}, "rope_scaling.factor")],
)
def test_a_bad_nested_field_is_named_with_its_section(
    tmp_path: Path, rope: dict[str, Any], field: str
) -> None:
    config = {**TINY_CONFIG, "rope_scaling": rope}
    with pytest.raises(UnsupportedConfigError, match=repr(field)):
        load_spec(str(model_folder(tmp_path / "m", config)))


@pytest.mark.parametrize(
    ("quant", "field"),
    [
        ({"quant_method": "gptq", "bits": "4"}, "quantization_config.bits"),
        ({"quant_method": "gptq", "bits": 0}, "quantization_config.bits"),
        ({"quant_method": 4}, "quantization_config.quant_method"),
        ({"quant_method": "awq", "group_size": "128"}, "quantization_config.group_size"),
        ({"quant_method": "compressed-tensors", "config_groups": []}, "config_groups"),
    ],
)
def test_a_bad_quantization_field_is_named(
    tmp_path: Path, quant: dict[str, Any], field: str
) -> None:
    config = {**TINY_CONFIG, "quantization_config": quant}
    with pytest.raises(UnsupportedConfigError, match=field):
        load_spec(str(model_folder(tmp_path / "m", config)))


def test_gptq_per_channel_group_size_is_none(tmp_path: Path) -> None:
    config = {**TINY_CONFIG, "quantization_config": {"quant_method": "gptq", "group_size": -1}}
    spec = load_spec(str(model_folder(tmp_path / "m", config)))
    assert spec.quantization is not None and spec.quantization.group_size is None


# ---------------------------------------------------------- names, revisions, offline


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("meta-llama/Llama-3.1-8B-Instrct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("llama-3.1-8b-instrut", "meta-llama/Llama-3.1-8B-Instruct"),
        ("Qwen/Qwen3-32C", "Qwen/Qwen3-32B"),
        ("mistral/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ],
)
def test_a_misspelled_model_offline_suggests_the_catalog_name(typed: str, meant: str) -> None:
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError, match="offline") as info:
        load_spec(typed)
    assert time.monotonic() - start < 5  # no Hub retries
    assert info.value.hint is not None
    assert info.value.hint.startswith(f"Did you mean {meant}")


def test_did_you_mean_knows_the_hf_cache(offline_hub: Path) -> None:  # noqa: F811
    (offline_hub / "hub" / "models--acme--TinyStories-Llama-2M").mkdir(parents=True)
    assert close_names("acme/TinyStories-Lama-2M") == ["acme/TinyStories-Llama-2M"]
    assert close_names("completely-unrelated/zzz") == []


def test_a_revision_in_the_hf_cache_is_read_offline(offline_hub: Path) -> None:  # noqa: F811
    repo = offline_hub / "hub" / "models--acme--tiny"
    old, new = "1" * 40, "2" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(new)
    (repo / "refs" / "v1").write_text(old)
    model_folder(repo / "snapshots" / new)
    model_folder(repo / "snapshots" / old, {**TINY_CONFIG, "hidden_size": 128})
    assert load_spec("acme/tiny").hidden_size == 64
    assert load_spec("acme/tiny").revision is None
    tagged = load_spec("acme/tiny", revision="v1")
    assert (tagged.hidden_size, tagged.revision) == (128, "v1")
    by_commit = load_spec("acme/tiny", revision=old)
    assert (by_commit.hidden_size, by_commit.revision) == (128, old)
    with pytest.raises(ModelNotFoundError, match="offline"):
        load_spec("acme/tiny", revision="v2")


def test_a_revision_for_a_local_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSettingError, match="--revision v1 is for Hub models"):
        load_spec(str(model_folder(tmp_path / "m")), revision="v1")


def test_an_unreachable_hub_is_said_so_without_a_traceback(tmp_path: Path) -> None:
    """A Hub that refuses the connection (a closed port of 127.0.0.1: nothing leaves the
    machine) is the HTTP client's transport error, caught through huggingface_hub's public
    API and reported as exit 5 with the ways out."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "oominfer", "estimate", "nobody-at-all/no-such-model-3b"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 5, result.stderr
    assert "cannot be reached" in result.stderr
    assert "Traceback" not in result.stderr
