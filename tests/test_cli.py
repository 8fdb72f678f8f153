"""`oominfer estimate`, `gpus`, `models`, `--version`, `-h` through click's CliRunner."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from checkpoints import model_folder
from click.testing import CliRunner, Result

from oominfer import __version__
from oominfer.cli import main
from oominfer.hardware.gpu import catalog
from oominfer.model.catalog import catalog_ids

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
V032 = ("--engine-version", "0.32")
"""The numbers spelt out below are vLLM 0.32's profile: named, so that they hold whichever vLLM
is installed (0.33's sampler pass takes more; with none installed the default is 0.33)."""

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
    # weights: 8,030,261,248 x 2 bytes and the 32 MiB rotary cache, / 1024**3
    assert "14.99 GiB" in out
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
    assert per_gpu["weights_bytes"] == 16_060_522_496 + 131_072 * 128 * 2
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
        (
            "--gpu",
            "T4",
            "--max-model-len",
            "2048",
            "-q",
            "bitsandbytes",
            "--engine",
            "transformers",
        ),
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
    folder = model_folder(tmp_path / "tiny")
    result = invoke("estimate", str(folder), "--gpu", "L4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["source"] == str(folder)


def test_does_not_fit_exits_3() -> None:
    result = invoke(
        "estimate", "meta-llama/Llama-3.1-405B", "--gpu", "L4", "--max-model-len", "8192", *V032
    )
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    assert "DOES NOT FIT" in result.stdout


def test_does_not_fit_json_exits_3() -> None:
    result = invoke(
        "estimate", "meta-llama/Llama-3.1-405B", "--gpu", "L4", "--max-model-len", "8192", "--json"
    )
    assert result.exit_code == 3, result.output
    assert result.stderr == ""
    data = json.loads(result.stdout)  # one document: the error's keys, then the estimate
    assert list(data)[:6] == [
        "error", "exit_code", "message", "hint", "shortfall_bytes", "ways_out"
    ]  # fmt: skip
    assert (data["error"], data["exit_code"]) == ("does_not_fit", 3)
    assert data["message"].startswith("DOES NOT FIT")
    assert data["shortfall_bytes"] == data["per_gpu"]["shortfall_bytes"] > 0
    assert data["per_gpu"]["fits"] is False
    assert data["per_gpu"]["kv_cache_bytes"] < 0  # data keeps its sign; the table does not


def test_ways_out_are_flag_changes_that_fit() -> None:
    # Llama-3.1-8B at its 131,072 tokens on an L4: 35,072 fit (0.5 GiB of graphs); two L4s
    # with -tp 2 fit all.
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", *V032, "--json")
    assert result.exit_code == 3, result.output
    ways = json.loads(result.stdout)["ways_out"]
    assert ways == ["--max-model-len 35152", "-tp 2 --gpus 2"]
    for way in ways:
        fixed = invoke("estimate", LLAMA_8B, "--gpu", "L4", *V032, *way.split())
        assert fixed.exit_code == 0, (way, fixed.output)
    human = invoke("estimate", LLAMA_8B, "--gpu", "L4", *V032)
    assert human.stdout.strip().splitlines()[-1] == "Ways out: " + "; ".join(ways) + "."


def test_more_gpus_without_a_parallel_flag_suggest_one() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--gpus", "2", "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    assert "pass -tp 2 (--tensor-parallel-size) to split it over all 2" in result.stderr
    split = invoke(
        "estimate", LLAMA_8B, "--gpu", "L4", "--gpus", "2", "-tp", "2", "--max-model-len", "8192"
    )
    assert split.exit_code == 0, split.output
    assert split.stderr == ""


def test_too_long_context_suggests_a_length() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4")  # 131072 from config.json
    assert result.exit_code == 3, result.output
    assert "--max-model-len" in result.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------------- bad input

# Every bad input, across the commands, is a row of tests/test_bad_input.py.

# ------------------------------------------------------------------------- other commands


def test_a_parallel_flag_without_gpus_means_that_many() -> None:
    """-tp 2 with --gpu and no --gpus: two of them, as the operator means; a count given
    that is too small is still refused, saying which flag to change."""
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "-tp", "2", "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    assert "2 x L4" in result.stdout
    short = invoke(
        "estimate", LLAMA_8B, "--gpu", "L4", "--gpus", "1", "-tp", "2", "--max-model-len", "8192"
    )
    assert short.exit_code != 0
    assert "Pass --gpus 2" in short.output


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
        "memory_bandwidth_gbps",
        "memory_type",
        "tflops_16bit",
        "tflops_fp8",
        "tops_int8",
        "interconnect",
        "interconnect_gbps",
    } <= set(rows[0])
    # Every GPU has the datasheet figures the speed model reads.
    assert all(r["memory_bandwidth_gbps"] and r["tflops_16bit"] and r["memory_type"] for r in rows)
    h100 = next(r for r in rows if r["name"] == "H100-SXM-80GB")
    assert (h100["tflops_16bit"], h100["tflops_fp8"], h100["interconnect"]) == (989, 1979, "nvlink")


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


# ------------------------------------------------------------------------ terminal output


def test_every_part_of_the_bar_has_its_own_glyph() -> None:
    from oominfer.report.breakdown import FREE, OVER, SEGMENTS

    glyphs = [glyph for _, glyph, _ in (*SEGMENTS, OVER, FREE)]
    assert len(set(glyphs)) == len(glyphs)  # weights and KV cache differ without colour


def test_the_bar_fills_its_width_and_names_each_glyph() -> None:
    from oominfer.planning.document import Prediction
    from oominfer.report.breakdown import memory_bar

    gib = 1024**3
    fits = Prediction(
        total_bytes=24 * gib,
        budget_bytes=22 * gib,
        weights_bytes=15 * gib,
        activation_bytes=gib // 2,
        non_torch_bytes=gib // 4,
        cuda_graph_bytes=gib,
        kv_cache_bytes=22 * gib - 16 * gib - 3 * gib // 4,
    )
    bar = memory_bar(fits, width=48)
    assert sum(len(g) for g, _, _ in bar) == 48
    assert [legend.split()[1] for _, _, legend in bar] == [
        "weights", "activations", "non-torch", "CUDA", "KV", "free"
    ]  # fmt: skip
    assert all(legend.startswith(g[0]) for g, _, legend in bar)  # the legend shows the glyph
    assert "!" not in "".join(g for g, _, _ in bar)


def test_a_part_beyond_the_budget_is_drawn_as_an_overflow() -> None:
    from oominfer.planning.document import Prediction
    from oominfer.report.breakdown import memory_bar

    gib = 1024**3
    # 30 GiB of weights on a 24 GiB GPU with a 22 GiB budget: 8 GiB beyond it, and
    # nothing left for the KV cache.
    over = Prediction(total_bytes=24 * gib, budget_bytes=22 * gib, weights_bytes=30 * gib,
                      kv_cache_bytes=-8 * gib)  # fmt: skip
    bar = memory_bar(over, width=30)
    glyphs = "".join(g for g, _, _ in bar)
    assert len(glyphs) == 30
    assert glyphs == "█" * 22 + "!" * 8  # 30 cells for 30 GiB: 22 in the budget, 8 beyond
    assert [legend for _, _, legend in bar] == [
        "█ weights 30.00 GiB", "! beyond the budget 8.00 GiB"
    ]  # fmt: skip


def test_no_negative_size_in_the_human_report() -> None:
    result = invoke(
        "estimate", "meta-llama/Llama-3.1-405B", "--gpu", "L4", "--max-model-len", "8192", *V032
    )
    assert result.exit_code == 3, result.output
    assert not re.search(r"-\d[\d.,]* (B|KiB|MiB|GiB|TiB)\b", result.stdout), result.stdout
    assert "KV cache         none: the rest needs 738.97 GiB more than the budget" in result.stdout
    assert "! beyond the budget" in result.stdout


def test_no_colour_when_not_a_terminal() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "8192")
    assert "\x1b[" not in result.output


