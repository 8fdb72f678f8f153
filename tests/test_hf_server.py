"""The transformers backend (oominfer.engines.transformers) as real servers on 127.0.0.1.

Each server is a child process in its own process group, driven by the ``openai`` client and
httpx. One module-scoped server (with an API key, a small queue and max_model_len 256) serves
most tests; the out-of-memory, SIGTERM and bitsandbytes tests start their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from engine_util import free_port
from extras import TRANSFORMERS_SERVER, needs

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "openai", *TRANSFORMERS_SERVER, "tokenizers")
import httpx  # noqa: E402
import openai  # noqa: E402

pytestmark = pytest.mark.slow

API_KEY = "sk-oominfer-test"
MODEL_NAME = "tiny"
MAX_MODEL_LEN = 256
START_DEADLINE_S = 120.0


class HfServer:
    """``python -m oominfer.engines.transformers`` in its own process group."""

    def __init__(
        self,
        model_dir: Path,
        log_path: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        nofile: int | None = None,
        launcher: Sequence[str] = ("-m", "oominfer.engines.transformers"),
    ) -> None:
        """``nofile``: the child's open-file limit (RLIMIT_NOFILE), when given; ``launcher``:
        what the interpreter runs (a test's wrapper of the server, say)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.argv = [
            sys.executable, *launcher,
            "--model", str(model_dir), "--host", host, "--port", str(self.port),
            "--served-model-name", MODEL_NAME, *args,
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None

    def _limit_files(self) -> None:
        """In the child, before exec."""
        if self.nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, hard))

    def start(self) -> HfServer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, preexec_fn=self._limit_files if self.nofile else None,
            )  # fmt: skip
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.25)
        self.stop()
        pytest.fail(f"server not healthy after {START_DEADLINE_S} s:\n{self.log()}")

    def log(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL whatever is left; only our own pid's group."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> HfServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def client(server: HfServer, *, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def metrics(server: HfServer) -> dict[str, float]:
    """The unlabelled samples of /metrics, plus labelled ones under their full name."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def sse_events(lines: Sequence[str]) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events of a server-sent-event stream, and whether it ended with [DONE]."""
    data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    done = bool(data) and data[-1] == "[DONE]"
    return [json.loads(d) for d in data if d != "[DONE]"], done


def assert_openai_error(response: httpx.Response, status: int | tuple[int, ...]) -> dict[str, Any]:
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    return dict(error)


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HfServer]:
    """float32, max_model_len 256, 4 sequences per batch, 16 waiting, API key from the env."""
    log = tmp_path_factory.mktemp("hf-server") / "server.log"
    args = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4",
            "--max-queue", "16"]  # fmt: skip
    with HfServer(tiny_llama, log, args=args, env={"OOMINFER_API_KEY": API_KEY}) as srv:
        yield srv
        assert srv.alive(), srv.log()


# the API


def test_models_and_health(server: HfServer) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    raw = httpx.get(server.url + "/v1/models", headers=auth()).json()
    assert raw["data"][0]["max_model_len"] == MAX_MODEL_LEN
    health = httpx.get(server.url + "/health")  # open without the key
    assert health.status_code == 200, health.text
    assert health.json() == {"status": "ok"}


def test_plan_is_logged(server: HfServer) -> None:
    log = server.log(lines=400)
    assert "dtype=float32" in log
    assert "max_model_len=256 max_num_seqs=4" in log
    assert "api_key=set" in log
    assert API_KEY not in log


def test_completion(server: HfServer) -> None:
    c = client(server)
    first = c.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    again = c.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert first.object == "text_completion"
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None and first.usage.completion_tokens == 8
    assert first.usage.prompt_tokens > 0
    assert first.choices[0].text == again.choices[0].text  # greedy is deterministic


def test_completion_sampling_with_seed(server: HfServer) -> None:
    c = client(server)
    texts = [
        c.completions.create(
            model=MODEL_NAME, prompt="Hello", max_tokens=6, temperature=0.9, top_p=0.9, seed=7,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for _ in range(2)
    ]  # fmt: skip
    assert texts[0] == texts[1]


def test_chat(server: HfServer) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather like?"},
        ],
        max_tokens=6,
        temperature=0,
    )
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 6
    # the template wraps each message in role markers: more tokens than the text alone
    assert reply.usage.prompt_tokens > 10


