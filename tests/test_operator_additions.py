"""What operators add (issue 17): speculative decoding, LoRA, multimodal limits, prefix
caching, expert and data parallel, as engine settings that estimate, fit, the plan, serve and
k8s carry; each with its memory counted and vLLM's rules applied."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner, Result

from oominfer.base.errors import InvalidSettingError, ModelNotFoundError
from oominfer.base.units import GiB
from oominfer.cli import main
from oominfer.hardware.hardware import Hardware
from oominfer.memory.additions import (
    encoder_forward_bytes,
    encoder_items,
    item_rows,
    lora_slot_bytes,
    multimodal_bytes,
    profiled_item,
)
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.weights import rope_cache_bytes, weight_rounding_bytes, weights_bytes
from oominfer.model.load import load_spec
from oominfer.planning.document import Plan
from oominfer.rules.versions import CURRENT_VLLM, EngineVersion
from oominfer.serving.extra import merge_extra
from oominfer.settings import EngineSettings, engine_args

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = '{"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}'
L4 = Hardware.from_gpu("L4", 1)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="oominfer")


def estimate_json(*flags: str, model: str = LLAMA_8B, gpu: str = "L4") -> dict[str, Any]:
    result = invoke("estimate", model, "--gpu", gpu, "--max-model-len", "1024", "--json", *flags)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def of(model: str, hardware: Hardware = L4, **settings: Any) -> MemoryBreakdown:
    s = EngineSettings(max_model_len=8192, **settings)
    return estimate(load_spec(model), hardware=hardware, settings=s, version=CURRENT_VLLM)


# ------------------------------------------------------- command line <-> settings <-> argv

ROUND_TRIPS = [
    # flags given, the setting's value, the engine's tokens
    (("--speculative-config", DRAFT), "speculative_config", DRAFT, ["--speculative-config", DRAFT]),
    (("--enable-lora",), "enable_lora", True, ["--enable-lora"]),
    (("--enable-lora", "--max-loras", "4"), "max_loras", 4, ["--max-loras", "4"]),
    (("--enable-lora", "--max-lora-rank", "64"), "max_lora_rank", 64, ["--max-lora-rank", "64"]),
    (("--enable-lora", "--max-cpu-loras", "8"), "max_cpu_loras", 8, ["--max-cpu-loras", "8"]),
    (
        ("--limit-mm-per-prompt", '{"image":2,"video":0}'),
        "limit_mm_per_prompt",
        '{"image": 2, "video": 0}',
        ["--limit-mm-per-prompt", '{"image": 2, "video": 0}'],
    ),
    (("--enable-prefix-caching",), "enable_prefix_caching", True, ["--enable-prefix-caching"]),
    (
        ("--no-enable-prefix-caching",),
        "enable_prefix_caching",
        False,
        ["--no-enable-prefix-caching"],
    ),
]


@pytest.mark.parametrize(("flags", "name", "value", "argv"), ROUND_TRIPS)
def test_each_flag_reaches_the_settings_and_renders_back_as_vllm_takes_it(
    flags: tuple[str, ...], name: str, value: object, argv: list[str]
) -> None:
    data = estimate_json(*flags)
    assert data["settings"][name] == value
    settings = EngineSettings(**{k: data["settings"][k] for k in (name, "enable_lora")})
    tokens = engine_args(settings)
    start = tokens.index(argv[0])
    assert tokens[start : start + len(argv)] == argv


def test_expert_and_data_parallel_round_trip() -> None:
    result = invoke(
        "estimate", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--gpu", "H100-SXM-80GB",
        "--gpus", "2", "--max-model-len", "8192", "--enable-expert-parallel", "-dp", "2",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert (settings["enable_expert_parallel"], settings["data_parallel_size"]) == (True, 2)
    tokens = engine_args(EngineSettings(enable_expert_parallel=True, data_parallel_size=2))
    assert "--enable-expert-parallel" in tokens
    assert tokens[tokens.index("--data-parallel-size") + 1] == "2"


def test_defaults_render_nothing_new() -> None:
    """Left alone, none of the new settings reaches the engine: vLLM decides as before."""
    assert engine_args(EngineSettings()) == ["--dtype", "auto", "--gpu-memory-utilization", "0.92"]


# ----------------------------------------------------------------------------- the memory


def test_lora_and_a_draft_each_shrink_the_kv_cache() -> None:
    """The bar of issue 17, through the command line."""
    plain = estimate_json()["per_gpu"]
    lora = estimate_json("--enable-lora", "--max-lora-rank", "64", "--max-loras", "4")["per_gpu"]
    draft = estimate_json("--speculative-config", DRAFT)["per_gpu"]
    assert lora["kv_cache_bytes"] < plain["kv_cache_bytes"]
    assert draft["kv_cache_bytes"] < plain["kv_cache_bytes"]
    assert lora["lora_bytes"] == plain["kv_cache_bytes"] - lora["kv_cache_bytes"]
    assert draft["speculative_bytes"] == plain["kv_cache_bytes"] - draft["kv_cache_bytes"]
    # The per_gpu keys of before are all still there, the new ones beside them.
    old = {
        "weights_bytes",
        "activation_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "kv_cache_bytes",
        "kv_bytes_per_token",
        "kv_cache_tokens",
        "max_concurrency",
    }
    new = {
        "speculative_bytes",
        "speculative_kv_bytes_per_token",
        "lora_bytes",
        "multimodal_bytes",
        "expert_weights_bytes",
        "experts_per_gpu",
    }
    assert old | new <= set(plain)


def test_lora_slots_by_hand() -> None:
    """Llama-3.1-8B (hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, 32 layers),
    rank 64, 4 slots, bf16, one GPU; each module is rank x (in + out) per slot:
    q 64x(4096+4096) + k, v 2 x 64x(4096+1024) + o 64x(4096+4096) = 1,703,936;
    gate, up 2 x 64x(4096+14336) + down 64x(14336+4096) = 3,538,944;
    x 32 layers x 4 slots x 2 bytes = 1,342,177,280; punica's buffer 3 x 2048 x 64 x 4."""
    s = EngineSettings(enable_lora=True, max_loras=4, max_lora_rank=64)
    slots = lora_slot_bytes(load_spec(LLAMA_8B), s, dtype="bfloat16", tokens=2048)
    assert slots == (1_703_936 + 3_538_944) * 32 * 4 * 2 + 3 * 2048 * 64 * 4


