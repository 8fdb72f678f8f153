"""The transformers server at its edges, as real servers on 127.0.0.1 driven over real sockets.

Bad fields (each a 400 naming the field, harming no other request), clients that give up, the
default ``max_tokens``, huge and slow requests, idle connections, a low open-file limit, the
OpenAPI document. One module-scoped server serves most tests (an API key, max_model_len 2048,
4 sequences per batch, ``--timeout-keep-alive 1 --timeout-request 2 --default-max-tokens 24``);
the open-file-limit test starts its own. The server class and helpers are test_hf_server's.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from extras import TRANSFORMERS_SERVER, needs

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "openai", *TRANSFORMERS_SERVER, "tokenizers")
import httpx  # noqa: E402
from test_hf_server import (  # noqa: E402
    API_KEY,
    HfServer,
    assert_openai_error,
    auth,
    metrics,
    sse_events,
)

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 4
DEFAULT_MAX_TOKENS = 24
KEEP_ALIVE_S = 1
REQUEST_TIMEOUT_S = 2
MAX_BODY_BYTES = 10 * 2**20  # the default --max-body-size
HELLO = [{"role": "user", "content": "Hello! How are you today?"}]


@pytest.fixture(scope="module")
def edge(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HfServer]:
    log = tmp_path_factory.mktemp("hf-edges") / "server.log"
    args = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--max-queue", "16",
            "--timeout-keep-alive", str(KEEP_ALIVE_S), "--timeout-request", str(REQUEST_TIMEOUT_S),
            "--default-max-tokens", str(DEFAULT_MAX_TOKENS)]  # fmt: skip
    with HfServer(tiny_llama, log, args=args, env={"OOMINFER_API_KEY": API_KEY}) as srv:
        yield srv
        assert srv.alive(), srv.log()


def post(server: HfServer, endpoint: str, body: Any, *, timeout: float = 60) -> httpx.Response:
    """POST ``body`` as JSON with \\u escapes (httpx's own encoder refuses lone surrogates)."""
    return httpx.post(
        f"{server.url}/v1/{endpoint}",
        content=json.dumps(body).encode(),
        headers={**auth(), "Content-Type": "application/json"},
        timeout=timeout,
    )


def wait_until(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def idle_after_work(server: HfServer) -> bool:
    m = metrics(server)
    return m["oominfer_batch_size"] == 0 and m["oominfer_queue_depth"] == 0


# bad fields

BAD_FIELDS = [
    # (endpoint, body, the param the 400 names)
    ("completions", {"prompt": "hi", "seed": 2**64, "temperature": 0.8}, "seed"),
    ("completions", {"prompt": "hi", "seed": -(2**63) - 1, "temperature": 0.8}, "seed"),
    ("completions", {"prompt": "hi", "n": 1.5}, "n"),
    ("completions", {"prompt": "hi", "n": 2.0}, "n"),
    ("completions", {"prompt": "\ud800"}, "prompt"),
    ("completions", {"prompt": ["fine", "bad \udfff"]}, "prompt.1"),
    ("completions", {"prompt": "hi", "stop": ["ok", "\ud800"]}, "stop.1"),
    ("completions", {"prompt": "hi", "model": "\ud800"}, "model"),
    ("chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]},
     "messages.0.content"),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "text",
                                                                     "text": "\ud800"}]}]},
     "messages.0"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]},
     "messages.0"),
    ("chat/completions", {"messages": [{"role": "\ud800", "content": "hi"}]}, "messages.0.role"),
]  # fmt: skip

