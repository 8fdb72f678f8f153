"""ModelSpec.from_hf_config: every catalog config parses; exact counts; layer kinds; errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.base.errors import UnsupportedConfigError
from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.catalog import catalog_entry, catalog_ids
from oominfer.model.config import spec_from_config
from oominfer.model.spec import ModelSpec, QuantSpec
from oominfer.rules.versions import CURRENT_VLLM
from oominfer.settings import EngineSettings

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
"""Verbatim config.json files of models the catalog does not carry (each named for its repo)."""


def catalog_spec(name: str) -> ModelSpec:
    entry = catalog_entry(name)
    assert entry is not None, name
    return spec_from_config(
        entry.config, model_id=entry.model_id, checkpoint=entry.checkpoint, source="catalog"
    )


# A small Llama-shaped config.json for the synthetic rows below.
BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def config(**changes: Any) -> dict[str, Any]:
    cfg = {**BASE, **changes}
    return {k: v for k, v in cfg.items() if v is not None}


# ---------------------------------------------------------------------------- the catalog


@pytest.mark.parametrize("model_id", catalog_ids())
def test_every_catalog_model_parses(model_id: str) -> None:
    spec = catalog_spec(model_id)
    assert spec.model_id == model_id
    assert spec.num_layers == len(spec.layer_kinds) > 0
    assert spec.attention_layers > 0
    assert spec.num_attention_heads % spec.num_kv_heads == 0
    assert spec.head_dim > 0 and spec.vocab_size > 0 and spec.hidden_size > 0
    assert spec.max_position_embeddings >= 2048
    assert spec.torch_dtype in ("bfloat16", "float16", "float32")
    p = spec.params
    assert len(p.layer_linear) == len(p.layer_experts) == len(p.layer_other) == spec.num_layers
    assert p.total > 0
    assert spec.is_moe == (sum(p.layer_experts) > 0)
    if "sliding" in spec.layer_kinds:
        assert spec.sliding_window
    # Where the catalog has exact sizes of an all-float checkpoint, the architecture agrees
    # to 0.01% (the remainder is buffers such as Llama-2's rotary inv_freq).
    exact = spec.checkpoint.float_params
    if exact:
        assert abs(p.total - exact) / exact < 1e-4, (p.total, exact)


def test_auto_round_checkpoint_reads_as_gptq() -> None:
    q = catalog_spec("Lorbus/Qwen3.6-27B-int4-AutoRound").quantization
    assert q is not None and (q.method, q.bits) == ("gptq", 4)


def test_catalog_is_sorted_and_large() -> None:
    # The file itself is kept sorted (tools/build_catalog.py writes it so; a hand edit that
    # breaks the order shows here), and every entry of it is listed.
    from importlib import resources

    text = resources.files("oominfer.data").joinpath("models.json").read_text(encoding="utf-8")
    in_file = list(json.loads(text)["models"])
    assert in_file == sorted(in_file)
    assert catalog_ids() == in_file
    assert len(in_file) >= 50


def test_catalog_is_what_its_build_tool_writes(tmp_path) -> None:
    # models.json is generated: tools/build_catalog.py, run on ../shared/calibration and
    # tools/catalog_extra, writes it byte for byte (an edit made to the output alone shows
    # here, and would be lost at the next build).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    calibration = root.parent / "shared" / "calibration"
    if not (calibration / "configs" / "INDEX.json").is_file():
        pytest.skip(f"{calibration} is not here")
    out = tmp_path / "models.json"
    subprocess.run(
        [sys.executable, str(root / "tools" / "build_catalog.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    built = out.read_text(encoding="utf-8")
    assert built == (root / "oominfer" / "data" / "models.json").read_text(encoding="utf-8")


# ---------------------------------------------------------------------- exact param counts

# Per layer: attention = hidden x (heads + 2 kv_heads) x head_dim (Q, K, V) + heads x head_dim
# x hidden (O); gated MLP = 3 x hidden x intermediate; two RMSNorms = 2 x hidden. Plus the
# embedding, an untied LM head (vocab x hidden each) and the final norm (hidden).
EXACT_PARAMS = [
    # Llama-3.1-8B: hidden 4096, 32 layers, 32/8 heads, head_dim 128, inter 14336, vocab 128256.
    # attn 4096*(32+16)*128 + 4096*4096 = 41,943,040; mlp 3*4096*14336 = 176,160,768;
    # norms 8192 -> 218,112,000 x 32 = 6,979,584,000; embed + head 2*128256*4096 =
    # 1,050,673,152; final 4096 -> 8,030,261,248.
    ("meta-llama/Llama-3.1-8B", 8_030_261_248),
    # Llama-2-7b: hidden 4096, 32 layers, MHA 32 heads, inter 11008, vocab 32000.
    # attn 4*4096^2 = 67,108,864; mlp 3*4096*11008 = 135,266,304; norms 8192 ->
    # 202,383,360 x 32 = 6,476,267,520; 2*32000*4096 = 262,144,000; + 4096 -> 6,738,415,616.
    # The catalog's total_size/2 is 6,738,419,712: 4096 more, the fp32 rotary inv_freq buffers
    # (32 layers x 64 x 4 bytes = 8192 bytes) that the checkpoint also stores.
    ("meta-llama/Llama-2-7b-hf", 6_738_415_616),
    # Mixtral-8x7B: Mistral-7B attention (41,943,040), 8 experts x 176,160,768 =
    # 1,409,286,144, router 4096*8 = 32,768, norms 8192 -> 1,451,270,144 x 32 =
    # 46,440,644,608; 2*32000*4096 = 262,144,000; + 4096 -> 46,702,792,704 (= total_size/2).
    ("mistralai/Mixtral-8x7B-v0.1", 46_702_792_704),
    # Mistral-7B-v0.3: as Llama-3.1-8B per layer (218,112,000 x 32 = 6,979,584,000), vocab
    # 32768: 2*32768*4096 = 268,435,456; + 4096 -> 7,248,023,552 (= total_size/2).
    ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),
    # phi-4: hidden 5120, 40 layers, 40/10 heads x 128, inter 17920, vocab 100352, untied.
    # attn 5120*60*128 + 5120*5120 = 65,536,000; mlp 3*5120*17920 = 275,251,200; norms 10240
    # -> 340,797,440 x 40 = 13,631,897,600; 2*100352*5120 = 1,027,604,480; + 5120
    # -> 14,659,507,200 (= total_size/2).
    ("microsoft/phi-4", 14_659_507_200),
    # gemma-2b: hidden 2048, 18 layers, 8 heads / 1 KV head x 256, inter 16384, vocab 256000,
    # tied. attn 2048*10*256 + 2048*2048 = 9,437,184; mlp 3*2048*16384 = 100,663,296; norms
    # 4096 -> 110,104,576 x 18 = 1,981,882,368; embed 256000*2048 = 524,288,000; + 2048
    # -> 2,506,172,416 (= total_size/2).
    ("google/gemma-2b-it", 2_506_172_416),
]


@pytest.mark.parametrize(("model_id", "expected"), EXACT_PARAMS)
def test_exact_parameter_count(model_id: str, expected: int) -> None:
    spec = catalog_spec(model_id)
    assert spec.params.total == expected
    catalog_total = spec.checkpoint.total_bytes
    if catalog_total and model_id != "meta-llama/Llama-2-7b-hf":
        assert catalog_total // 2 == expected
    if spec.checkpoint.float_params:
        assert spec.checkpoint.float_params in (expected, expected + 4096)


def test_llama2_checkpoint_holds_rotary_buffers() -> None:
    # 32 layers x 64 inv_freq elements x 4 bytes = 8192 bytes = 4096 "F16 elements".
    spec = catalog_spec("meta-llama/Llama-2-7b-hf")
    assert spec.checkpoint.total_bytes is not None
    assert spec.checkpoint.total_bytes - 2 * spec.params.total == 32 * 64 * 4


def test_tied_embeddings_have_no_lm_head() -> None:
    tied = catalog_spec("google/gemma-2b-it")
    assert tied.tie_word_embeddings and tied.params.lm_head == 0
    untied = catalog_spec("meta-llama/Llama-3.1-8B")
    assert not untied.tie_word_embeddings
    assert untied.params.lm_head == untied.params.embedding == 128256 * 4096


# ------------------------------------------------------------------------------ layer kinds


def test_gpt_oss_alternates_sliding_and_full() -> None:
    spec = catalog_spec("openai/gpt-oss-20b")
    assert spec.num_layers == 24
    assert spec.layer_kinds == ("sliding", "full") * 12
    assert spec.sliding_window == 128
    assert spec.attention_layers == 24 and spec.state_layers == 0
    assert spec.quantization == QuantSpec(method="mxfp4", bits=4, group_size=32, experts_only=True)


def test_gemma2_even_layers_slide() -> None:
    spec = catalog_spec("google/gemma-2-9b-it")
    assert spec.num_layers == 42
    assert all(k == ("sliding" if i % 2 == 0 else "full") for i, k in enumerate(spec.layer_kinds))
    assert spec.sliding_window == 4096


def test_qwen3_next_one_in_four_full() -> None:
    spec = catalog_spec("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert spec.num_layers == 48
    expected = tuple("full" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48))
    assert spec.layer_kinds == expected
    assert spec.attention_layers == 12 and spec.state_layers == 36
    assert spec.state_elements_per_layer > 0
    assert spec.sliding_window is None


def test_nemotron_h_pattern() -> None:
    entry = catalog_entry("nvidia/Nemotron-H-56B-Base-8K")
    assert entry is not None
    pattern = entry.config["hybrid_override_pattern"]
    spec = catalog_spec("nvidia/Nemotron-H-56B-Base-8K")
    symbols = {"M": "mamba", "*": "full", "-": "mlp"}
    assert set(pattern) == set(symbols)
    assert spec.layer_kinds == tuple(symbols[ch] for ch in pattern)
    assert spec.attention_layers == pattern.count("*")
    assert spec.state_layers == pattern.count("M")


def test_qwen3_next_full_attention_projects_its_output_gate() -> None:
    """Qwen3-Next's full-attention layers gate their output: vLLM's qkv_proj projects
    heads x (1 + attn_output_gate) query-sized outputs, the flag on by default (its
    config.json does not name it): 12 layers x 2,048 x 16 x 256 more than without."""
    entry = catalog_entry("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert entry is not None
    assert "attn_output_gate" not in entry.config
    gated = spec_from_config(entry.config, model_id="next")
    plain = spec_from_config({**entry.config, "attn_output_gate": False}, model_id="next")
    assert gated.params.total - plain.params.total == 12 * 2048 * 16 * 256


def test_qwen3_5_moe_needs_no_dense_intermediate_size() -> None:
    """Qwen3.5's MoE checkpoints have no intermediate_size: every layer is a MoE layer
    (256 experts of 512 in Qwen3.5-35B-A3B, beside a shared expert of 512)."""
    entry = catalog_entry("Qwen/Qwen3.5-35B-A3B")
    assert entry is not None
    assert "intermediate_size" not in entry.config["text_config"]
    spec = catalog_spec("Qwen/Qwen3.5-35B-A3B")
    assert spec.num_experts == 256 and spec.moe_intermediate_size == 512
    assert sum(spec.params.layer_experts) == 40 * 256 * 3 * 2048 * 512
    assert spec.layer_kinds.count("full") == 10
    assert 34e9 < spec.params.total < 36e9  # "35B"


def test_latent_moe_experts_work_in_the_latent_width() -> None:
    """Nemotron 3 Super's LatentMoE: 512 routed experts (relu2, up and down) work in
    moe_latent_size 1,024 behind fc1/fc2_latent_proj (4,096 x 1,024 each, whole on every
    rank); counted at the hidden size the model came out at 458B instead of its 120B.
    The config is tests/data/configs/ (NVIDIA's, as ai-dynamo/aiconfigurator keeps it)."""
    path = CONFIGS / "nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json"
    spec = spec_from_config(json.loads(path.read_text()), model_id="nemotron-3-super")
    assert spec.moe_latent_size == 1024
    moe_layers = 40
    assert sum(spec.params.layer_experts) == moe_layers * 512 * 2 * 1024 * 2688
    assert sum(spec.params.layer_replicated_linear) == moe_layers * 2 * 4096 * 1024
    assert 119e9 < spec.params.total < 122e9  # "120B total, 12B active"


def test_mimo_v2_flash_per_layer_attention_and_moe() -> None:
    """MiMo-V2-Flash: hybrid_layer_pattern marks 39 sliding-window layers (1) and 9 full
    ones (0); the sliding ones have 8 KV heads, the full ones 4; values are 128 wide beside
    192-wide queries and keys (vLLM's head_size_v); moe_layer_freq lists one dense layer.
    309B parameters on its card (315.7B counted before, with V, o_proj and every layer's
    MLP at the wrong width); at TP 8 a token takes one head of 192 + 128 a layer."""
    config = json.loads((CONFIGS / "XiaomiMiMo__MiMo-V2-Flash.json").read_text())
    spec = spec_from_config(config, model_id="mimo-v2-flash")
    assert spec.layer_kinds.count("sliding") == 39 and spec.layer_kinds.count("full") == 9
    assert spec.kv_width("sliding") == (8, 192) and spec.kv_width("full") == (4, 192)
    assert spec.v_head_dim == 128
    assert sum(1 for n in spec.params.layer_experts if n) == 47
    assert spec.params.total == pytest.approx(309e9, rel=0.003)
    b = estimate(spec, hardware=Hardware(gpu=find_gpu("H200"), count=8),
                 settings=EngineSettings(max_model_len=8192, tensor_parallel_size=8),
                 version=CURRENT_VLLM)  # fmt: skip
    assert b.kv_bytes_per_token == 48 * (192 + 128) * 2


def test_llama4_dense_layers_take_intermediate_size_mlp() -> None:
    """Llama 4 Maverick interleaves dense and MoE layers (interleave_moe_layer_step 2); vLLM
    builds the dense ones at intermediate_size_mlp (16,384), the experts and the shared expert
    at intermediate_size (8,192). Scout's config with Maverick's interleave: 24 dense layers
    of 3 x 5,120 x 16,384, not 8,192."""
    entry = catalog_entry("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert entry is not None
    text = {**entry.config["text_config"], "interleave_moe_layer_step": 2}
    assert text["intermediate_size_mlp"] == 16384 and text["intermediate_size"] == 8192
    wide = spec_from_config({**entry.config, "text_config": text}, model_id="maverick-shape")
    narrow_text = {**text, "intermediate_size_mlp": 8192}
    narrow = spec_from_config({**entry.config, "text_config": narrow_text}, model_id="m")
    assert wide.params.total - narrow.params.total == 24 * 3 * 5120 * (16384 - 8192)


def test_nemotron_h_layers_block_type_reads_as_the_pattern() -> None:
    """Nemotron 3's later configs (transformers 5) list layers_block_type ("mamba", "moe",
    "attention", "mlp") instead of hybrid_override_pattern, some without num_hidden_layers
    (Nemotron-3-Ultra): the same model either way."""
    config = json.loads(
        (CONFIGS / "nvidia__NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json").read_text()
    )
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    listed = {k: v for k, v in config.items() if k not in ("hybrid_override_pattern",
                                                           "num_hidden_layers")}  # fmt: skip
    listed["layers_block_type"] = [names[c] for c in config["hybrid_override_pattern"]]
    a = spec_from_config(config, model_id="pattern")
    b = spec_from_config(listed, model_id="listed")
    assert b.num_layers == 88
    assert b.layer_kinds == a.layer_kinds
    assert b.params.total == a.params.total


def test_nemotron_nas_layers_have_their_own_attention_and_mlp() -> None:
    """Llama-3.3-Nemotron-Super-49B (DeciLM, NAS-pruned from Llama-3.3-70B): 80 layers, each
    its own ``block_configs`` entry. 31 have no attention (no KV cache), the other 49 eight KV
    heads; each MLP is 2 x ffn_mult x 8,192 / 3 wide rounded up to 256 (5.25: 28,672;
    2.625: 14,336; 0.5: 2,816). 49.9B parameters on its model card."""
    path = CONFIGS / "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json"
    config = json.loads(path.read_text())
    spec = spec_from_config(config, model_id="nemotron-super-49b")
    assert spec.layer_kinds.count("full") == 49 and spec.layer_kinds.count("mlp") == 31
    assert spec.num_kv_heads == 8
    assert spec.intermediate_size == 28672
    assert spec.params.total == pytest.approx(49.9e9, rel=0.002)
    widths = {b["ffn"]["ffn_mult"] for b in config["block_configs"]}
    assert {0.5, 2.625, 5.25} <= widths
    b = estimate(spec, hardware=Hardware.from_gpu("H100"), settings=EngineSettings(
        max_model_len=8192), version=CURRENT_VLLM)  # fmt: skip
    assert b.kv_bytes_per_token == 49 * 2 * 8 * 128 * 2


def test_gemma4_e4b_shares_kv_and_carries_per_layer_embeddings() -> None:
    """gemma-4-E4B: its last 18 of 42 layers read the KV cache of the last earlier layer of
    their type (vLLM allocates none for them), so 20 sliding and 4 full layers cache a token:
    20 x 2 x 2 x 256 x 2 + 4 x 2 x 2 x 512 x 2 = 57,344 bytes (100,352 counting all 42).
    Its per-layer embeddings add a 262,144 x 42 x 256 table (2.8B of its "8B"), which a
    step reads a row of; its audio tower (transformers' Gemma4AudioModel) 304,824,608."""
    from oominfer.model.params import audio_params
    from oominfer.model.reader import ConfigReader
    from oominfer.speed.performance import stage

    config = json.loads((CONFIGS / "google__gemma-4-E4B-it.resaved.json").read_text())
    spec = spec_from_config(config, model_id="gemma-4-e4b")
    assert spec.layer_kinds[24:] == ("shared",) * 18
    assert spec.attention_layers == 24
    settings = EngineSettings(max_model_len=8192)
    b = estimate(spec, hardware=Hardware.from_gpu("H100"), settings=settings,
                 version=CURRENT_VLLM)  # fmt: skip
    assert b.kv_bytes_per_token == 20 * 2 * 2 * 256 * 2 + 4 * 2 * 2 * 512 * 2
    table = 262_144 * 42 * 256
    assert spec.params.per_layer_embedding == table
    assert audio_params(ConfigReader(config, "e4b")) == 304_824_608
    assert spec.params.total == pytest.approx(8e9, rel=0.01)
    # A decode step reads the weights but not the per-layer tables.
    assert stage(spec, settings, b).dense_bytes < b.weights_bytes - table * 2 * 0.99


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, ("full",) * 4),
        (
            {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 64},
            ("sliding", "full") * 2,
        ),
        ({"hybrid_override_pattern": "M*-M"}, ("mamba", "full", "mlp", "mamba")),
        ({"full_attention_interval": 2}, ("linear_attention", "full") * 2),
        ({"model_type": "gemma2", "sliding_window": 64}, ("sliding", "full") * 2),
        ({"sliding_window": 64, "sliding_window_pattern": 2}, ("sliding", "full") * 2),
        ({"sliding_window": 64}, ("sliding",) * 4),
        ({"sliding_window": 64, "use_sliding_window": False}, ("full",) * 4),
        ({"sliding_window": None}, ("full",) * 4),
        (
            {"model_type": "qwen2", "sliding_window": 64, "max_window_layers": 2},
            ("full", "full", "sliding", "sliding"),
        ),
    ],
)
def test_layer_kinds_from_config(changes: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert spec_from_config(config(**changes), model_id="t").layer_kinds == expected


# ------------------------------------------------------------------------------------- MLA


def test_deepseek_v3_mla_fields() -> None:
    spec = catalog_spec("deepseek-ai/DeepSeek-V3")
    assert spec.is_mla
    assert spec.kv_lora_rank == 512
    assert spec.qk_rope_head_dim == 64
    assert spec.num_layers == 61
    assert spec.num_experts == 256 and spec.num_experts_per_tok == 8
    assert spec.is_moe
    # first_k_dense_replace = 3: layers 0-2 have a dense MLP, no experts.
    assert spec.params.layer_experts[:3] == (0, 0, 0)
    assert all(e > 0 for e in spec.params.layer_experts[3:])
    assert spec.quantization is not None and spec.quantization.method == "fp8"


def test_non_mla_model_has_no_latent() -> None:
    spec = catalog_spec("meta-llama/Llama-3.1-8B")
    assert not spec.is_mla
    assert spec.kv_lora_rank is None and spec.qk_rope_head_dim is None


# ---------------------------------------------------------------------- quantization_config

QUANT_ROWS = [
    (
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
        QuantSpec(method="gptq", bits=4, group_size=128),
    ),
    (
        {"quant_method": "gptq", "bits": 8, "group_size": -1},
        QuantSpec(method="gptq", bits=8, group_size=None),
    ),
    (
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
        QuantSpec(method="awq", bits=4, group_size=128),
    ),
    (
        {"quant_method": "awq", "w_bit": 4, "q_group_size": 64},
        QuantSpec(method="awq", bits=4, group_size=64),
    ),
    (
        {"quant_method": "gptq_marlin", "bits": 4, "group_size": 128},
        QuantSpec(method="gptq", bits=4, group_size=128),
    ),
    (
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        QuantSpec(method="fp8", bits=8, weight_block=128),
    ),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, QuantSpec(method="fp8", bits=8)),
    ({"quant_method": "fbgemm_fp8"}, QuantSpec(method="fbgemm_fp8", bits=8)),
    (
        {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]},
        QuantSpec(method="mxfp4", bits=4, group_size=32, experts_only=True),
    ),
    (
        {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
        QuantSpec(method="bitsandbytes", bits=4),
    ),
    (
        {"quant_method": "bitsandbytes", "load_in_8bit": True},
        QuantSpec(method="bitsandbytes", bits=8),
    ),
    (
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "group_size": 128,
                        "strategy": "group",
                        "type": "int",
                    },
                }
            },
        },
        QuantSpec(method="compressed-tensors", bits=4, group_size=128),
    ),
    (
        {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "strategy": "channel", "type": "float"},
                }
            },
        },
        QuantSpec(method="compressed-tensors", bits=8, group_size=None),
    ),
    ({"quant_method": "compressed-tensors"}, QuantSpec(method="compressed-tensors", bits=8)),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, QuantSpec(method="modelopt", bits=8)),
    (
        {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        QuantSpec(method="modelopt_fp4", bits=4.5),
    ),
    (
        {"quant_method": "GPTQ", "bits": 4, "group_size": 128},
        QuantSpec(method="gptq", bits=4, group_size=128),
    ),
]