def test_tensor_parallel_splits_one_side_of_each_lora_module() -> None:
    spec = load_spec(LLAMA_8B)
    one = EngineSettings(enable_lora=True, max_lora_rank=64)
    two = dataclasses.replace(one, tensor_parallel_size=2)
    whole = lora_slot_bytes(spec, one, dtype="bfloat16", tokens=0)
    split = lora_slot_bytes(spec, two, dtype="bfloat16", tokens=0)
    assert whole / 2 < split < whole


def test_no_lora_memory_without_enable_lora() -> None:
    s = EngineSettings(max_loras=4, max_lora_rank=64)
    assert lora_slot_bytes(load_spec(LLAMA_8B), s, dtype="bfloat16", tokens=2048) == 0


def test_a_draft_model_adds_its_weights_graphs_and_kv_per_token() -> None:
    """Llama-3.2-1B: 16 layers x 2 (K, V) x 8 KV heads x 64 x 2 bytes = 32 KiB per token."""
    plain, drafted = of(LLAMA_8B), of(LLAMA_8B, speculative_config=DRAFT)
    a = drafted.additions
    assert a.speculative_method == "draft_model"
    assert a.speculative_kv_bytes_per_token == 16 * 2 * 8 * 64 * 2
    assert drafted.kv_bytes_per_token == plain.kv_bytes_per_token + 32 * 1024
    one_b = load_spec("meta-llama/Llama-3.2-1B-Instruct").params.total
    assert abs(a.speculative_weights_bytes - one_b * 2) < 0.05 * one_b * 2
    # Its graphs: the same captured sizes over half the target's layers (16 of 32).
    assert a.speculative_graph_bytes == pytest.approx(plain.cuda_graph_bytes / 2, rel=1e-3)
    assert (
        of(LLAMA_8B, speculative_config=DRAFT, enforce_eager=True).additions.speculative_graph_bytes
        == 0
    )
    assert drafted.kv_cache_tokens < plain.kv_cache_tokens


def test_ngram_needs_no_memory() -> None:
    ngram = of(LLAMA_8B, speculative_config='{"method": "ngram", "num_speculative_tokens": 4}')
    assert ngram.additions.speculative_method == "ngram"
    assert ngram.kv_cache_bytes == of(LLAMA_8B).kv_cache_bytes