def test_streaming_completion_ends_with_done(server: HfServer) -> None:
    body = {"model": MODEL_NAME, "prompt": "Numbers: 0 1 2", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    whole = httpx.post(server.url + "/v1/completions", json=body, headers=auth(), timeout=60)
    assert whole.status_code == 200, whole.text
    with httpx.stream(
        "POST", server.url + "/v1/completions", headers=auth(), timeout=60,
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:  # fmt: skip
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    events, done = sse_events(lines)
    assert done, lines[-3:]
    assert all(e["object"] == "text_completion" for e in events)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == whole.json()["choices"][0]["text"]
    reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert reasons == ["length"]
    assert events[-1]["usage"]["completion_tokens"] == 12


def test_streaming_chat_with_openai_client(server: HfServer) -> None:
    c = client(server)
    messages: list[Any] = [{"role": "user", "content": "Hello! How are you today?"}]
    whole = c.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0
    )
    stream = c.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_metrics(server: HfServer) -> None:
    client(server).completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=2)
    response = httpx.get(server.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    m = metrics(server)
    assert m['oominfer_requests_total{path="/v1/completions",status="200"}'] >= 1
    assert m["oominfer_prompt_tokens_total"] > 0
    assert m["oominfer_generation_tokens_total"] >= 2
    for gauge in ("oominfer_queue_depth", "oominfer_batch_size", "oominfer_max_num_seqs",
                  "oominfer_kv_cache_bytes"):  # fmt: skip
        assert gauge in m
    assert m["oominfer_max_num_seqs"] == 4
    assert m["process_resident_memory_bytes"] > 50 * 2**20
    assert m["oominfer_model_weights_bytes"] > 0


# errors

BAD_REQUESTS = [
    # (endpoint, raw body, expected param or None)
    ("completions", b'{"prompt": "hi", ', None),  # malformed JSON
    ("completions", b"[1, 2, 3]", None),  # not an object
    ("completions", b"", None),  # no body
    ("completions", b'{"max_tokens": 5}', "prompt"),  # missing field
    ("completions", b'{"prompt": "hi", "max_tokens": "ten"}', "max_tokens"),
    ("completions", b'{"prompt": "hi", "max_tokens": -1}', "max_tokens"),
    ("completions", b'{"prompt": "hi", "max_tokens": 2.5}', "max_tokens"),
    ("completions", b'{"prompt": "hi", "temperature": "hot"}', "temperature"),
    ("completions", b'{"prompt": "hi", "temperature": 9}', "temperature"),
    ("completions", b'{"prompt": "hi", "stream": "yes"}', "stream"),
    ("completions", b'{"prompt": 42}', "prompt"),
    ("completions", b'{"prompt": [999999]}', "prompt"),  # token id outside the vocabulary
    ("completions", b'{"prompt": ""}', "prompt"),
    ("completions", b'{"prompt": "hi", "n": 2}', "n"),
    ("chat/completions", b'{"max_tokens": 5}', "messages"),
    ("chat/completions", b'{"messages": "hello"}', "messages"),
    ("chat/completions", b'{"messages": []}', "messages"),
    ("chat/completions", b'{"messages": [{"content": "no role"}]}', "messages.0.role"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', None),
]


@pytest.mark.parametrize(("endpoint", "body", "param"), BAD_REQUESTS)
def test_bad_request_is_400_in_openai_shape(
    server: HfServer, endpoint: str, body: bytes, param: str | None
) -> None:
    response = httpx.post(
        f"{server.url}/v1/{endpoint}",
        content=body,
        headers={**auth(), "Content-Type": "application/json"},
        timeout=30,
    )
    error = assert_openai_error(response, (400, 422))
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


def test_unknown_model_is_404(server: HfServer) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(server).completions.create(model="gpt-17", prompt="hi", max_tokens=2)
    assert "tiny" in str(info.value)


def test_over_long_prompt_is_400_with_the_numbers(server: HfServer) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 40
    response = httpx.post(
        server.url + "/v1/completions", headers=auth(), timeout=30,
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 10},
    )  # fmt: skip
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    m = re.search(
        r"maximum context length is (\d+) tokens.*requested (\d+) tokens \((\d+) in the prompt, "
        r"(\d+) in the completion\)",
        error["message"],
    )
    assert m, error["message"]
    limit, total, prompt_tokens, completion = (int(g) for g in m.groups())
    assert (limit, completion) == (MAX_MODEL_LEN, 10)
    assert total == prompt_tokens + 10 and prompt_tokens > MAX_MODEL_LEN

    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=300
        )
    assert "256" in str(info.value) and "300" in str(info.value)


