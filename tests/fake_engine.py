"""A fake engine at the process level: what the probe and serve see of vLLM, in milliseconds.

Run it as an engine's Python (``fake_python(folder)`` writes a ``python`` that runs this file;
``-m MODULE`` is skipped), so the product's own argv, environment builder, lifeline, watcher,
load test, proxy and clean-up all run on it. It prints real vLLM log lines
(tests/data/vllm_logs/), listens on ``--port`` with ``/health``, ``/v1/models``,
``/v1/completions`` and ``/v1/chat/completions`` (streaming as chunked server-sent events, as
vLLM does), and misbehaves on cue. ``FAKE_ENGINE`` holds comma-separated cues:

- ``ready`` (the default): start and serve;
- ``hang``: print the first lines, then never listen;
- ``crash``: print a traceback and exit 1;
- ``kv_too_small``: print vLLM's real KV-cache error and exit 1;
- ``sigill``: die with SIGILL during start-up; ``sigill_on_request``: on the first request;
- ``ignore_term``: ignore SIGTERM (the engine and its children);
- ``children``: start a child that starts a grandchild, as vLLM's EngineCore and Worker;
- ``slow_start``: take ``FAKE_START_S`` seconds (default 2) before listening;
- ``split_events``: send each streamed event in two chunks.

``/metrics`` answers one vLLM gauge (``vllm:num_requests_waiting``).

``FAKE_TOKEN_S`` is the seconds between streamed tokens (default 0). The API key is read from
VLLM_API_KEY or OOMINFER_API_KEY, as the real engines read it. Tests find what is left of it by
the mark in its environment (``engine_util.leftovers``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LOGS = Path(__file__).resolve().parent / "data" / "vllm_logs"
CUES = set(filter(None, os.environ.get("FAKE_ENGINE", "ready").split(",")))
TOKEN_S = float(os.environ.get("FAKE_TOKEN_S", "0"))
API_KEY = os.environ.get("VLLM_API_KEY") or os.environ.get("OOMINFER_API_KEY")


def fake_python(folder: Path) -> Path:
    """An executable ``python`` in ``folder`` that runs this fake with the arguments it gets."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    path.chmod(0o755)
    return path


def trap() -> None:
    """Die of SIGILL here and now, as a trapped instruction does: the signal goes to this
    thread (a signal to the process would let this thread write its reply first)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGILL)


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def log_lines(name: str) -> list[str]:
    """A recorded vLLM log, without its ``# source:`` line."""
    return (LOGS / name).read_text().splitlines()[1:]


def arguments(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs, with ``-m MODULE`` skipped."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            i += 2
            continue
        if token.startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            out[token[2:]] = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
            continue
        i += 1
    return out


def child(depth: int) -> None:
    """EngineCore (depth 1) starts Worker (depth 2); both wait to be killed."""
    if "ignore_term" in CUES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if depth < 2:
        spawn_child(depth + 1)
    while True:
        time.sleep(60)


def spawn_child(depth: int) -> None:
    subprocess.Popen([sys.executable, __file__, "--child", str(depth)])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn: no 40 ms delayed-ACK stalls between writes
    model = "fake"
    max_model_len = 2048
    requests = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/metrics":  # as vLLM's: the gauge autoscalers read
            text = (
                "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0.0\n'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        elif self.path == "/v1/models":
            card = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
            self.reply(200, {"object": "list", "data": [card]})
        else:
            self.reply(404, {"error": {"message": "Not Found", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if API_KEY and self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self.reply(401, {"error": {"message": "Unauthorized", "type": "invalid_api_key"}})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.reply(404, {"error": {"message": "Not Found", "type": "not_found"}})
            return
        Handler.requests += 1
        if "sigill_on_request" in CUES:
            trap()
        body = json.loads(raw or b"{}")
        tokens = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt", "")
        prompt_len = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        if prompt_len + tokens > self.max_model_len:
            message = (f"This model's maximum context length is {self.max_model_len} tokens. "
                       f"However, you requested {prompt_len + tokens} tokens.")  # fmt: skip
            self.reply(400, {"error": {"message": message, "type": "BadRequestError"}})
            return
        chat = self.path.endswith("chat/completions")
        if body.get("stream"):
            self.stream(tokens, chat)
            return
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": " tok" * tokens}
        else:
            choice["text"] = " tok" * tokens
        usage = {"prompt_tokens": prompt_len, "completion_tokens": tokens,
                 "total_tokens": prompt_len + tokens}  # fmt: skip
        self.reply(200, {"id": "cmpl-fake", "object": "text_completion", "model": self.model,
                         "choices": [choice], "usage": usage})  # fmt: skip

    def stream(self, tokens: int, chat: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(data: str) -> None:
            payload = f"data: {data}\n\n".encode()
            # ``split_events``: each event in two chunks, the token's time apart (the network
            # may split them anywhere); the proxy must still forward whole events.
            parts = [payload[:7], payload[7:]] if "split_events" in CUES else [payload]
            for i, part in enumerate(parts):
                if i:
                    time.sleep(TOKEN_S)
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.flush()

        try:
            for i in range(tokens):
                last = i == tokens - 1
                piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
                choice = {"index": 0, "finish_reason": "length" if last else None, **piece}
                event(json.dumps({"id": "cmpl-fake", "model": self.model, "choices": [choice]}))
                if TOKEN_S and not last and "split_events" not in CUES:
                    time.sleep(TOKEN_S)
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            say(f"fake engine: the stream was closed after {i} of {tokens} tokens")


def main(argv: list[str]) -> None:
    args = arguments(argv)
    if "child" in args:
        child(int(args["child"]))
        return
    if "ignore_term" in CUES:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    startup = log_lines("startup_complete_vllm_cpu.txt")
    loading = next(i for i, line in enumerate(startup) if "Starting to load model" in line) + 1
    say(*startup[:loading])  # the log's phase: "loading weights"
    if "children" in CUES:
        spawn_child(1)
    if "sigill" in CUES:
        trap()
    if "crash" in CUES:
        say("Traceback (most recent call last):", "RuntimeError: the fake engine crashed on cue")
        sys.exit(1)
    if "kv_too_small" in CUES:
        say(*log_lines("kv_too_small_v1_cpu_65409.txt"))
        sys.exit(1)
    if "hang" in CUES:
        while True:
            time.sleep(60)
    if "slow_start" in CUES:
        time.sleep(float(os.environ.get("FAKE_START_S", "2")))
    Handler.model = args.get("served-model-name") or args.get("model", "fake")
    Handler.max_model_len = int(args.get("max-model-len") or 2048)
    server = _Server((args.get("host", "127.0.0.1"), int(args["port"])), Handler)
    server.daemon_threads = True
    say(*startup[loading:])  # ends with "Application startup complete."
    server.serve_forever()


class _Server(ThreadingHTTPServer):
    request_queue_size = 2048
    """uvicorn's backlog, as vLLM's server has: a load test of 128 concurrent requests must not
    be reset by the socket's default backlog of 5."""


if __name__ == "__main__":
    main(sys.argv[1:])