def test_an_eagle_head_is_one_layer_of_the_target_and_its_fc() -> None:
    """Unknown to the catalog (and offline): one Llama-8B decoder layer plus eagle3's
    3 x hidden -> hidden fc, the embedding and LM head shared with the target."""
    spec = load_spec(LLAMA_8B)
    config = '{"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'
    a = of(LLAMA_8B, speculative_config=config).additions
    assert a.speculative_method == "eagle3"
    p = spec.params
    layer = p.layer_linear[-1] + p.layer_experts[-1] + p.layer_other[-1]
    assert a.speculative_weights_bytes == (layer + 3 * 4096 * 4096) * 2
    assert a.speculative_kv_bytes_per_token == 2 * 8 * 128 * 2


def test_mtp_drafts_with_the_models_own_layers() -> None:
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    assert spec.mtp_layers == 1
    h200x8 = Hardware.from_gpu("H200", 8)
    b = of("deepseek-ai/DeepSeek-V3", h200x8, tensor_parallel_size=8,
           speculative_config='{"method": "mtp", "num_speculative_tokens": 1}')  # fmt: skip
    assert b.additions.speculative_method == "mtp"
    assert b.additions.speculative_weights_bytes > 0
    # MLA: one latent of (512 + 64) x 2 bytes per token and layer.
    assert b.additions.speculative_kv_bytes_per_token == (512 + 64) * 2


def test_qwen3_next_drafts_with_one_mtp_layer_its_config_does_not_state() -> None:
    """Qwen3-Next's config.json has no num_nextn_predict_layers, yet its checkpoints carry one
    mtp.* layer and vLLM builds getattr(config, "num_nextn_predict_layers", 1) of them: the
    recipe's qwen3_next_mtp runs (c21 of the calibration logs started with it at TP4)."""
    spec = load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert spec.mtp_layers == 1
    h100x4 = Hardware.from_gpu("H100", 4)
    config = '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}'
    b = of("Qwen/Qwen3-Next-80B-A3B-Thinking", h100x4, tensor_parallel_size=4,
           speculative_config=config)  # fmt: skip
    a = b.additions
    assert a.speculative_method == "mtp"
    # One full-attention MoE layer (the model's last) plus the 2 x hidden -> hidden fc.
    p = spec.params
    layer = p.layer_linear[-1] + p.layer_experts[-1] + p.layer_other[-1]
    assert a.speculative_weights_bytes == (layer + 2 * 2048 * 2048) * 2 // 4
    # "Model loading took" counts the draft with the target (GPUModelRunner.load_model).
    assert b.loaded_bytes == b.weights_bytes + a.speculative_weights_bytes
    # A model whose config states none and whose vLLM class builds none is still refused.
    with pytest.raises(InvalidSettingError, match="has none"):
        of(LLAMA_8B, speculative_config='{"method": "mtp", "num_speculative_tokens": 1}')


def test_the_encoder_cache_and_limits_of_zero() -> None:
    """Gemma 3 27B: 256 tokens per image, so a 2,048-token budget profiles 2,048 // 256 = 8
    images (fewer than 256 sequences x 1 image each) and caches 8 x 256 embeddings of the
    hidden 5376 in 2 bytes; images limited to 0 skip the encoder."""
    spec = load_spec("google/gemma-3-27b-it")
    items = encoder_items(
        spec, EngineSettings(), tokens=2048, seqs=256, max_len=8192, version=CURRENT_VLLM
    )
    assert items == 8
    assert (
        multimodal_bytes(spec, dtype="bfloat16", items=items, per_item=spec.mm_tokens_per_item)
        == 8 * 256 * 5376 * 2
    )
    # A long item fills the budget alone: at least one is profiled, however small the budget.
    assert (
        encoder_items(
            spec, EngineSettings(), tokens=100, seqs=256, max_len=8192, version=CURRENT_VLLM
        )
        == 1
    )
    # Few sequences of short prompts bound it from the decoder's side (vLLM's _get_max_items).
    assert (
        encoder_items(
            spec, EngineSettings(), tokens=8192, seqs=2, max_len=512, version=CURRENT_VLLM
        )
        == 4
    )
    none = EngineSettings(limit_mm_per_prompt='{"image": 0}')
    assert encoder_items(spec, none, tokens=2048, seqs=256, max_len=8192, version=CURRENT_VLLM) == 0
    text = load_spec(LLAMA_8B)
    assert (
        encoder_items(
            text, EngineSettings(), tokens=2048, seqs=256, max_len=8192, version=CURRENT_VLLM
        )
        == 0
    )