@pytest.mark.parametrize(("no_color", "coloured"), [(None, True), ("1", False), ("", True)])
def test_no_color_turns_colour_off_on_a_terminal(no_color: str | None, coloured: bool) -> None:
    # color=True stands for a terminal; NO_COLOR (any non-empty value) wins over it.
    env = {"NO_COLOR": no_color}
    args = ["estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "8192"]
    result = CliRunner().invoke(main, args, color=True, env=env)
    assert result.exit_code == 0, result.output
    assert ("\x1b[" in result.stdout) is coloured
    failed = CliRunner().invoke(main, ["estimate", LLAMA_8B, "--gpu", "H1000"], color=True, env=env)
    assert failed.exit_code == 2
    assert ("\x1b[" in failed.stderr) is coloured


# --------------------------------------------------------------- json and the other flags


def test_models_json() -> None:
    result = invoke("models", "--json")
    assert result.exit_code == 0, result.output
    assert [m["id"] for m in json.loads(result.stdout)] == catalog_ids()


def test_k8s_json_is_a_list_kubectl_applies(tmp_path: Path) -> None:
    import oominfer

    plan = oominfer.plan("Qwen/Qwen3-0.6B", oominfer.Hardware.from_gpu("L4"))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    result = invoke("k8s", str(path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["apiVersion"], data["kind"]) == ("v1", "List")
    assert {item["kind"] for item in data["items"]} >= {"Deployment", "Service", "ConfigMap"}
    written = invoke("k8s", str(path), "--json", "-o", str(tmp_path / "out"))
    assert written.exit_code == 0, written.output
    files = json.loads(written.stdout)["files"]
    assert sorted(files) == sorted(p.name for p in (tmp_path / "out").iterdir())


def test_fit_checks_its_output_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import oominfer.api

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fit ran before -o was checked")

    monkeypatch.setattr(oominfer.api, "fit", never)
    result = invoke("fit", LLAMA_8B, "--gpu", "L4", "-o", "/nonexistent/dir/plan.json")
    assert result.exit_code == 2, result.output
    assert "no folder /nonexistent/dir" in result.stderr


def test_graphs_captured_after_the_kv_cache_say_which_budget_to_lower() -> None:
    args = ("estimate", "Qwen/Qwen3-30B-A3B", "--gpu", "RTX-4090", "--gpus", "4", "-tp", "4")
    result = invoke(*args, "--engine-version", "0.11")
    assert result.exit_code == 3, result.output
    last = result.stdout.strip().splitlines()
    assert "captures them afterwards above the budget" in last[-2]
    assert last[-1] == "Ways out: --gpu-memory-utilization 0.89; --enforce-eager."
    fixed = invoke(*args, "--engine-version", "0.11", "--gpu-memory-utilization", "0.89")
    assert fixed.exit_code == 0, fixed.output
    assert invoke(*args, "--engine-version", "0.33").exit_code == 0


def test_the_default_utilization_is_the_release_s_own() -> None:
    # vLLM raised its default from 0.9 to 0.92 in 0.20, when graph memory moved into the
    # budget: an estimate for an older release without the flag uses that release's 0.9.
    def budget(*flags: str) -> tuple[int, int]:
        result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "8192",
                        *flags, "--json")  # fmt: skip
        per_gpu = json.loads(result.stdout)["per_gpu"]
        return per_gpu["budget_bytes"], per_gpu["total_bytes"]

    old, total = budget("--engine-version", "0.15")
    assert old == math.ceil(total * 0.9)
    assert budget("--engine-version", "0.33")[0] == math.ceil(total * 0.92)
    assert budget("--engine-version", "0.15", "--gpu-memory-utilization", "0.8")[0] == (
        math.ceil(total * 0.8)
    )


def test_estimate_names_the_utilization_that_starts() -> None:
    """A budget that is not free at start: DOES NOT FIT, exit 3, and the utilization that
    is, checked by estimating it."""
    args = ["estimate", "Qwen/Qwen3-8B", "--gpu", "H100", "-tp", "2", "--engine-version",
            "0.33", "--gpu-memory-utilization", "0.98", "--max-model-len", "4096"]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 3, result.output
    assert "--gpu-memory-utilization 0.96" in result.output
    doc = json.loads(invoke(*args, "--json").output)
    assert doc["per_gpu"]["startup_short_bytes"] > 0
    assert "--gpu-memory-utilization 0.96" in doc["ways_out"]


def test_the_install_is_said_in_the_engine_version() -> None:
    """0.10's image samples with FlashInfer's kernel; a pip install (a bare number) sorts
    1,024 rows of 151,936 logits on an H100: about 3 GiB less KV cache, as the H200 log
    shows."""

    def kv(version: str) -> int:
        result = invoke("estimate", "Qwen/Qwen3-8B", "--gpu", "H100", "--max-model-len",
                        "8192", "--engine-version", version, "--json")  # fmt: skip
        assert result.exit_code == 0, result.output
        return int(json.loads(result.stdout)["per_gpu"]["kv_cache_bytes"])

    image, pip = kv("0.10.2 docker"), kv("0.10.2")
    assert kv("0.10.2 (image vllm/vllm-openai:v0.10.2)") == image
    assert kv("0.10.2 no FlashInfer") == kv("0.10.2 pip") == pip
    assert (image - pip) / 2**30 == pytest.approx(1024 * 151936 * 24 / 2**30, rel=0.02)