@pytest.mark.parametrize(("qc", "expected"), QUANT_ROWS)
def test_quantization_config(qc: dict[str, Any], expected: QuantSpec) -> None:
    spec = spec_from_config(config(quantization_config=qc), model_id="t")
    assert spec.quantization == expected


def test_no_quantization_config() -> None:
    assert spec_from_config(config(), model_id="t").quantization is None


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        # 4 bits + per group of 128 one fp16 scale (2 bytes) and one 4-bit zero (0.5 byte):
        # 0.5 + 2.5/128 = 0.51953125
        (QuantSpec(method="gptq", bits=4, group_size=128), 0.51953125),
        (QuantSpec(method="gptq", bits=4), 0.5),
        (QuantSpec(method="gptq", bits=8, group_size=128), 1.0),  # 8-bit: no group extra
        (QuantSpec(method="fp8", bits=8), 1.0),
        # NF4 double quant: 0.5 + 1/64 (absmax) + 4/(64*256) (fp32 second-level scale)
        (QuantSpec(method="bitsandbytes", bits=4), 0.5 + 1 / 64 + 4 / 16384),
        (QuantSpec(method="bitsandbytes", bits=8), 1.0),
        # MXFP4: 0.5 + one 8-bit exponent per 32 elements = 0.53125
        (QuantSpec(method="mxfp4", bits=4, group_size=32, experts_only=True), 0.53125),
    ],
)
def test_bytes_per_param(quant: QuantSpec, expected: float) -> None:
    assert quant.bytes_per_param == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("model_id", "method", "bits", "group"),
    [
        ("TheBloke/Llama-2-13B-chat-GPTQ", "gptq", 4, 128),
        ("Qwen/Qwen3-32B-FP8", "fp8", 8, None),
        ("openai/gpt-oss-120b", "mxfp4", 4, 32),
        ("unsloth/meta-llama-3.1-8b-instruct-bnb-4bit", "bitsandbytes", 4, None),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "compressed-tensors", 8, None),
        ("TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ", "awq", 4, 128),
    ],
)
def test_catalog_quantization(model_id: str, method: str, bits: int, group: int | None) -> None:
    q = catalog_spec(model_id).quantization
    assert q is not None
    assert (q.method, q.bits, q.group_size) == (method, bits, group)