def test_vllm_0_11_pads_each_profiled_encoder_output_to_the_budget() -> None:
    """0.11's profile_run zero-pads every dummy encoder output shorter than the encoder budget
    to the whole budget (gpu_model_runner.py ``new_zeros((encoder_budget, hidden))``): Gemma
    3 27B on an H100 at 2,048 batched tokens profiles 8 images of 256 tokens, cached as 8 x
    2,048 rows of 5,376 in 2 bytes instead of 8 x 256; 0.10 and 0.12 cache them unpadded,
    and the KV cache is smaller by the difference."""
    spec = load_spec("google/gemma-3-27b-it")
    h100 = Hardware.from_gpu("H100-SXM-80GB", 1)
    s = EngineSettings(max_model_len=8192, max_num_batched_tokens=2048)
    b = {v: estimate(spec, hardware=h100, settings=s, version=EngineVersion.parse(v))
         for v in ("0.10.2", "0.11.0", "0.12.0")}  # fmt: skip
    assert b["0.11.0"].additions.multimodal_bytes == 8 * 2048 * 5376 * 2
    assert b["0.10.2"].additions.multimodal_bytes == 8 * 256 * 5376 * 2
    assert b["0.12.0"].additions.multimodal_bytes == 8 * 256 * 5376 * 2
    assert b["0.11.0"].kv_cache_bytes < b["0.12.0"].kv_cache_bytes
    # An item as long as the budget (Qwen2.5-VL's 16,384-token image) is not padded.
    qwen = load_spec("Qwen/Qwen2.5-VL-7B-Instruct")
    assert multimodal_bytes(
        qwen, dtype="bfloat16", items=1, per_item=16_384, padded_to=16_384
    ) == multimodal_bytes(qwen, dtype="bfloat16", items=1, per_item=16_384)


def test_qwen3_vl_profiles_a_timestamped_video_in_0_11_and_0_12_and_an_image_from_0_13() -> None:
    """Qwen3-VL-30B-A3B's largest video is 25,165,824 pixels of all frames together: 12,288
    embeddings (16 x 16 patches, 2 x 2 merge, 2 frames a group), fewer than an image's
    16,384. 0.11-0.12 count each as 12.5 tokens (timestamps): 153,600, the budget calibration
    log n15 prints for "1 video items", so the video is profiled; the cache pads those
    12,288 rows of 4 x 2,048 (merger and three deepstack outputs) to 153,600 (2.34 GiB) and
    is freed before the graphs are captured. From 0.13 one 16,384-token image is."""
    spec = load_spec("Qwen/Qwen3-VL-30B-A3B-Instruct")
    tower = spec.vision_encoder
    assert tower is not None and tower.video_tokens == 12_288 and tower.output_width == 8192
    v11, v13 = EngineVersion.parse("0.11.0"), EngineVersion.parse("0.13.0")
    s = EngineSettings()
    assert profiled_item(spec, s, max_len=65536, version=v11) == ("video", 153_600)
    assert profiled_item(spec, s, max_len=65536, version=v13) == ("image", 16_384)
    assert item_rows(spec, "video", 153_600) == 12_288
    hw = Hardware.from_gpu("RTX-3090", 4)

    def at(version: EngineVersion) -> MemoryBreakdown:
        settings = EngineSettings(tensor_parallel_size=4, max_model_len=65536)
        return estimate(spec, hardware=hw, settings=settings, version=version)

    b11, b13 = at(v11), at(v13)
    assert b11.additions.encoder_modality == "video" and b11.additions.encoder_items == 1
    assert b11.additions.multimodal_bytes == 153_600 * 8192 * 2
    assert b13.additions.encoder_modality == "image"
    assert b13.additions.multimodal_bytes == 16_384 * 8192 * 2
    # The freed cache leaves room for the 0.11 graphs captured above the budget (n15 started).
    assert b11.post_capture_short_bytes == 0


