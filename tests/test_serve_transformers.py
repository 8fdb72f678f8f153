"""`oominfer serve` on a transformers plan: the real CLI, oominfer's server behind the front.

Each test starts its own `oominfer serve` (the tiny model loads in seconds): requests with and
without the API key, the key on no command line, a stream cut at the end of the grace period,
and `kill -9` leaving no engine behind.
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
from pathlib import Path

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone
from extras import TRANSFORMERS_SERVER, needs

from oominfer.planning.document import Plan
from oominfer.runtime.process import free_port
from oominfer.settings import EngineSettings

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "uvicorn", *TRANSFORMERS_SERVER, "tokenizers")
import httpx  # noqa: E402

pytestmark = pytest.mark.slow

KEY = f"sk-{uuid.uuid4().hex}"


@pytest.fixture
def serve(tiny_llama: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """`oominfer serve plan.json --grace-period 2` with $OOMINFER_API_KEY: (process, URL, mark)."""
    settings = EngineSettings(dtype="float32", max_model_len=8192, max_num_seqs=4)
    plan = Plan(model_id=str(tiny_llama), engine="transformers", device="cpu", settings=settings)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    port = free_port()
    mark = f"serve-{uuid.uuid4().hex[:10]}"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "oominfer", "serve", str(path), "--port", str(port),
             "--grace-period", "2"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, MARK_VARIABLE: mark, "OOMINFER_API_KEY": KEY},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield proc, url, mark
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the lifeline stops the engine
            proc.wait()


def test_requests_need_the_key_which_is_on_no_engine_command_line(
    serve: tuple[subprocess.Popen[bytes], str, str],
) -> None:
    proc, url, mark = serve
    processes = leftovers(mark)
    assert any("oominfer.engines.transformers" in p for p in processes), processes
    assert not [p for p in processes if KEY in p]
    # The tiny model's random weights may sample its end-of-sequence token: ignore_eos makes
    # the count of tokens the test's, as in the server's own tests.
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "ignore_eos": True}  # fmt: skip
    models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    body["model"] = models["data"][0]["id"]
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert wait_until_gone(mark, 10) == []


def test_a_stream_past_the_grace_period_ends_with_an_error(
    serve: tuple[subprocess.Popen[bytes], str, str],
) -> None:
    proc, url, mark = serve
    auth = {"Authorization": f"Bearer {KEY}"}
    model = httpx.get(url + "/v1/models", headers=auth).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Once", "max_tokens": 8000, "stream": True,
            "ignore_eos": True}  # fmt: skip
    events: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=auth,
                      timeout=60) as r:  # fmt: skip
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                start = time.monotonic()
                os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=15) == 6
    assert time.monotonic() - start < 2 + 10
    assert events[-1] == "[DONE]"
    assert "grace period of 2 s ran out" in json.loads(events[-2])["error"]["message"]
    assert wait_until_gone(mark, 10) == []


def test_sigkill_of_serve_leaves_no_engine(serve: tuple[subprocess.Popen[bytes], str, str]) -> None:
    proc, _, mark = serve
    assert len(leftovers(mark)) >= 3  # serve, the lifeline, the server
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert wait_until_gone(mark, 10) == []
