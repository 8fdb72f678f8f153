"""Loading a ready engine at the plan's limits with real requests over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from oominfer.settings import EngineSettings

OUTPUT_TOKENS = 8
"""Tokens each load-test request generates."""


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _post(
    port: int, path: str, body: dict[str, Any], timeout: float, api_key: str | None
) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **_headers(api_key)},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def _model_name(port: int, api_key: str | None) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=_headers(api_key))
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def load_test(
    port: int, settings: EngineSettings, *, timeout: float = 600.0, api_key: str | None = None
) -> tuple[int, str]:
    """Real requests at the plan's limits: one whose prompt plus output reach max_model_len,
    then max_num_seqs at once (with the engine's ``api_key``, if it requires one). Returns
    (requests that completed, error or "")."""
    try:
        model = _model_name(port, api_key)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
        return 0, f"/v1/models failed: {err}"
    length = settings.max_model_len or 2048
    out = min(OUTPUT_TOKENS, max(1, length // 2))

    def complete(prompt_tokens: int) -> str:
        body = {"model": model, "prompt": [11] * prompt_tokens, "max_tokens": out,
                "temperature": 0, "ignore_eos": True, "min_tokens": out}  # fmt: skip
        try:
            reply = _post(port, "/v1/completions", body, timeout, api_key)
        except urllib.error.HTTPError as err:
            return f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as err:
            return f"request failed: {err}"
        usage = reply.get("usage") or {}
        if usage.get("completion_tokens", out) < 1:
            return "no tokens generated"
        return ""

    error = complete(length - out)
    if error:
        return 0, f"the request of {length:,} tokens failed: {error}"
    seqs = settings.max_num_seqs or 1
    with ThreadPoolExecutor(max_workers=min(seqs, 64)) as pool:
        errors = [e for e in pool.map(lambda _: complete(16), range(seqs)) if e]
    if errors:
        return 1 + seqs - len(errors), f"{len(errors)} of {seqs} concurrent requests failed: " + (
            errors[0]
        )
    return 1 + seqs, ""