def test_the_vision_towers_forward_is_the_profiling_peak_where_it_is_larger() -> None:
    """Qwen2.5-VL-7B on an L4 at vLLM 0.9 (calibration log c08): one image of 16,384 tokens
    is 65,536 patches through a SwiGLU tower 1280 wide with an MLP of 3420: per patch 4 x
    1280 + 3 x 3420 values in 2 bytes and 1,176 fp32 pixel values; 2.16 GiB, above the text
    model's 2,048-token forward and sampler, so it is the activation peak (vLLM printed no
    peak there; its KV cache is within 8%: bench/calibration.py)."""
    spec = load_spec("Qwen/Qwen2.5-VL-7B-Instruct")
    tower = spec.vision_encoder
    assert tower is not None and tower.gated and tower.patches_per_token == 4
    assert tower.patch_elements == 3 * 2 * 14 * 14
    peak = encoder_forward_bytes(
        spec, dtype="bfloat16", items=1, per_item=spec.mm_tokens_per_item, tp=1
    )
    assert peak == 65_536 * ((4 * 1280 + 3 * 3420) * 2 + 1176 * 4)
    l4, v09 = Hardware.from_gpu("L4", 1), EngineVersion.parse("0.9")

    def at(**settings: Any) -> MemoryBreakdown:
        s = EngineSettings(max_model_len=2048, **settings)
        return estimate(spec, hardware=l4, settings=s, version=v09)

    b = at()
    assert b.additions.encoder_items == 1
    assert b.activation_bytes == peak - b.additions.multimodal_bytes
    # Tensor parallel splits the MLP's intermediates, not the tower-width tensors.
    assert encoder_forward_bytes(
        spec, dtype="bfloat16", items=1, per_item=spec.mm_tokens_per_item, tp=2
    ) == 65_536 * ((4 * 1280 + 3 * 1710) * 2 + 1176 * 4)
    # Without images the tower is neither built nor run: the text model's peak alone.
    text = at(limit_mm_per_prompt='{"image": 0, "video": 0}')
    assert text.activation_bytes < b.activation_bytes
    assert text.additions.multimodal_bytes == 0


def test_a_long_context_profiles_qwen2_vls_dummy_video() -> None:
    """Qwen2-VL's dummy video is frames at the largest image size, two frames a token group,
    as many as fit in max_model_len up to 14 (vllm qwen2_vl.py): at the 128k default that is
    seven images' tokens, 114,688, which vLLM 0.23 profiles as "1 video items" (gathered log
    g4-03: 15.67 GiB of weights and -14.28 GiB left for the KV cache at utilisation 0.22 on
    an A100-80GB). Up to two frames (one image's tokens) the image is profiled; a video
    limit of 0 keeps it so."""
    spec = load_spec("Qwen/Qwen2.5-VL-7B-Instruct")
    assert spec.video_frames_per_group == 2
    image = spec.mm_tokens_per_item
    assert image == 16_384
    s = EngineSettings()
    assert profiled_item(spec, s, max_len=128_000, version=CURRENT_VLLM) == ("video", 7 * image)
    assert profiled_item(spec, s, max_len=32_768, version=CURRENT_VLLM) == ("video", 2 * image)
    assert profiled_item(spec, s, max_len=16_384, version=CURRENT_VLLM) == ("image", image)
    assert profiled_item(spec, s, max_len=2_048, version=CURRENT_VLLM) == ("image", image)
    no_video = EngineSettings(limit_mm_per_prompt='{"image": 1, "video": 0}')
    assert profiled_item(spec, no_video, max_len=128_000, version=CURRENT_VLLM) == ("image", image)
    # A model without a modelled video: its image, whatever the context.
    assert (
        profiled_item(load_spec("google/gemma-3-27b-it"), s, max_len=128_000, version=CURRENT_VLLM)[
            0
        ]
        == "image"
    )

    a100 = Hardware.from_gpu("A100-SXM-80GB", 1)
    b = estimate(
        spec,
        hardware=a100,
        settings=EngineSettings(gpu_memory_utilization=0.22),
        version=EngineVersion.parse("0.23"),
    )
    assert (b.additions.encoder_modality, b.additions.encoder_items) == ("video", 1)
    assert not b.fits
    # The tower's forward over 458,752 patches is what sinks it: the KV cache it leaves is
    # within 5% of the -14.28 GiB vLLM printed.
    assert b.kv_cache_bytes / GiB == pytest.approx(-14.28, rel=0.05)
    # Where the video is what does not fit, leaving videos out (images kept) is a way out.
    from oominfer.report.ways_out import ways_out

    a40 = Hardware.from_gpu("A100-PCIE-40GB", 1)
    b = estimate(spec, hardware=a40, settings=s, version=CURRENT_VLLM)
    assert not b.fits
    found = ways_out(spec, a40, s, b, version=CURRENT_VLLM)
    assert """--limit-mm-per-prompt '{"video": 0}'""" in found
    fixed = EngineSettings(limit_mm_per_prompt='{"video": 0}')
    b = estimate(spec, hardware=a40, settings=fixed, version=CURRENT_VLLM)
    # Images still come: the tower is built and one image profiled.
    assert b.fits and b.additions.encoder_modality == "image"
    assert b.additions.encoder_items == 1 and b.additions.vision_tower_bytes > 0