# ------------------------------------------------------------------ nested text_config


def test_gemma3_text_config_is_flattened() -> None:
    entry = catalog_entry("google/gemma-3-4b-it")
    assert entry is not None and "text_config" in entry.config
    assert "num_hidden_layers" not in entry.config
    spec = catalog_spec("google/gemma-3-4b-it")
    text = entry.config["text_config"]
    assert spec.architecture == "Gemma3ForConditionalGeneration"  # the outer one
    assert spec.model_type == "gemma3_text"
    assert spec.num_layers == text["num_hidden_layers"] == 34
    assert spec.hidden_size == text["hidden_size"] == 2560
    assert (spec.num_kv_heads, spec.head_dim) == (4, 256)
    assert spec.torch_dtype == "bfloat16"  # from the outer config
    # every 6th layer is global: 34 layers -> layers 5, 11, 17, 23, 29 are full
    assert [i for i, k in enumerate(spec.layer_kinds) if k == "full"] == [5, 11, 17, 23, 29]
    assert spec.sliding_window == 1024
    assert spec.tie_word_embeddings


def test_gemma3_max_len_is_not_rope_scaled_again() -> None:
    # vLLM skips the rope factor for gemma3: 131072 is already scaled (not 131072 x 8).
    assert catalog_spec("google/gemma-3-4b-it").max_position_embeddings == 131072