def test_api_key(server: HfServer) -> None:
    missing = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"})
    error = assert_openai_error(missing, 401)
    assert error["code"] == "invalid_api_key"
    wrong = httpx.get(server.url + "/v1/models", headers=auth("sk-wrong"))
    assert_openai_error(wrong, 401)
    with pytest.raises(openai.AuthenticationError):
        client(server, key="sk-wrong").models.list()
    assert httpx.get(server.url + "/health").status_code == 200


# load


async def _load_client(
    http: httpx.AsyncClient, url: str, index: int, requests: int, statuses: Counter[int]
) -> int:
    """Send ``requests`` requests, retrying on 429 as Retry-After says; return successes."""
    ok = 0
    for r in range(requests):
        kind = (index + r) % 3
        if kind == 2:
            path = "/v1/chat/completions"
            body: dict[str, Any] = {"messages": [{"role": "user", "content": f"Hi {index} {r}"}]}
        else:
            path = "/v1/completions"
            body = {"prompt": f"Request {index}.{r}: the quick brown fox"}
        body |= {"max_tokens": 4 + (index * 7 + r) % 13, "temperature": 0.7, "stream": kind == 1}
        for _attempt in range(60):
            if kind == 1:
                async with http.stream("POST", url + path, json=body) as response:
                    lines = [line async for line in response.aiter_lines()]
            else:
                response = await http.post(url + path, json=body)
                lines = []
            statuses[response.status_code] += 1
            if response.status_code == 429:
                assert response.headers["Retry-After"] == "1"
                await asyncio.sleep(float(response.headers["Retry-After"]) / 4)
                continue
            assert response.status_code == 200, (response.status_code, lines or response.text)
            if kind == 1:
                events, done = sse_events(lines)
                assert done and not any("error" in e for e in events), lines[-3:]
            ok += 1
            break
    return ok


