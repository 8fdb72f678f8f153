"""The probe's branches, its watcher, its clean-up and the lifeline, on a fake engine.

tests/fake_engine.py is given to the real EngineProber as the engine's Python, so the
product's argv, environment builder, lifeline, watcher, load test over HTTP and clean-up all
run, on real child processes that print real vLLM log lines, in seconds. Each test marks its
fake's processes (``OOMINFER_TEST_MARK``) and checks that none is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone

from oominfer.runtime.process import group_pids, start_engine, stop
from oominfer.runtime.status import ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.verify.prober import EngineProber, ProbeResult

SETTINGS = EngineSettings(max_model_len=512, max_num_seqs=4)
DEADLINE_S = 5.0


@pytest.fixture
def mark(monkeypatch: pytest.MonkeyPatch) -> str:
    """A name on every process of this test's fake engine."""
    name = f"fake-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv(MARK_VARIABLE, name)
    return name


def probe(
    python: Path, tmp_path: Path, cues: str, monkeypatch: pytest.MonkeyPatch, **kw: object
) -> tuple[ProbeResult, EngineProber, float]:
    monkeypatch.setenv("FAKE_ENGINE", cues)
    options: dict[str, object] = {"poll_seconds": 0.05, **kw}
    prober = EngineProber(workdir=tmp_path / "logs", python=str(python), **options)  # type: ignore[arg-type]
    start = time.monotonic()
    result = prober("/models/fake", SETTINGS, engine="vllm", device="cpu")
    return result, prober, time.monotonic() - start


def test_a_ready_engine_is_loaded_at_the_plans_limits(
    fake_engine_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark: str
) -> None:
    launches: list[tuple[int, list[str], Path]] = []
    progress: list[str] = []
    result, _, _ = probe(fake_engine_python, tmp_path, "ready", monkeypatch,
                         on_launch=lambda n, argv, log: launches.append((n, argv, log)),
                         on_progress=lambda s, phase: progress.append(phase))  # fmt: skip
    assert result.status is ProbeStatus.READY, result.detail
    assert result.requests_ok == 1 + 4  # one at max_model_len, then max_num_seqs at once
    # The max_num_seqs concurrent requests are timed: the speed the engine served them at.
    assert result.load is not None and result.load.concurrency == 4
    assert result.load.output_tokens == 4 * 8 and result.load.output_tokens_per_s
    assert result.facts.phase == "ready"
    # each new phase is reported at once (a live status line), the load test last
    assert progress[0] == "starting" and progress[-1] == "loading at the plan's limits"
    ((n, argv, log),) = launches
    assert n == 1 and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    text = log.read_text()
    assert text.startswith("$ " + " ".join(argv)) and "Application startup complete." in text
    assert result.peak_rss_bytes is not None and result.peak_rss_bytes > 0
    assert leftovers(mark) == []


@pytest.mark.parametrize(
    ("cues", "status", "said"),
    [
        ("hang", ProbeStatus.TIMEOUT, "not ready after 5 s (last phase: loading weights)"),
        ("crash", ProbeStatus.CRASHED, "the engine exited with status 1"),
        ("kv_too_small", ProbeStatus.KV_CACHE_TOO_SMALL, "estimated maximum model length is"),
        ("sigill", ProbeStatus.ILLEGAL_INSTRUCTION, "died with SIGILL (illegal instruction)"),
        ("sigill_on_request", ProbeStatus.ILLEGAL_INSTRUCTION, "OOMINFER_AMX=off"),
        ("hang,children,ignore_term", ProbeStatus.TIMEOUT, "last phase: loading weights"),
    ],
)
def test_each_failure_is_classified_and_cleaned_up(
    fake_engine_python: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mark: str,
    cues: str,
    status: ProbeStatus,
    said: str,
) -> None:
    # Where AMX needs its init (runtime/amx.py), every engine Python imports torch first
    # (the sitecustomize the environment builder adds): 1.5 s or more on two cores before
    # the fake prints a line, so the deadline leaves room for it. The fakes that end by
    # themselves get more (a busy machine once made a crash a timeout at 5 s); the hangs
    # wait out the 5 s their message names.
    deadline = DEADLINE_S if "hang" in cues else 30.0
    result, _, seconds = probe(fake_engine_python, tmp_path, cues, monkeypatch,
                               deadline_seconds=deadline, stop_grace_seconds=1.0)  # fmt: skip
    assert result.status is status, result.detail
    assert said in result.detail
    assert "\n" not in result.detail
    # The deadline, then at most the stop grace (SIGTERM ignored: SIGKILL) and the lifeline's.
    assert seconds < deadline + 1.0 + 5.0
    assert leftovers(mark) == []
    if status is ProbeStatus.KV_CACHE_TOO_SMALL:
        assert result.facts.estimated_max_model_len == 65408