def test_expert_parallel_holds_whole_experts_and_data_parallel_splits_them_too() -> None:
    """Mixtral 8x7B: 8 experts. TP 2 slices each expert in two; EP over TP 2 holds 4 whole
    experts per GPU (the same bytes); DP 2 x TP 1 slices them over both engines' GPUs."""
    mixtral, two = "mistralai/Mixtral-8x7B-Instruct-v0.1", Hardware.from_gpu("H100-SXM-80GB", 2)
    tp = of(mixtral, two, tensor_parallel_size=2)
    ep = of(mixtral, two, tensor_parallel_size=2, enable_expert_parallel=True)
    dp = of(mixtral, two, data_parallel_size=2)
    assert ep.additions.experts_per_gpu == 4
    assert abs(ep.weights_bytes - tp.weights_bytes) <= 1
    one = of(mixtral, Hardware.from_gpu("H100-SXM-80GB", 1))
    experts = one.additions.expert_weights_bytes
    assert dp.additions.expert_weights_bytes == experts // 2
    assert one.weights_bytes - dp.weights_bytes == pytest.approx(experts // 2, abs=2)
    assert dp.additions.data_parallel_size == 2


# ------------------------------------------------------------------------ vLLM's refusals

REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"max_lora_rank": 48}, "--max-lora-rank"),
    ({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}, "--max-cpu-loras 2"),
    ({"speculative_config": "[1, 2]"}, "JSON object"),
    ({"speculative_config": "{model: x}"}, "not valid JSON"),
    ({"limit_mm_per_prompt": "{"}, "not valid JSON"),
]


@pytest.mark.parametrize(("settings", "words"), REFUSED)
def test_settings_vllm_refuses_before_anything_runs(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidSettingError, match=words):
        EngineSettings(**settings)


ESTIMATE_REFUSED = [
    (LLAMA_8B, {"enable_expert_parallel": True}, "mixture-of-experts"),
    (LLAMA_8B, {"speculative_config": '{"method": "eagle", "num_speculative_tokens": 4}'},
     "needs a draft"),
    (LLAMA_8B, {"speculative_config": '{"method": "mtp", "num_speculative_tokens": 1}'},
     "has none"),
    (LLAMA_8B, {"speculative_config": '{"model": "x/y", "num_speculative_tokens": 0}'},
     "positive integer"),
    (LLAMA_8B, {"speculative_config": '{"method": "medusa2", "model": "x/y"}'}, "unknown"),
    (LLAMA_8B, {"data_parallel_size": 2}, "needs 2 GPUs"),
    (LLAMA_8B, {"enable_lora": True, "speculative_config": DRAFT, "max_num_seqs": 256,
                "max_num_batched_tokens": 1024}, "256 x 5 = 1280"),
]  # fmt: skip


@pytest.mark.parametrize(("model", "settings", "words"), ESTIMATE_REFUSED)
def test_the_estimate_refuses_what_vllm_refuses(
    model: str, settings: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidSettingError, match=words):
        of(model, **settings)


def test_the_command_line_refuses_a_rank_vllm_lacks_and_bad_json() -> None:
    rank = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--enable-lora", "--max-lora-rank", "48")
    assert rank.exit_code == 2, rank.output
    assert "48" in rank.stderr and "320" in rank.stderr
    bad = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--speculative-config", "{model}")
    assert bad.exit_code == 2, bad.output
    assert "not valid JSON" in bad.stderr


# ------------------------------------------------------------------ the plan and k8s


def test_a_lora_plan_passes_enable_lora_to_the_engine_in_its_manifests(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    fitted = invoke("fit", LLAMA_8B, "--gpu", "L4", "--enable-lora", "--max-lora-rank", "64",
                    "--max-loras", "4", "--no-verify", "-o", str(plan))  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    settings = json.loads(plan.read_text())["settings"]
    assert (settings["enable_lora"], settings["max_loras"], settings["max_lora_rank"]) == (
        True, 4, 64,
    )  # fmt: skip
    out = tmp_path / "k8s"
    rendered = invoke("k8s", str(plan), "-o", str(out))
    assert rendered.exit_code == 0, rendered.output
    deployment = yaml.safe_load((out / "deployment.yaml").read_text())
    args = shlex.split(
        deployment["spec"]["template"]["metadata"]["annotations"]["oominfer.dev/engine-args"]
    )
    assert args[args.index("--enable-lora") :][:5] == [
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64",
    ]  # fmt: skip


def test_a_draft_plan_keeps_its_json_as_one_argument(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    fitted = invoke("fit", LLAMA_8B, "--gpu", "H100-SXM-80GB", "--speculative-config", DRAFT,
                    "--no-verify", "-o", str(plan))  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    settings = json.loads(plan.read_text())["settings"]
    assert json.loads(settings["speculative_config"])["num_speculative_tokens"] == 4
    tokens = engine_args(EngineSettings(speculative_config=settings["speculative_config"]))
    assert json.loads(tokens[tokens.index("--speculative-config") + 1]) == json.loads(DRAFT)


def test_smaller_additions_are_ways_out_before_quantizing() -> None:
    lora = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "20000", "--json",
                  "--enable-lora", "--max-loras", "8", "--max-lora-rank", "64")  # fmt: skip
    assert lora.exit_code == 3, lora.output
    ways = json.loads(lora.stdout)["ways_out"]
    assert {"--max-loras 4", "--max-lora-rank 32"} <= set(ways)
    assert ways.index("--max-loras 4") < ways.index("-q fp8_per_tensor")
    draft = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "20000", "--json",
                   "--speculative-config", DRAFT)  # fmt: skip
    assert draft.exit_code == 3, draft.output
    ngram = [w for w in json.loads(draft.stdout)["ways_out"] if "ngram" in w]
    assert len(ngram) == 1
    config = shlex.split(ngram[0])[1]
    assert json.loads(config)["num_speculative_tokens"] == 4