def test_load_no_5xx_and_bounded_memory(server: HfServer) -> None:
    """128 concurrent clients (as in the issue) with 4 requests each, not 10: 128x10 took
    17-46 s on 2 shared cores, 128x4 keeps the concurrency, the 429s and the retries."""
    clients, per_client = 128, 4
    before = metrics(server)["process_resident_memory_bytes"]
    statuses: Counter[int] = Counter()
    rss: list[float] = []

    async def watch(stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            while not stop.is_set():
                text = (await http.get(server.url + "/metrics")).text
                rss.append(
                    float(re.findall(r"^process_resident_memory_bytes (\S+)$", text, re.M)[0])
                )
                await asyncio.sleep(0.2)

    async def run() -> list[int]:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        # idle connections expire on the client before the server's 5 s keep-alive closes
        # them, as a client should: else a request can race the server's close (ReadError)
        limits = httpx.Limits(max_connections=clients + 4, keepalive_expiry=2)
        async with httpx.AsyncClient(headers=auth(), timeout=60, limits=limits) as http:
            done = await asyncio.wait_for(
                asyncio.gather(
                    *(_load_client(http, server.url, i, per_client, statuses)
                      for i in range(clients))
                ),
                timeout=120,
            )  # fmt: skip
        stop.set()
        await watcher
        return done

    started = time.monotonic()
    done = asyncio.run(run())
    elapsed = time.monotonic() - started
    assert sum(done) == clients * per_client, (statuses, server.log())
    assert not [s for s in statuses if s >= 500], statuses
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[429] > 0, f"the queue of 16 never filled: {statuses}"  # bounded queue
    assert server.alive(), server.log()
    assert httpx.get(server.url + "/health").status_code == 200
    after = metrics(server)
    assert after["oominfer_queue_depth"] == 0 and after["oominfer_batch_size"] == 0
    assert max(rss) - before < 400 * 2**20, (before, max(rss))
    assert after["process_resident_memory_bytes"] - before < 300 * 2**20
    print(f"load: {clients}x{per_client} in {elapsed:.1f} s, {dict(statuses)}, "
          f"RSS {before / 2**20:.0f} -> max {max(rss) / 2**20:.0f} MiB")  # fmt: skip


# out of memory


def test_injected_oom_mid_batch_loses_no_request(
    server: HfServer, tiny_llama: Path, tmp_path: Path
) -> None:
    prompts = [f"Request {i}: Hello! How are you today?" for i in range(8)]
    body: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 24, "temperature": 0,
                            "ignore_eos": True}  # fmt: skip
    # the reference: the shared server (same weights, same dtype, no fault)
    expected = [
        httpx.post(server.url + "/v1/completions", headers=auth(), timeout=60,
                   json={**body, "prompt": p}).json()["choices"][0]["text"]
        for p in prompts
    ]  # fmt: skip
    args = ["--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4"]
    fault = (str(Path(__file__).with_name("oom_fault.py")), "3")  # the 3rd batched forward
    with HfServer(tiny_llama, tmp_path / "oom.log", args=args, launcher=fault) as oom:

        async def one(http: httpx.AsyncClient, prompt: str, stream: bool) -> tuple[int, str]:
            if not stream:
                r = await http.post(oom.url + "/v1/completions", json={**body, "prompt": prompt})
                assert r.status_code == 200, r.text
                choice = r.json()["choices"][0]
                assert choice["finish_reason"] == "length"
                assert r.json()["usage"]["completion_tokens"] == 24
                return r.status_code, str(choice["text"])
            payload = {**body, "prompt": prompt, "stream": True}
            async with http.stream("POST", oom.url + "/v1/completions", json=payload) as r:
                lines = [line async for line in r.aiter_lines()]
            events, done = sse_events(lines)
            assert done and not any("error" in e for e in events), lines
            return r.status_code, "".join(c["text"] for e in events for c in e["choices"])

        async def run() -> list[tuple[int, str]]:
            async with httpx.AsyncClient(timeout=60) as http:
                return await asyncio.gather(*(one(http, p, i % 2 == 1)
                                              for i, p in enumerate(prompts)))  # fmt: skip

        results = asyncio.run(run())
        assert [status for status, _ in results] == [200] * len(prompts)
        assert [text for _, text in results] == expected
        m = metrics(oom)
        assert m["oominfer_oom_recoveries_total"] == 1, oom.log()
        assert m["oominfer_oom_failures_total"] == 0
        assert "injected out-of-memory error at forward pass 3" in oom.log()
        assert oom.alive()
        # the server keeps serving batches after the recovery
        assert client(oom).completions.create(model=MODEL_NAME, prompt="hi", max_tokens=3)