def test_grandchildren_that_ignore_sigterm_are_gone_after_a_ready_probe(
    fake_engine_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark: str
) -> None:
    result, _, seconds = probe(fake_engine_python, tmp_path, "ready,children,ignore_term",
                               monkeypatch, stop_grace_seconds=1.0)  # fmt: skip
    assert result.status is ProbeStatus.READY, result.detail
    assert seconds < 6
    assert leftovers(mark) == []


def test_the_amx_workaround_is_told(
    fake_engine_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark: str
) -> None:
    # (each engine process then imports torch at start, as the workaround's sitecustomize does)
    monkeypatch.setenv("OOMINFER_AMX", "off")
    notes: list[str] = []
    result, _, _ = probe(fake_engine_python, tmp_path, "crash", monkeypatch,
                              on_note=notes.append)  # fmt: skip
    assert result.status is ProbeStatus.CRASHED
    assert notes == ["OOMINFER_AMX=off: the engine starts without AMX "
                     "(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, torch told so)."]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["sh", "-c", "exit 0"], 0),
        (["sh", "-c", "exit 7"], 7),
        ([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"], -4),
        (["/nonexistent/engine"], 127),
    ],
)
def test_the_lifeline_exits_as_the_engine_did(argv: list[str], status: int) -> None:
    proc = start_engine(argv, env=os.environ, stdout=subprocess.DEVNULL)
    assert proc.wait(timeout=30) == status
    stop(proc)
    assert group_pids(proc.pid) == []


def test_an_engine_that_exits_takes_its_children_with_it(tmp_path: Path, mark: str) -> None:
    # The engine starts a child and a grandchild that outlive it; the lifeline stops them and
    # reaps them (it is their subreaper), then exits with the engine's status.
    code = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, {str(Path(__file__).with_name("fake_engine.py"))!r},
                          "--child", "1"])
        import time; time.sleep(1.0); sys.exit(3)
    """)
    env = {**os.environ, "FAKE_ENGINE": ""}
    proc = start_engine([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)
    assert proc.wait(timeout=30) == 3
    assert leftovers(mark) == []


DRIVER = """
import sys
from pathlib import Path
from oominfer.settings import EngineSettings
from oominfer.runtime.process import interrupts_kill_engines
from oominfer.verify.prober import EngineProber

prober = EngineProber(workdir=Path(sys.argv[2]), python=sys.argv[1], deadline_seconds=300,
                      stop_grace_seconds=1.0)
try:
    with interrupts_kill_engines():
        prober("/models/fake", EngineSettings(max_model_len=512), engine="vllm", device="cpu")
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_no_engine_outlives_a_probing_oominfer_however_it_dies(
    fake_engine_python: Path, tmp_path: Path, mark: str, sig: signal.Signals
) -> None:
    """oominfer verifying (an engine with a child and a grandchild, as vLLM's EngineCore and
    Worker) is killed or signalled: nothing of the engine is left 10 s later. SIGKILL leaves it
    to the lifeline; the others to oominfer's own clean-up. (Children that ignore SIGTERM:
    test_serve_front.py's SIGKILL test.)"""
    env = {**os.environ, "FAKE_ENGINE": "hang,children"}
    # A shell's background job inherits SIGINT ignored, and Python then keeps it ignored:
    # the driver starts with the default disposition, as in a terminal.
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake_engine_python), str(tmp_path)], env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while len(leftovers(mark)) < 4:  # lifeline, engine, child, grandchild
            assert time.monotonic() < deadline and driver.poll() is None, leftovers(mark)
            time.sleep(0.1)
        os.kill(driver.pid, sig)
        status = driver.wait(timeout=30)
        assert status == (-sig if sig is signal.SIGKILL else 130)
        assert wait_until_gone(mark) == []
    finally:
        if driver.poll() is None:
            driver.kill()