def test_the_transformers_engine_refuses_vllm_only_additions() -> None:
    spec = load_spec(LLAMA_8B)
    s = EngineSettings(max_model_len=4096, enable_lora=True)
    with pytest.raises(InvalidSettingError, match="transformers engine does not serve --enable"):
        estimate(spec, hardware=L4, settings=s, engine="transformers", version=CURRENT_VLLM)


def test_the_vision_tower_is_in_the_weights_once() -> None:
    """Gemma 3's SigLIP tower (423,058,032 parameters: test_estimate) is part of the weights
    line, in 16 bits, and is not added again beside it; limits of 0 leave it unbuilt and
    its weights unloaded."""
    spec = load_spec("google/gemma-3-27b-it")
    h100 = Hardware.from_gpu("H100-SXM-80GB", 1)
    b = of("google/gemma-3-27b-it", h100)
    assert b.additions.vision_tower_bytes == 423_058_032 * 2
    assert b.additions.non_kv_bytes == b.additions.multimodal_bytes  # the tower not again
    text_only = dataclasses.replace(spec, params=dataclasses.replace(spec.params, vision=0))
    rope = rope_cache_bytes(spec, dtype="bfloat16")
    (rounding,) = weight_rounding_bytes(spec, dtype="bfloat16", quantization=None, tp=1,
                                        fused=True)  # fmt: skip
    text = weights_bytes(text_only, dtype="bfloat16") + rope + rounding
    assert b.weights_bytes - text == 423_058_032 * 2
    unbuilt = of("google/gemma-3-27b-it", h100, limit_mm_per_prompt='{"image": 0}')
    assert unbuilt.additions.vision_tower_bytes == 0
    assert b.weights_bytes - unbuilt.weights_bytes == 423_058_032 * 2
    assert unbuilt.kv_cache_bytes > b.kv_cache_bytes
    assert of(LLAMA_8B).additions.vision_tower_bytes == 0


