"""`oominfer estimate`, `gpus`, `models`, `--version`, `-h` through click's CliRunner."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner, Result

from oominfer import __version__
from oominfer.cli import main
from oominfer.hardware.gpu import catalog
from oominfer.model.catalog import catalog_ids

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"

PER_GPU_KEYS = {
    "weights_bytes",
    "activation_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "kv_cache_bytes",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "max_model_len_that_fits",
    "max_concurrency",
    "budget_bytes",
    "fits",
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="oominfer")


def assert_clean_error(result: Result, code: int, *fragments: str) -> None:
    """An expected failure: the documented code, one or two lines on stderr, no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    if len(lines) == 2:
        assert lines[1].startswith("Hint: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


# --------------------------------------------------------------------------------- estimate


def test_estimate_table() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in (
        "model",
        "hardware",
        "weights",
        "activations",
        "CUDA graphs",
        "KV cache",
        "KV per token",
        "max_model_len",
        "longest that fits",
        "max concurrency",
    ):
        assert label in out
    assert LLAMA_8B in out and "L4-24GB" in out
    assert "128.00 KiB" in out  # KV per token: 2 x 8 x 128 x 2 bytes x 32 layers = 131072
    assert "14.96 GiB" in out  # weights: 8,030,261,248 x 2 bytes / 1024**3
    assert "8,192" in out
    assert out.strip().splitlines()[-1].startswith("FITS")
    assert result.stderr == ""


def test_estimate_json() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "8192", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    data = json.loads(result.stdout)
    per_gpu = data["per_gpu"]
    assert set(per_gpu) >= PER_GPU_KEYS
    for key, value in per_gpu.items():
        if key.endswith("_bytes") or key.endswith("_tokens") or key.endswith("_token"):
            assert isinstance(value, int), key
    assert per_gpu["fits"] is True
    assert per_gpu["kv_bytes_per_token"] == 131072
    assert per_gpu["weights_bytes"] == 16_060_522_496
    assert per_gpu["max_model_len_that_fits"] >= 8192
    assert per_gpu["budget_bytes"] == (
        per_gpu["weights_bytes"]
        + per_gpu["activation_bytes"]
        + per_gpu["non_torch_bytes"]
        + per_gpu["cuda_graph_bytes"]
        + per_gpu["kv_cache_bytes"]
    )
    assert data["model"]["id"] == LLAMA_8B
    assert data["model"]["parameters"] == 8_030_261_248
    assert data["hardware"]["gpu"] == "L4-24GB"
    assert data["settings"]["max_model_len"] == 8192
    assert data["engine"] == "vllm"


@pytest.mark.parametrize(
    "args",
    [
        ("--gpu", "H100", "--gpus", "2", "-tp", "2", "--max-model-len", "32768"),
        ("--gpu-memory", "24GiB", "--max-model-len", "4096"),
        ("--gpu", "L4", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"),
        ("--gpu", "L4", "--max-model-len", "8192", "-q", "fp8"),
        ("--gpu", "L4", "--max-model-len", "8192", "--enforce-eager"),
        ("--gpu", "L4", "--max-model-len", "8192", "--engine", "transformers"),
        ("--gpu", "T4", "--max-model-len", "2048", "--dtype", "float16", "-q", "bitsandbytes"),
    ],
)
def test_estimate_options(args: tuple[str, ...]) -> None:
    result = invoke("estimate", LLAMA_8B, *args, "--json")
    assert result.exit_code in (0, 3), result.output
    assert "Traceback" not in result.output
    assert set(json.loads(result.stdout)["per_gpu"]) >= PER_GPU_KEYS


def test_estimate_short_name_and_folder(tmp_path: Path) -> None:
    assert (
        invoke(
            "estimate", "llama-3.1-8b-instruct", "--gpu", "L4", "--max-model-len", "8192"
        ).exit_code
        == 0
    )
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    result = invoke("estimate", str(folder), "--gpu", "L4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["source"] == str(folder)


def test_does_not_fit_exits_3() -> None:
    result = invoke(
        "estimate", "meta-llama/Llama-3.1-405B", "--gpu", "L4", "--max-model-len", "8192"
    )
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    assert "DOES NOT FIT" in result.stdout


def test_does_not_fit_json_exits_3() -> None:
    result = invoke(
        "estimate", "meta-llama/Llama-3.1-405B", "--gpu", "L4", "--max-model-len", "8192", "--json"
    )
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)  # stdout stays machine-readable
    assert data["per_gpu"]["fits"] is False
    assert data["per_gpu"]["kv_cache_bytes"] < 0
    assert "DOES NOT FIT" in result.stderr


def test_too_long_context_suggests_a_length() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4")  # 131072 from config.json
    assert result.exit_code == 3, result.output
    assert "--max-model-len" in result.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------- bad input

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("args", "code", "fragments"),
    [
        pytest.param(
            ("--gpu", "H1000"), 2, ("unknown GPU 'H1000'", "Did you mean", "H100"), id="unknown-gpu"
        ),
        pytest.param(
            ("--gpu", "L4", "--gpu-memory-utilization", "0"),
            2,
            ("--gpu-memory-utilization",),
            id="utilization-0",
        ),
        pytest.param(
            ("--gpu", "L4", "--gpu-memory-utilization", "1.5"),
            2,
            ("--gpu-memory-utilization", "1.5"),
            id="utilization-1.5",
        ),
        pytest.param(
            ("--gpu", "L4", "--max-model-len", "0"), 2, ("--max-model-len",), id="max-len-0"
        ),
        pytest.param(
            ("--gpu", "L4", "--max-model-len", "-5"),
            2,
            ("--max-model-len", "-5"),
            id="max-len-negative",
        ),
        pytest.param(
            ("--gpu", "L4", "--gpus", "3", "-tp", "3"),
            2,
            ("does not divide",),
            id="tp-not-dividing-heads",
        ),
        pytest.param(("--gpu", "L4", "-tp", "2"), 2, ("--gpus",), id="tp-more-than-gpus"),
        pytest.param(
            ("--gpu", "T4", "--dtype", "bfloat16"),
            2,
            ("bfloat16", "--dtype float16"),
            id="bf16-on-t4",
        ),
        pytest.param(
            ("--gpu", "A100", "--kv-cache-dtype", "fp8"), 2, ("8.9",), id="fp8-kv-on-a100"
        ),
        pytest.param(("--gpu-memory", "lots"), 2, ("cannot read the size",), id="bad-size"),
        pytest.param(("--gpu-memory", "1KiB"), 2, ("too small",), id="tiny-gpu"),
        pytest.param(
            ("--gpu", "L4", "--gpu-memory", "24GiB"), 2, ("not both",), id="gpu-and-gpu-memory"
        ),
        pytest.param(
            ("--gpu", "L4", "--kv-cache-memory-bytes", "0"), 2, ("positive",), id="kv-bytes-0"
        ),
    ],
)
def test_bad_settings(args: tuple[str, ...], code: int, fragments: tuple[str, ...]) -> None:
    assert_clean_error(invoke("estimate", LLAMA_8B, *args), code, *fragments)


def test_unknown_model_offline_exits_5() -> None:
    result = invoke("estimate", "nobody-at-all/no-such-model-3b", "--gpu", "L4")
    assert_clean_error(result, 5, "nobody-at-all/no-such-model-3b")


def test_folder_without_config_exits_5(tmp_path: Path) -> None:
    assert_clean_error(invoke("estimate", str(tmp_path), "--gpu", "L4"), 5, "no config.json")


def test_malformed_config_exits_5(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2, "hidden_')
    assert_clean_error(invoke("estimate", str(tmp_path), "--gpu", "L4"), 5, "not valid JSON")


def test_config_missing_field_exits_5(tmp_path: Path) -> None:
    config = {k: v for k, v in TINY_CONFIG.items() if k != "num_attention_heads"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert_clean_error(invoke("estimate", str(tmp_path), "--gpu", "L4"), 5, "num_attention_heads")


@pytest.mark.parametrize(
    "content",
    [b"\x01\x02", struct.pack("<Q", 2**40) + b"{}", struct.pack("<Q", 8) + b"not json"],
    ids=["too-short", "huge-length", "not-json"],
)
def test_corrupt_safetensors_exits_5(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(content)
    assert_clean_error(invoke("estimate", str(tmp_path), "--gpu", "L4"), 5, "model.safetensors")


def test_click_usage_error_exits_2() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--dtype", "float8")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "float8" in result.stderr


# ------------------------------------------------------------------------- other commands


def test_gpus_lists_the_catalog() -> None:
    result = invoke("gpus")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(catalog()) >= 25
    assert any(line.startswith("L4-24GB") and "NVIDIA-L4" in line for line in lines)


def test_gpus_json() -> None:
    result = invoke("gpus", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == [g.name for g in catalog()]
    assert {
        "name",
        "memory_bytes",
        "cuda_total_bytes",
        "compute_capability",
        "product_label",
    } <= set(rows[0])


def test_models_lists_the_catalog() -> None:
    result = invoke("models")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == catalog_ids()
    assert LLAMA_8B in result.stdout.splitlines()


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"oominfer, version {__version__}"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help(flag: str) -> None:
    result = invoke(flag)
    assert result.exit_code == 0, result.output
    assert "Usage: oominfer" in result.stdout
    for command in ("estimate", "gpus", "models"):
        assert command in result.stdout
    assert "Exit codes" in result.stdout


def test_estimate_help() -> None:
    result = invoke("estimate", "-h")
    assert result.exit_code == 0, result.output
    for flag in (
        "--gpu",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--json",
        "--tensor-parallel-size",
        "--kv-cache-dtype",
    ):
        assert flag in result.stdout
    assert "Examples" in result.stdout