def test_nested_config_keeps_outer_quantization() -> None:
    raw = {
        "architectures": ["XForConditionalGeneration"],
        "torch_dtype": "float16",
        "text_config": config(torch_dtype=None),
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
    }
    spec = spec_from_config(raw, model_id="t")
    assert spec.num_layers == 4
    assert spec.architecture == "XForConditionalGeneration"
    assert spec.torch_dtype == "float16"
    assert spec.quantization == QuantSpec(method="awq", bits=4, group_size=128)


def test_head_dim_read_before_fallback() -> None:
    # Qwen3-style: head_dim 128 although hidden / heads = 512 / 8 = 64.
    assert spec_from_config(config(head_dim=128), model_id="t").head_dim == 128
    assert spec_from_config(config(), model_id="t").head_dim == 64


@pytest.mark.parametrize(
    ("rope", "expected"),
    [
        (None, 4096),
        ({"rope_type": "linear", "factor": 4.0}, 16384),
        ({"type": "dynamic", "factor": 2.0}, 8192),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024}, 4096),
        ({"rope_type": "longrope", "factor": 32.0}, 4096),
        # DeepSeek-V3 / gpt-oss: max_position_embeddings = original x factor already.
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, 4096),
    ],
)
def test_max_len_rope_scaling(rope: dict[str, Any] | None, expected: int) -> None:
    spec = spec_from_config(config(rope_scaling=rope), model_id="t")
    assert spec.max_position_embeddings == expected