def test_single_request_that_cannot_fit_fails_alone(tiny_llama: Path) -> None:
    """In-process: a fault that fails any forward over 40 positions (the long prompt's
    prefill, even alone) fails that request with 507; the short ones finish."""
    import threading

    import torch

    from oominfer.engines import transformers as hf

    config = hf.resolve_config(hf.parse_args(["--model", str(tiny_llama), "--dtype", "float32"]))
    engine = hf.ModelRunner.load(config)

    def fault(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs["input_ids"].shape[1] > 40:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    engine.model.register_forward_pre_hook(fault, with_kwargs=True)
    metric = hf.Metrics()
    scheduler = hf.Scheduler(engine, max_num_seqs=4, max_queue=16, metrics=metric)
    finished: dict[int, hf.Event] = {}
    all_done = threading.Event()

    def emitter(i: int) -> Any:
        def emit(event: hf.Event) -> None:
            if not isinstance(event, hf.TokenEvent):
                finished[i] = event
                if len(finished) == 4:
                    all_done.set()

        return emit

    prompts = [[5, 6, 7], list(range(3, 63)), [8, 9], [10, 11, 12, 13]]
    for i, prompt in enumerate(prompts):  # all queued before the worker starts: one group
        seq = hf.Seq(prompt=prompt, max_tokens=10, temperature=0, ignore_eos=True)
        seq.emit = emitter(i)
        scheduler.submit(seq)
    scheduler.start()
    try:
        assert all_done.wait(60), finished
    finally:
        scheduler.close()
    failed = finished[1]
    assert isinstance(failed, hf.ErrorEvent)
    assert failed.error.status == 507
    assert "60 prompt tokens" in failed.error.message
    for i in (0, 2, 3):
        event = finished[i]
        assert isinstance(event, hf.FinishEvent), event
        assert event.reason == "length" and event.completion_tokens == 10
    assert metric.registry.get_sample_value("oominfer_oom_failures_total") == 1
    assert (
        metric.registry.get_sample_value("oominfer_oom_recoveries_total") >= 1
    )  # 1st group of 4 was split before


def test_a_prefill_group_holds_at_most_the_planned_tokens(tiny_llama: Path) -> None:
    """In-process: four 20-token prompts queued at once, with a 64-token prefill bound
    (the plan's max_model_len, which its memory sized one forward pass for): the first group
    takes three (3 x 20 = 60), the fourth waits one iteration; all four finish. Unbounded,
    the four go in one group of 80 tokens. Prompts of unequal length are padded into one
    group only up to the padded width (its mask grows with the square of it): past it each
    is prefilled alone, while prompts of one length still share a group."""
    import threading

    import torch

    from oominfer.engines import transformers as hf

    config = hf.resolve_config(hf.parse_args(["--model", str(tiny_llama), "--dtype", "float32"]))
    engine = hf.ModelRunner.load(config)
    prefills: list[tuple[int, int]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rows, width = kwargs["input_ids"].shape
        if width > 1:
            prefills.append((rows, width))

    engine.model.register_forward_pre_hook(record, with_kwargs=True)

    def run(
        bound: int | None, lengths: tuple[int, ...] = (20,) * 4, width: int = 2048
    ) -> list[tuple[int, int]]:
        prefills.clear()
        scheduler = hf.Scheduler(engine, max_num_seqs=4, max_queue=16, metrics=hf.Metrics(),
                                 max_prefill_tokens=bound, padded_group_width=width)  # fmt: skip
        finished: list[hf.Event] = []
        all_done = threading.Event()

        def emit(event: hf.Event) -> None:
            if not isinstance(event, hf.TokenEvent):
                finished.append(event)
                if len(finished) == 4:
                    all_done.set()

        for i, length in enumerate(lengths):  # all queued before the worker starts
            prompt = list(range(3 + i, 3 + i + length))
            scheduler.submit(hf.Seq(prompt=prompt, max_tokens=4, temperature=0,
                                    ignore_eos=True, emit=emit))  # fmt: skip
        scheduler.start()
        try:
            assert all_done.wait(60), finished
        finally:
            scheduler.close()
        assert all(isinstance(e, hf.FinishEvent) and e.completion_tokens == 4 for e in finished)
        return list(prefills)

    assert run(64) == [(3, 20), (1, 20)]
    assert run(None) == [(4, 20)]
    assert run(None, (20, 19, 18, 17), width=32) == [(4, 20)]
    assert run(None, (20, 19, 18, 17), width=16) == [(1, 20), (1, 19), (1, 18), (1, 17)]
    assert run(None, (20, 20, 19, 19), width=16) == [(2, 20), (2, 19)]
    assert run(None, width=16) == [(4, 20)]  # one length: no padding, no mask


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_continuous_batching_gives_each_request_what_it_gets_alone(
    family: str, tmp_path: Path
) -> None:
    """In-process, float32, greedy: one request runs, four more join it mid-generation
    (their prefills merged into the running batch), prompts of 3-20 tokens. Each gets the
    tokens it gets when run alone, on full attention and on sliding-window caches (an
    8-token window: every layer on Mistral, every other one on Gemma-2), whose layers keep
    the window less one token: merged and trimmed to that, not to the mask's width. (Until
    2026-11-28 a sliding-window batch took no new rows: requests waited for it to drain.)"""
    import threading

    import torch
    from models import build_model

    from oominfer.engines import transformers as hf
    from oominfer.engines.transformers.kv import Batch

    window = None if family == "llama" else 8
    folder = build_model(tmp_path / family, family=family, sliding_window=window,
                         dtype="float32")  # fmt: skip
    config = hf.resolve_config(hf.parse_args(["--model", str(folder), "--dtype", "float32"]))
    engine = hf.ModelRunner.load(config)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (20, 5, 13, 3, 9)]
    steps = 48

    def alone(prompt: list[int]) -> list[int]:
        cache, mask, logits = engine.prefill([prompt])
        out = [int(logits.argmax(-1))]
        batch = Batch(cache=cache, mask=mask, last=torch.tensor(out), seqs=[])
        while len(out) < steps:
            out.append(int(engine.decode(batch).argmax(-1)))
            batch.last = torch.tensor(out[-1:])
        return out

    expected = [alone(p) for p in prompts]
    scheduler = hf.Scheduler(engine, max_num_seqs=8, max_queue=16, metrics=hf.Metrics())
    seqs = [hf.Seq(prompt=p, max_tokens=steps, temperature=0, ignore_eos=True) for p in prompts]
    first_running, joined, all_done = threading.Event(), threading.Event(), threading.Event()
    finished: list[hf.Event] = []

    def emit(event: hf.Event) -> None:
        # The worker calls this outside the scheduler's lock: holding it here, four tokens
        # into the first request, makes the others join before that one can end.
        if len(seqs[0].generated) >= 4 and not first_running.is_set():
            first_running.set()
            joined.wait(30)
        if not isinstance(event, hf.TokenEvent):
            finished.append(event)
            if len(finished) == len(seqs):
                all_done.set()

    for seq in seqs:
        seq.emit = emit
    passes = engine.forward_passes
    scheduler.submit(seqs[0])
    scheduler.start()
    try:
        assert first_running.wait(60)
        for seq in seqs[1:]:
            scheduler.submit(seq)
        joined.set()
        assert all_done.wait(120), finished
    finally:
        scheduler.close()
    assert all(isinstance(e, hf.FinishEvent) for e in finished), finished
    assert [s.generated for s in seqs] == expected
    # The four joined the first while it ran (fewer passes than two batches one after the
    # other), and the first, its prompt the longest, left before them: the batch was trimmed.
    assert engine.forward_passes - passes < 2 * steps


# shutdown


SIGTERM_STREAMS = 16


def _sigterm_mid_streams(
    model: Path, log_path: Path, *, grace_s: int, max_tokens: int
) -> tuple[list[list[dict[str, Any]]], float, str]:
    """Serve with 8 sequences per batch, open SIGTERM_STREAMS streams, SIGTERM the server once
    all are answering (8 generating, 8 queued), check that a late request gets 503, that each
    stream ends with [DONE], that the server exits 0 and leaves no process of its group.
    Return each stream's events, the seconds from the signal to the exit, and the log."""
    args = ["--dtype", "float32", "--max-model-len", str(max_tokens + 24), "--max-num-seqs", "8",
            "--grace-period", str(grace_s)]  # fmt: skip
    srv = HfServer(model, log_path, args=args).start()
    assert srv.proc is not None
    proc = srv.proc

    async def stream(http: httpx.AsyncClient, i: int, started: asyncio.Event) -> Any:
        payload = {"prompt": f"Stream {i}", "max_tokens": max_tokens, "temperature": 0,
                   "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}  # fmt: skip
        async with http.stream("POST", srv.url + "/v1/completions", json=payload) as r:
            started.set()  # queued or generating: in flight either way
            lines = [line async for line in r.aiter_lines()]
        return r.status_code, lines

    async def run() -> tuple[list[Any], float]:
        limits = httpx.Limits(max_connections=SIGTERM_STREAMS + 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            started = [asyncio.Event() for _ in range(SIGTERM_STREAMS)]
            tasks = [asyncio.create_task(stream(http, i, e)) for i, e in enumerate(started)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            os.kill(proc.pid, signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.05)
            late = await http.post(srv.url + "/v1/completions", json={"prompt": "late"})
            assert_openai_error(late, 503)
            assert late.headers["Retry-After"]
            results = await asyncio.gather(*tasks)
        await asyncio.to_thread(proc.wait, 60)
        return results, time.monotonic() - signalled

    try:
        results, seconds = asyncio.run(run())
        streams = []
        for status, lines in results:
            assert status == 200
            events, done = sse_events(lines)
            assert done, lines[-3:]
            streams.append(events)
        assert proc.returncode == 0, srv.log()
        with pytest.raises(ProcessLookupError):  # nothing of the group outlives the server
            os.killpg(proc.pid, 0)
        log = srv.log(400)
        assert "Shutting down: refusing new requests" in log
        return streams, seconds, log
    finally:
        srv.stop()


def test_sigterm_drains_streams_to_done(tiny_llama: Path, tmp_path: Path) -> None:
    """16 streams all finish after SIGTERM, within the grace period."""
    streams, _, log = _sigterm_mid_streams(tiny_llama, tmp_path / "term.log", grace_s=60,
                                           max_tokens=120)  # fmt: skip
    for events in streams:
        assert not any("error" in e for e in events), events[-2:]
        assert events[-1]["usage"]["completion_tokens"] == 120
    assert "no API key" not in log  # 127.0.0.1 without a key: no warning


def test_sigterm_short_grace_ends_each_stream_with_an_error(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """With --grace-period 1, streams that cannot finish get an error event, then [DONE]."""
    streams, seconds, log = _sigterm_mid_streams(tiny_llama, tmp_path / "grace.log", grace_s=1,
                                                 max_tokens=1000)  # fmt: skip
    for events in streams:
        error = events[-1].get("error")
        assert error and error["code"] == "service_unavailable", events[-2:]
        assert "stopped before this request finished" in error["message"]
        assert not any(c["finish_reason"] for e in events for c in e.get("choices", []))
    assert seconds < 1 + 10, seconds  # the grace period, then the abort and exit
    assert "Grace period of 1 s is over: ending" in log


# bitsandbytes


@pytest.mark.parametrize("quantization", ["int8", "bitsandbytes"])
def test_bitsandbytes_loads_generate(tiny_llama: Path, tmp_path: Path, quantization: str) -> None:
    args = ["--quantization", quantization, "--max-model-len", "128", "--max-num-seqs", "2"]
    with HfServer(tiny_llama, tmp_path / f"{quantization}.log", args=args) as srv:
        c = client(srv)
        replies = [
            c.completions.create(
                model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0,
                extra_body={"ignore_eos": True},
            )
            for p in ("Hello", "The quick brown fox")
        ]  # fmt: skip
        for reply in replies:
            assert reply.usage is not None and reply.usage.completion_tokens == 6
        chat = c.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.choices[0].message.role == "assistant"
        assert f"quantization={quantization}" in srv.log(400)
        weights = metrics(srv)["oominfer_model_weights_bytes"]
        assert 0 < weights < 1_706_624  # smaller than the float32 footprint (1.63 MiB)


TINY_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
              "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 1024,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "vocab_size": 1024, "max_position_embeddings": 512, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}  # fmt: skip
TINY_QWEN3_MOE = {**TINY_QWEN3, "model_type": "qwen3_moe",
                  "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2,
                  "intermediate_size": 512, "moe_intermediate_size": 256, "num_experts": 32,
                  "num_experts_per_tok": 2}  # fmt: skip


@pytest.mark.parametrize("quantization", ["int8", "bitsandbytes"])
@pytest.mark.parametrize("raw", [TINY_QWEN3, TINY_QWEN3_MOE], ids=["dense", "moe"])
def test_bitsandbytes_weights_match_the_estimate(
    tmp_path: Path, quantization: str, raw: dict[str, Any]
) -> None:
    """Tiny Qwen3 models loaded with the engine's own bitsandbytes settings, their footprint
    against the estimate (within 5%): transformers quantizes the ``nn.Linear`` modules only,
    so a MoE's fused 3-D experts (32 of 256 x 256 here, most of its weights) stay bf16;
    counting them quantized, as vLLM's bitsandbytes does, was 2-3x light."""
    import torch
    import transformers

    from oominfer.engines import transformers as hf
    from oominfer.engines.transformers.runner import model_kwargs
    from oominfer.hardware.hardware import Hardware
    from oominfer.memory.estimate import estimate
    from oominfer.model.config import spec_from_config
    from oominfer.rules.versions import CURRENT_VLLM
    from oominfer.settings import EngineSettings

    config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    spec = spec_from_config(raw, model_id="tiny")
    predicted = estimate(
        spec,
        hardware=Hardware.from_gpu("L4"),
        settings=EngineSettings(dtype="bfloat16", quantization=quantization, max_model_len=512),
        engine="transformers",
        version=CURRENT_VLLM,
    ).weights_bytes
    args = ["--model", str(folder), "--quantization", quantization, "--dtype", "bfloat16"]
    server = hf.resolve_config(hf.parse_args(args))

    _, kwargs = model_kwargs(server)  # the engine's own load, without a tokenizer
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if "num_experts" in raw:
        assert loaded.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    measured = loaded.get_memory_footprint()
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_padded_batches_repeat_keys_and_values_as_the_memory_model_counts(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process, on the installed transformers: prompts of unequal length are prefilled
    and decoded with an explicit boolean mask, and SDPA is handed the keys and values
    repeated to every query head (4 here, over 2 KV heads); an even batch passes no mask and
    shares the KV heads through SDPA's GQA. The memory model's prefill mask
    (PADDED_GROUP_WIDTH) and decode share (decode_step_share) rest on this: it fails when a
    transformers release takes another path."""
    import torch

    from oominfer.engines import transformers as hf
    from oominfer.engines.transformers.kv import Batch
    from oominfer.memory.transformers import decode_step_share
    from oominfer.model.load import load_spec

    config = hf.resolve_config(hf.parse_args(["--model", str(tiny_llama), "--dtype", "float32"]))
    engine = hf.ModelRunner.load(config)
    calls: list[tuple[int, Any]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
        mask = kw.get("attn_mask")
        calls.append((k.shape[1], None if mask is None else (tuple(mask.shape), mask.dtype)))
        return sdpa(q, k, v, *args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    spec = load_spec(str(tiny_llama))
    heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
    assert (heads, kv_heads) == (4, 2)

    def first_call(prompts: list[list[int]]) -> tuple[tuple[int, Any], tuple[int, Any]]:
        calls.clear()
        cache, mask, _ = engine.prefill(prompts)
        prefill = calls[0]
        calls.clear()
        last = torch.full((len(prompts),), 5, dtype=torch.long)
        engine.decode(Batch(cache=cache, mask=mask, last=last, seqs=[]))
        return prefill, calls[0]

    prefill, decode = first_call([list(range(3, 23)), list(range(3, 15))])
    assert prefill == (heads, ((2, 1, 20, 20), torch.bool))
    assert decode == (heads, ((2, 1, 1, 21), torch.bool))
    assert first_call([list(range(3, 23)), list(range(4, 24))]) == ((kv_heads, None),) * 2
    # One layer's cache repeated to every head: heads / KV heads x 1 / layers of the cache.
    share = decode_step_share(spec, 4096, padded=True)
    assert share == pytest.approx(heads / kv_heads / spec.attention_layers)
    assert decode_step_share(spec, 4096, padded=False) == pytest.approx(0.5 / spec.attention_layers)
