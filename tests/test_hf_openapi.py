"""Fuzz the transformers server from its own /openapi.json with schemathesis: no 5xx.

A bounded run (50 cases per operation and schemathesis's coverage phase, a fixed seed, about
600 cases in 25 s on 2 cores) against a server with max_model_len 64, so that the requests
that do generate stay short. Valid and invalid bodies alike must never get a server error.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from extras import TRANSFORMERS_SERVER, needs

# Where these are not installed (a base install), the module skips, saying why.
needs("httpx", "openai", *TRANSFORMERS_SERVER, "tokenizers", "schemathesis")
from test_hf_server import API_KEY, HfServer  # noqa: E402

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 50
MIN_CASES = 300
SEED = 1


def test_schemathesis_finds_no_server_error(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["--dtype", "float32", "--max-model-len", "64", "--max-num-seqs", "4"]
    env = {"OOMINFER_API_KEY": API_KEY}
    with HfServer(tiny_llama, tmp_path / "server.log", args=args, env=env) as srv:
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", srv.url + "/openapi.json",
             "--header", f"Authorization: Bearer {API_KEY}", "--checks", "not_a_server_error",
             "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--no-color",
             "--generation-database", "none", "--request-timeout", "30",
             "--report-dir", str(tmp_path / "report")],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-6000:]
        cases = re.search(r"(\d+) generated, (\d+) passed", output)
        assert cases, output[-3000:]
        generated, passed = int(cases[1]), int(cases[2])
        assert generated == passed >= MIN_CASES, output[-3000:]
        assert srv.alive(), srv.log()
        assert "Traceback" not in srv.log(10_000), srv.log()