# ----------------------------------------------------------------------------------- errors

NAS_BAD_FFN: dict[str, Any] = {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": "x"}}

ERROR_ROWS = [
    pytest.param(config(num_hidden_layers=None), ["num_hidden_layers"], id="missing-layers"),
    pytest.param(config(hidden_size=None), ["hidden_size"], id="missing-hidden"),
    pytest.param(config(vocab_size=None), ["vocab_size"], id="missing-vocab"),
    pytest.param(
        config(num_key_value_heads=3), ["8 attention heads", "3 KV heads"], id="heads-not-divisible"
    ),
    pytest.param(config(hidden_size="4096"), ["'hidden_size'", "'4096'"], id="string-for-int"),
    pytest.param(config(num_hidden_layers=True), ["'num_hidden_layers'"], id="bool-for-int"),
    pytest.param(config(intermediate_size=-1), ["'intermediate_size'", "-1"], id="negative"),
    pytest.param(config(num_hidden_layers=0), ["zero layers"], id="zero-layers"),
    pytest.param(
        config(quantization_config={"quant_method": "hqq", "bits": 4}),
        ["quantization method 'hqq'"],
        id="unknown-quant-method",
    ),
    pytest.param(config(quantization_config={"bits": 4}), ["quant_method"], id="no-quant-method"),
    pytest.param(
        config(layer_types=["full_attention", "mystery", "full_attention", "x"]),
        ["layer type 'mystery'", "layer_types"],
        id="unknown-layer-type",
    ),
    pytest.param(
        config(block_configs=[{"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}}] * 3),
        ["block_configs", "one entry per layer"],
        id="nas-blocks-short",
    ),
    pytest.param(
        config(block_configs=[{"attention": {"n_heads_in_group": "8"}, "ffn": {}}] * 4),
        ["block_configs[0].attention.n_heads_in_group", "'8'"],
        id="nas-group-not-a-count",
    ),
    pytest.param(
        config(block_configs=[NAS_BAD_FFN] * 4),
        ["block_configs[0].ffn.ffn_mult"],
        id="nas-ffn-not-a-number",
    ),
    pytest.param(
        config(block_configs=["layer"] * 4),
        ["block_configs[0]", "attention and ffn"],
        id="nas-block-not-an-object",
    ),
    pytest.param(
        config(block_configs=[{"attention": {"no_op": True}, "ffn": {"no_op": True}}] * 4),
        ["no attention layer"],
        id="nas-no-attention",
    ),
    pytest.param([1, 2, 3], ["JSON object"], id="not-a-dict-list"),
    pytest.param("config", ["JSON object"], id="not-a-dict-str"),
]


@pytest.mark.parametrize(("raw", "fragments"), ERROR_ROWS)
def test_unsupported_config(raw: Any, fragments: list[str]) -> None:
    with pytest.raises(UnsupportedConfigError) as info:
        spec_from_config(raw, model_id="org/model")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert len(message) < 300  # one or two sentences, the rest goes in hint