def test_a_data_parallel_plan_asks_kubernetes_for_every_engines_gpus(tmp_path: Path) -> None:
    """GPUs = tensor x pipeline x data parallel: two DP engines of one GPU each."""
    plan = tmp_path / "plan.json"
    fitted = invoke("fit", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--gpu", "H100", "--gpus",
                    "2", "--enable-expert-parallel", "--no-verify", "-o", str(plan))  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    data = json.loads(plan.read_text())
    data["settings"].update(tensor_parallel_size=1, data_parallel_size=2)
    plan.write_text(json.dumps(data))
    out = tmp_path / "k8s"
    rendered = invoke("k8s", str(plan), "-o", str(out))
    assert rendered.exit_code == 0, rendered.output
    pod = yaml.safe_load((out / "deployment.yaml").read_text())["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    args = shlex.split(pod["metadata"]["annotations"]["oominfer.dev/engine-args"])
    assert args[args.index("--data-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" in args
    data["gpu"]["count"] = 1
    plan.write_text(json.dumps(data))
    refused = invoke("k8s", str(plan), "-o", str(tmp_path / "k8s-1"))
    assert refused.exit_code != 0
    assert "x data 2" in refused.output


def test_the_lora_cpu_cache_is_host_memory_of_max_cpu_loras_adapters() -> None:
    """16 adapters of rank 64 on Llama-3.1-8B, whole: 16 x 167,772,160 elements x 2 bytes
    (the per-slot count of test_lora_slots_by_hand) = 5 GiB of host memory, none of it
    taken from the GPU's KV cache."""
    spec, tp2 = load_spec(LLAMA_8B), Hardware.from_gpu("L4", 2)
    s = dict(enable_lora=True, max_loras=4, max_lora_rank=64)
    b = of(LLAMA_8B, tp2, tensor_parallel_size=2, max_cpu_loras=16, **s)
    assert b.additions.lora_cpu_cache_bytes == 16 * 167_772_160 * 2
    assert b.kv_cache_bytes == of(LLAMA_8B, tp2, tensor_parallel_size=2, **s).kv_cache_bytes
    assert spec.num_layers == 32


def test_a_draft_nowhere_to_be_found_is_named_as_the_draft() -> None:
    config = '{"model": "nobody/unknown-draft", "num_speculative_tokens": 4}'
    with pytest.raises(ModelNotFoundError, match="draft model of --speculative-config"):
        of(LLAMA_8B, speculative_config=config)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_fit_keeps_a_data_parallel_size_and_counts_the_server_as_one_replica(gpus: int) -> None:
    mixtral = "mistralai/Mixtral-8x7B-Instruct-v0.1"
    fitted = invoke("fit", mixtral, "--gpu", "H100", "--gpus", str(gpus), "-dp", "2",
                    "--enable-expert-parallel", "--no-verify", "--json")  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    plan = json.loads(fitted.stdout)
    s = plan["settings"]
    assert (s["data_parallel_size"], s["enable_expert_parallel"]) == (2, True)
    used = s["tensor_parallel_size"] * s["pipeline_parallel_size"] * s["data_parallel_size"]
    assert used * plan["replicas"] == gpus


LORA_PLAN = Plan(
    model_id=LLAMA_8B,
    settings=EngineSettings(max_model_len=8192, enable_lora=True, max_loras=4, max_lora_rank=64),
)


@pytest.mark.parametrize(
    "extra",
    [
        ["--enable-lora", "--max-loras", "4"],  # the plan's own values
        ["--max-lora-rank=64", "--seed", "1"],
        ["--max-cpu-loras", "16"],  # host memory only
        ["--enable-prefix-caching"],
    ],
)
def test_extra_flags_that_keep_the_plans_memory_pass(extra: list[str]) -> None:
    merge_extra(LORA_PLAN, extra)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--max-loras", "8"], "contradicts the plan"),
        (["--max-lora-rank", "128"], "contradicts the plan"),
        (["--speculative-config", DRAFT], "changes the GPU memory"),
        (["--enable-expert-parallel"], "changes the GPU memory"),
        (["--data-parallel-size", "2"], "changes the GPU memory"),
        (["--limit-mm-per-prompt", '{"image": 4}'], "changes the GPU memory"),
    ],
)
def test_extra_flags_that_change_the_plans_memory_are_refused(extra: list[str], words: str) -> None:
    """After `oominfer serve plan.json --`, an addition the plan did not count would take
    memory the verified KV cache holds."""
    with pytest.raises(InvalidSettingError, match=words):
        merge_extra(LORA_PLAN, extra)


def test_prefix_caching_and_drafts_change_a_hybrids_state_blocks() -> None:
    """Nemotron-H (Mamba2): prefix caching on (vLLM's default) keeps 2 + 1 checkpoint state
    blocks per request; off, one; each drafted token adds one."""
    model, h100 = "nvidia/Nemotron-H-56B-Base-8K", Hardware.from_gpu("H100-SXM-80GB", 2)
    kw: dict[str, Any] = {"tensor_parallel_size": 2}
    blocks = [
        of(model, h100, **kw, **extra).layout.state_blocks  # type: ignore[union-attr]
        for extra in (
            {},
            {"enable_prefix_caching": False},
            {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}'},
        )
    ]
    assert blocks == [3, 1, 6]
    # MTP without a count drafts as many tokens as the model has MTP layers (one here).
    qwen_next, h200 = "Qwen/Qwen3-Next-80B-A3B-Thinking", Hardware.from_gpu("H200", 2)
    plain, mtp = (
        of(qwen_next, h200, **kw, **extra).layout.state_blocks  # type: ignore[union-attr]
        for extra in ({}, {"speculative_config": '{"method": "mtp"}'})
    )
    assert mtp == plain + 1
    # Fewer state blocks per request: more requests fit.
    on, off = of(model, h100, **kw), of(model, h100, **kw, enable_prefix_caching=False)
    assert off.requests_at(8192) > on.requests_at(8192)