UNSUPPORTED = [
    ("chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("chat/completions", "tool_choice", "required"),
    ("chat/completions", "functions", [{"name": "f"}]),
    ("chat/completions", "response_format", {"type": "json_object"}),
    ("completions", "logit_bias", {"5": 10}),
    ("chat/completions", "logprobs", True),
    ("chat/completions", "presence_penalty", 0.5),
    ("completions", "frequency_penalty", -1),
    ("completions", "echo", True),
    ("completions", "suffix", " the end"),
    ("completions", "best_of", 3),
]

ACCEPTED = [
    # what OpenAI clients send that asks for nothing this backend lacks
    {"n": 1.0},
    {"tools": []},
    {"tool_choice": "none"},
    {"response_format": {"type": "text"}},
    {"logit_bias": {}},
    {"presence_penalty": 0, "frequency_penalty": 0.0},
    {"seed": 2**64 - 1, "temperature": 0.8},
    {"seed": -(2**63), "temperature": 0.8},
    {"max_tokens": 3.0},
]


@pytest.mark.parametrize(("endpoint", "body", "param"), BAD_FIELDS)
def test_bad_field_is_400_naming_it(
    edge: HfServer, endpoint: str, body: dict[str, Any], param: str
) -> None:
    if endpoint == "completions":
        body = {"max_tokens": 2, **body}
    error = assert_openai_error(post(edge, endpoint, body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error


@pytest.mark.parametrize(("endpoint", "field", "value"), UNSUPPORTED)
def test_unsupported_field_is_400_not_ignored(
    edge: HfServer, endpoint: str, field: str, value: Any
) -> None:
    base: dict[str, Any] = {"prompt": "hi"} if endpoint == "completions" else {"messages": HELLO}
    error = assert_openai_error(post(edge, endpoint, {**base, "max_tokens": 2, field: value}), 400)
    assert error["param"] == field, error
    assert error["code"] == "unsupported_parameter"
    assert f"{field} is not supported" in error["message"]


@pytest.mark.parametrize("extra", ACCEPTED, ids=lambda e: ",".join(e))
def test_neutral_values_are_accepted(edge: HfServer, extra: dict[str, Any]) -> None:
    response = post(edge, "chat/completions", {"messages": HELLO, "max_tokens": 3, **extra})
    assert response.status_code == 200, response.text
    assert 1 <= response.json()["usage"]["completion_tokens"] <= 3


def test_deeply_nested_body_is_400(edge: HfServer) -> None:
    body = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = httpx.post(edge.url + "/v1/completions", content=body, timeout=30,
                          headers={**auth(), "Content-Type": "application/json"})  # fmt: skip
    assert_openai_error(response, 400)


def test_bad_seed_harms_no_request_in_flight(edge: HfServer) -> None:
    """Before: the seed reached torch in the batch's sampling step, and every sequence in the
    batch failed with 500."""
    max_tokens = 200

    async def stream(http: httpx.AsyncClient, i: int, started: asyncio.Event) -> list[str]:
        payload = {"prompt": f"Stream {i}", "max_tokens": max_tokens, "temperature": 0.8,
                   "seed": i, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}  # fmt: skip
        lines: list[str] = []
        async with http.stream("POST", edge.url + "/v1/completions", json=payload) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    started.set()
        return lines

    async def run() -> tuple[list[list[str]], list[httpx.Response]]:
        async with httpx.AsyncClient(headers=auth(), timeout=120) as http:
            started = [asyncio.Event() for _ in range(MAX_NUM_SEQS - 1)]
            streams = [asyncio.create_task(stream(http, i, e)) for i, e in enumerate(started)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            bad = [
                await http.post(
                    edge.url + "/v1/completions",
                    json={
                        "prompt": "Bad seed",
                        "max_tokens": 50,
                        "temperature": 0.8,
                        "seed": seed,
                        "stream": stream_,
                    },
                )
                for seed, stream_ in ((2**64, False), (-(2**63) - 1, True), (2**70, False))
            ]
            return await asyncio.gather(*streams), bad

    streams, bad = asyncio.run(run())
    for response in bad:
        error = assert_openai_error(response, 400)
        assert error["param"] == "seed" and "64-bit seed" in error["message"], error
    for lines in streams:
        events, done = sse_events(lines)
        assert done and not any("error" in e for e in events), lines[-3:]
        assert events[-1]["usage"]["completion_tokens"] == max_tokens


def test_bearer_scheme_is_case_insensitive(edge: HfServer) -> None:
    for scheme in ("Bearer", "bearer", "BEARER"):
        response = httpx.get(edge.url + "/v1/models",
                             headers={"Authorization": f"{scheme} {API_KEY}"})  # fmt: skip
        assert response.status_code == 200, (scheme, response.text)
    for header in (f"Basic {API_KEY}", "bearer sk-wrong", f"Bearer{API_KEY}", API_KEY):
        response = httpx.get(edge.url + "/v1/models", headers={"Authorization": header})
        assert_openai_error(response, 401)


# clients that give up


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_client_that_gives_up_frees_its_batch_slot(edge: HfServer, stream: bool) -> None:
    """Fill every batch slot with long requests whose clients leave after a second; the slots
    free at once and a new request is answered. Before: the requests generated on for nobody
    (1,500 tokens each here) while new ones waited."""
    assert idle_after_work(edge)
    before = metrics(edge).get('oominfer_requests_total{path="/v1/completions",status="499"}', 0)
    payload = {"prompt": "Long", "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
               "stream": stream}  # fmt: skip

    async def give_up(http: httpx.AsyncClient) -> None:
        if stream:
            async with http.stream("POST", edge.url + "/v1/completions", json=payload) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return  # closes the connection mid-stream
        else:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(edge.url + "/v1/completions", json=payload)

    async def run() -> None:
        timeout = httpx.Timeout(60, read=1.0) if not stream else httpx.Timeout(60)
        async with httpx.AsyncClient(headers=auth(), timeout=timeout) as http:
            await asyncio.gather(*(give_up(http) for _ in range(MAX_NUM_SEQS)))

    asyncio.run(run())
    assert wait_until(lambda: idle_after_work(edge), 3), metrics(edge)
    started = time.monotonic()
    reply = post(edge, "completions", {"prompt": "Next", "max_tokens": 8, "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - started < 10
    if not stream:
        after = metrics(edge)['oominfer_requests_total{path="/v1/completions",status="499"}']
        assert after == before + MAX_NUM_SEQS


# default max_tokens


def test_chat_without_max_tokens_stops_at_the_default(edge: HfServer) -> None:
    """Before: a chat with no max_tokens ran to the end of the context (2,048 tokens here)."""
    chat = post(edge, "chat/completions",
                {"messages": HELLO, "temperature": 0, "ignore_eos": True})  # fmt: skip
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
    assert chat.json()["choices"][0]["finish_reason"] == "length"
    more = {"messages": HELLO, "temperature": 0, "ignore_eos": True, "max_tokens": 40}
    asked = post(edge, "chat/completions", more)
    assert asked.json()["usage"]["completion_tokens"] == 40  # a request may ask for more
    completion = post(edge, "completions", {"prompt": "Hi", "ignore_eos": True})
    assert completion.json()["usage"]["completion_tokens"] == 16  # OpenAI's default
    # with less context left than the default, the default shrinks (vLLM's min), no 400
    near_end = post(edge, "completions", {"prompt": [5] * (MAX_MODEL_LEN - 6), "ignore_eos": True})
    assert near_end.status_code == 200, near_end.text
    assert near_end.json()["usage"]["completion_tokens"] == 6
    assert f"default_max_tokens={DEFAULT_MAX_TOKENS}" in edge.log(400)


def test_default_max_tokens_rule() -> None:
    import transformers

    generation_config: Any = transformers.GenerationConfig

    from oominfer.engines.transformers.config import DEFAULT_MAX_TOKENS as BUILT_IN
    from oominfer.engines.transformers.prompts import default_max_tokens

    assert BUILT_IN == 4096
    assert default_max_tokens(None, None) == BUILT_IN
    assert default_max_tokens(None, generation_config()) == BUILT_IN
    assert default_max_tokens(None, generation_config(max_new_tokens=300)) == 300
    assert default_max_tokens(12, generation_config(max_new_tokens=300)) == 12


# huge and slow requests


def test_huge_prompt_does_not_stall_health(edge: HfServer) -> None:
    """A 5 MB prompt takes seconds to tokenize; /health answers meanwhile. Before: the event
    loop tokenized it and /health waited 4.7 s."""
    prompt = "The quick brown fox jumps over the lazy dog. " * (5_000_000 // 45)
    result: dict[str, Any] = {}

    def send() -> None:
        started = time.monotonic()
        result["response"] = post(edge, "completions", {"prompt": prompt, "max_tokens": 4},
                                  timeout=120)  # fmt: skip
        result["seconds"] = time.monotonic() - started

    sender = threading.Thread(target=send)
    sender.start()
    latencies: list[float] = []
    with httpx.Client(timeout=30) as http:
        while sender.is_alive():
            started = time.monotonic()
            assert http.get(edge.url + "/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
    sender.join()
    error = assert_openai_error(result["response"], 400)
    assert error["code"] == "context_length_exceeded"
    assert result["seconds"] > 1.0  # it was long enough to matter
    assert len(latencies) >= 5 and max(latencies) < 1.0, (result["seconds"], latencies)


def raw_request(server: HfServer, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(head.replace("\n", "\r\n").encode() + body)
    return sock


def read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    sock.settimeout(seconds)
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    return data, time.monotonic() - started


def status_and_json(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


def test_body_over_the_limit_is_413(edge: HfServer) -> None:
    """Before: a 20 MB body was read, parsed and tokenized."""
    # announced by Content-Length
    big = b'{"prompt": "' + b"a" * 20_000_000 + b'"}'
    response = httpx.post(edge.url + "/v1/completions", content=big, timeout=60,
                          headers={**auth(), "Content-Type": "application/json"})  # fmt: skip
    message = assert_openai_error(response, 413)["message"]
    assert f"{len(big):,} bytes" in message and f"{MAX_BODY_BYTES:,}" in message, message
    assert "--max-body-size" in message
    # chunked: refused once what arrived passes the limit
    chunk = b"a" * 2**20
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(11)) + b"0\r\n\r\n"
    sock = raw_request(edge, f"POST /v1/completions HTTP/1.1\nHost: x\n"
                       f"Authorization: Bearer {API_KEY}\nContent-Type: application/json\n"
                       "Transfer-Encoding: chunked\n\n", chunks)  # fmt: skip
    status, body = status_and_json(read_until_closed(sock, KEEP_ALIVE_S + 10)[0])
    assert status == 413, body
    assert "more than" in body["error"]["message"]
    # under the limit: read and judged on its merits
    small = post(edge, "completions", {"prompt": "a " * 300_000, "max_tokens": 2})
    assert assert_openai_error(small, 400)["code"] == "context_length_exceeded"
    assert httpx.get(edge.url + "/health").status_code == 200
    assert metrics(edge)['oominfer_requests_total{path="/v1/completions",status="413"}'] >= 2


# idle and slow connections


def test_silent_connections_are_closed(edge: HfServer) -> None:
    """Connections that never send a request are closed after --timeout-keep-alive. Before:
    300 of them stayed open past 95 s."""
    socks = [socket.create_connection(("127.0.0.1", edge.port)) for _ in range(20)]
    for sock in socks:
        data, seconds = read_until_closed(sock, KEEP_ALIVE_S + 5)
        assert data == b""
    assert seconds < KEEP_ALIVE_S + 3


def test_idle_keep_alive_connection_is_closed(edge: HfServer) -> None:
    sock = raw_request(edge, "GET /health HTTP/1.1\nHost: x\n\n")
    data, seconds = read_until_closed(sock, KEEP_ALIVE_S + 5)
    assert data.startswith(b"HTTP/1.1 200"), data
    assert KEEP_ALIVE_S * 0.8 < seconds < KEEP_ALIVE_S + 3


def test_slow_headers_get_408(edge: HfServer) -> None:
    """A client that trickles its headers (a byte every 0.2 s) is cut off after
    --timeout-request. Before: it held its connection for as long as it kept trickling."""
    sock = raw_request(edge, "GET /health HTTP/1.1\nHost: x\n")
    started = time.monotonic()
    with sock:
        sock.settimeout(0.2)
        data = b""
        while time.monotonic() - started < REQUEST_TIMEOUT_S + 5:
            try:
                sock.sendall(b"X")
            except OSError:  # closed by the server
                break
            if select.select([sock], [], [], 0.2)[0]:
                data = sock.recv(65536)
                break
    seconds = time.monotonic() - started
    assert data.startswith(b"HTTP/1.1 408"), data
    assert REQUEST_TIMEOUT_S * 0.8 < seconds < REQUEST_TIMEOUT_S + 3
    assert httpx.get(edge.url + "/health").status_code == 200


def test_slow_body_gets_408(edge: HfServer) -> None:
    sock = raw_request(edge, f"POST /v1/completions HTTP/1.1\nHost: x\nAuthorization: Bearer "
                       f"{API_KEY}\nContent-Type: application/json\nContent-Length: 100\n\n",
                       b'{"prompt": ')  # fmt: skip
    data, seconds = read_until_closed(sock, REQUEST_TIMEOUT_S + 5)
    status, body = status_and_json(data)
    assert status == 408, data
    assert body["error"]["code"] == "request_timeout"
    assert "--timeout-request" in body["error"]["message"]
    assert REQUEST_TIMEOUT_S * 0.8 < seconds < REQUEST_TIMEOUT_S + 3


def test_open_file_limit_leaves_health_reachable(tiny_llama: Path, tmp_path: Path) -> None:
    """With 256 descriptors, 300 silent connections: the cap (derived from the limit) closes
    the idle ones, and /health answers. Before: the server ran out of descriptors, stopped
    accepting, and /health was unreachable. Started on 0.0.0.0 with no API key: it warns."""
    args = ["--dtype", "float32", "--max-model-len", "128", "--timeout-keep-alive", "120"]
    with HfServer(tiny_llama, tmp_path / "nofile.log", args=args, host="0.0.0.0",
                  nofile=256) as srv:  # fmt: skip
        log = srv.log(400)
        warnings = [line for line in log.splitlines() if "no API key" in line]
        assert len(warnings) == 1 and "0.0.0.0" in warnings[0], log
        cap = int(re.findall(r"max_connections=(\d+)", log)[0])
        assert 16 < cap < 256 - 64, log
        socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(300)]
        try:
            started = time.monotonic()
            health = httpx.get(srv.url + "/health", timeout=10)
            assert health.status_code == 200
            assert time.monotonic() - started < 2
            reply = httpx.post(srv.url + "/v1/completions", timeout=30,
                               json={"prompt": "hi", "max_tokens": 3})  # fmt: skip
            assert reply.status_code == 200, reply.text
            readable, _, _ = select.select(socks, [], [], 2)
            closed = [s for s in readable if s.recv(1) == b""]
            assert len(closed) >= 300 - cap, (len(closed), cap)
        finally:
            for sock in socks:
                sock.close()
        assert "closing the ones idle longest" in srv.log(400)
        assert srv.alive()


# OpenAPI


def test_openapi_publishes_the_request_schemas(edge: HfServer) -> None:
    response = httpx.get(edge.url + "/openapi.json")  # open, like /health
    assert response.status_code == 200, response.text
    doc = response.json()
    schemas = doc["components"]["schemas"]
    for path, name, required in (("/v1/completions", "CompletionRequest", "prompt"),
                                 ("/v1/chat/completions", "ChatRequest", "messages")):  # fmt: skip
        operation = doc["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"] == f"#/components/schemas/{name}"
        assert required in schemas[name]["required"]
        assert set(operation["responses"]) >= {"200", "400", "401", "413", "429"}
        assert "422" not in operation["responses"]  # validation errors are 400s here
        assert operation["security"] == [{"bearer": []}]
    seed = schemas["CompletionRequest"]["properties"]["seed"]
    assert seed["maximum"] == 2**64 - 1 and seed["minimum"] == -(2**63)
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "HTTPValidationError" not in schemas
    assert {"/health", "/metrics", "/v1/models"} <= set(doc["paths"])


def test_help_lists_the_new_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from oominfer.engines.transformers.config import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--max-body-size", "--default-max-tokens", "--timeout-keep-alive",
                 "--timeout-request", "--max-connections"):  # fmt: skip
        assert flag in text
    assert "gets 413 (default: 10MiB)" in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-body-size", "lots"], "cannot read the size 'lots'"),
        (["--max-body-size", "0"], "must be positive"),
        (["--max-connections", "0"], "--max-connections must be positive, got 0"),
        (["--timeout-request", "-1"], "--timeout-request must be positive, got -1"),
        (["--default-max-tokens", "0"], "--default-max-tokens must be positive, got 0"),
    ],
)
def test_bad_limit_flags_are_refused(flags: list[str], message: str) -> None:
    from oominfer.base.errors import InvalidSettingError
    from oominfer.engines.transformers.config import parse_args, resolve_config

    with pytest.raises(InvalidSettingError, match=re.escape(message)):
        resolve_config(parse_args(["--model", "m", *flags]))
