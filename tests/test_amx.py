"""The AMX probe and the engine environment built from its answer.

This machine's CPU does not advertise AMX; the hosts that trap it are simulated: /proc/cpuinfo
text with the AMX flags, and the probe's child replaced by one that dies of SIGILL, as the
real probe's bf16 matmul does there. The environment it leads to is then run for real: a
child Python on it sees no AMX.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from oominfer.engines.command import engine_argv
from oominfer.runtime import amx, environment
from oominfer.runtime.amx import Amx, amx_status, probe
from oominfer.runtime.environment import engine_env
from oominfer.settings import EngineSettings

FLAGS = "fpu sse avx512f avx512_bf16 avx512_vnni"
AMX_CPUINFO = f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: {FLAGS} amx_bf16 amx_tile amx_int8\n"  # noqa: E501
PLAIN_CPUINFO = f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {FLAGS}\n"
SIGILL = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
EXITS_0 = [sys.executable, "-c", "pass"]


def counting(argv: list[str], marker: Path) -> list[str]:
    """``argv`` run after appending a line to ``marker``: how many times the probe ran."""
    code = f"open({str(marker)!r}, 'a').write('x')\nimport os, subprocess, sys\n"
    code += f"rc = subprocess.run({argv!r}).returncode\n"
    code += "os.kill(os.getpid(), -rc) if rc < 0 else sys.exit(rc)"
    return [sys.executable, "-c", code]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OOMINFER_AMX", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    return tmp_path / "cache"


def test_flags_are_read_from_cpuinfo() -> None:
    assert amx.advertised(AMX_CPUINFO)
    assert not amx.advertised(PLAIN_CPUINFO)
    assert not amx.advertised("flags\t: amx_bf16_not_really\n")
    assert amx.host_key(AMX_CPUINFO) != amx.host_key(PLAIN_CPUINFO)


def test_a_probe_that_dies_of_sigill_means_amx_traps() -> None:
    assert probe(SIGILL) is Amx.TRAPS
    assert probe(EXITS_0) is Amx.WORKS
    assert probe([sys.executable, "-c", "raise SystemExit(1)"]) is Amx.UNKNOWN
    assert probe([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5) is Amx.UNKNOWN


def test_the_simulated_trap_is_probed_once_and_cached(_own_cache: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert amx_status(cpuinfo=AMX_CPUINFO, probe_argv=counting(SIGILL, runs)) is Amx.TRAPS
    assert runs.read_text() == "x"
    # The answer is kept per host: a probe that would now say otherwise is not run.
    assert amx_status(cpuinfo=AMX_CPUINFO, probe_argv=counting(EXITS_0, runs)) is Amx.TRAPS
    assert runs.read_text() == "x"
    (cached,) = (_own_cache / "cpu").glob("amx-*.json")
    assert json.loads(cached.read_text())["amx"] == "traps"
    # Another CPU (other flags, say after a migration) is another host: probed again.
    other = AMX_CPUINFO.replace("amx_int8", "amx_fp16")
    assert amx_status(cpuinfo=other, probe_argv=counting(EXITS_0, runs)) is Amx.WORKS
    assert runs.read_text() == "xx"


def test_an_undecided_probe_is_not_cached(_own_cache: Path) -> None:
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    assert amx_status(cpuinfo=AMX_CPUINFO, probe_argv=failing) is Amx.UNKNOWN
    assert not list(_own_cache.glob("cpu/amx-*.json"))


def test_no_amx_flag_runs_no_probe(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    assert amx_status(cpuinfo=PLAIN_CPUINFO, probe_argv=counting(SIGILL, runs)) is Amx.ABSENT
    assert not runs.exists()


def test_oominfer_amx_overrides_the_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("OOMINFER_AMX", "off")
    assert amx_status(cpuinfo=PLAIN_CPUINFO, probe_argv=counting(EXITS_0, runs)) is Amx.TRAPS
    assert amx.trap_note().startswith("OOMINFER_AMX=off:")
    monkeypatch.setenv("OOMINFER_AMX", "on")
    assert amx_status(cpuinfo=AMX_CPUINFO, probe_argv=counting(SIGILL, runs)) is Amx.WORKS
    assert not runs.exists()


def simulate(monkeypatch: pytest.MonkeyPatch, probe_argv: list[str]) -> None:
    """engine_env sees an AMX host whose probe child runs ``probe_argv``."""
    monkeypatch.setattr(
        environment, "amx_status", lambda: amx_status(cpuinfo=AMX_CPUINFO, probe_argv=probe_argv)
    )


def test_where_amx_traps_the_engine_starts_without_it(
    monkeypatch: pytest.MonkeyPatch, _own_cache: Path
) -> None:
    simulate(monkeypatch, SIGILL)
    built = engine_env(EngineSettings(), device="cpu", engine="vllm")
    assert built.note.startswith("This CPU advertises AMX but traps it (SIGILL)")
    assert built.env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    site = Path(built.env["PYTHONPATH"].split(os.pathsep)[0])
    assert site.parent == _own_cache / "cpu"  # in the cache: no temporary folder left behind
    assert "_is_amx_tile_supported = lambda: False" in (site / "sitecustomize.py").read_text()


@pytest.mark.needs("torch")
def test_a_child_on_the_trap_environment_runs_torch_without_amx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real child on that environment: torch says no AMX (what vLLM picks its kernels from),
    # and its bf16 matmul runs below AMX.
    simulate(monkeypatch, SIGILL)
    built = engine_env(EngineSettings(), device="cpu", engine="vllm")
    code = (
        "import os, torch\n"
        "print(torch.cpu._is_amx_tile_supported(), os.environ['ONEDNN_MAX_CPU_ISA'])\n"
        "layer = torch.nn.Linear(64, 64, dtype=torch.bfloat16)\n"
        "print(layer(torch.ones(4, 64, dtype=torch.bfloat16)).shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=built.env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["False AVX512_CORE_BF16", "torch.Size([4, 64])"]


def test_where_amx_works_the_engine_asks_for_its_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    simulate(monkeypatch, EXITS_0)
    built = engine_env(EngineSettings(enforce_eager=True), device="cpu", engine="vllm")
    assert built.note == "" and "ONEDNN_MAX_CPU_ISA" not in built.env
    site = Path(built.env["PYTHONPATH"].split(os.pathsep)[0])
    assert "torch.cpu._init_amx()" in (site / "sitecustomize.py").read_text()
    # The same folder every time: written once, reused.
    again = engine_env(EngineSettings(), device="cpu", engine="transformers")
    assert again.env["PYTHONPATH"].split(os.pathsep)[0] == str(site)


def test_without_amx_or_off_the_cpu_the_environment_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    simulate(monkeypatch, SIGILL)
    assert engine_env(EngineSettings(), device="cuda").env["PYTHONPATH"] == "/somewhere"
    monkeypatch.setattr(environment, "amx_status", lambda: amx_status(cpuinfo=PLAIN_CPUINFO))
    built = engine_env(EngineSettings(), device="cpu")
    assert built.env["PYTHONPATH"] == "/somewhere" and built.note == ""


@pytest.mark.parametrize(
    ("engine", "variable"), [("vllm", "VLLM_API_KEY"), ("transformers", "OOMINFER_API_KEY")]
)
def test_the_api_key_goes_through_the_environment(engine: str, variable: str) -> None:
    settings = EngineSettings(kv_cache_memory_bytes=2**26)
    built = engine_env(settings, device="cuda", engine=engine, api_key="sk-secret")  # type: ignore[arg-type]
    assert built.env[variable] == "sk-secret"
    assert "VLLM_CPU_KVCACHE_SPACE" not in built.env  # the flag pins the KV size
    argv = engine_argv("/m", settings, engine=engine, port=1, python="python")  # type: ignore[arg-type]
    assert "sk-secret" not in " ".join(argv)


def test_sigill_is_explained_in_one_line() -> None:
    said = amx.sigill_explanation("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)")
    assert "\n" not in said
    assert "SIGILL" in said and "OOMINFER_AMX=off" in said and "VllmWorker-0" in said
    assert signal.SIGILL == 4
