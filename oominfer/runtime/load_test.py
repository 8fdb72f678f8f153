"""Loading a ready engine at the plan's limits with real requests over HTTP."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from oominfer.settings import EngineSettings

OUTPUT_TOKENS = 8
"""Tokens each load-test request generates."""
CONCURRENT_PROMPT_TOKENS = 16
"""Prompt tokens of each of the max_num_seqs concurrent requests."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadResult:
    """How the load test went, and the speed the concurrent requests were served at."""

    requests_ok: int
    error: str = ""
    concurrency: int = 0
    """Requests sent at once in the timed part."""
    output_tokens: int = 0
    """Output tokens those requests generated (the engine's usage counts)."""
    seconds: float = 0.0
    """Wall time from sending them to the last answer."""

    @property
    def output_tokens_per_s(self) -> float | None:
        """Output tokens/s of the concurrent requests together (None when none ran)."""
        return (
            self.output_tokens / self.seconds if self.seconds > 0 and self.output_tokens else None
        )


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
) -> LoadResult:
    """Real requests at the plan's limits: one whose prompt plus output reach max_model_len,
    then max_num_seqs at once (with the engine's ``api_key``, if it requires one; timed: the
    engine's output tokens/s)."""
    try:
        model = _model_name(port, api_key)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
        return LoadResult(requests_ok=0, error=f"/v1/models failed: {err}")
    length = settings.max_model_len or 2048
    out = min(OUTPUT_TOKENS, max(1, length // 2))

    def complete(prompt_tokens: int) -> tuple[str, int]:
        body = {"model": model, "prompt": [11] * prompt_tokens, "max_tokens": out,
                "temperature": 0, "ignore_eos": True, "min_tokens": out}  # fmt: skip
        try:
            reply = _post(port, "/v1/completions", body, timeout, api_key)
        except urllib.error.HTTPError as err:
            return f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}", 0
        except (urllib.error.URLError, OSError) as err:
            return f"request failed: {err}", 0
        usage = reply.get("usage") or {}
        tokens = int(usage.get("completion_tokens", out))
        if tokens < 1:
            return "no tokens generated", 0
        return "", tokens

    error, _ = complete(length - out)
    if error:
        return LoadResult(requests_ok=0, error=f"the request of {length:,} tokens failed: {error}")
    seqs = settings.max_num_seqs or 1
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(seqs, 64)) as pool:
        replies = list(pool.map(lambda _: complete(CONCURRENT_PROMPT_TOKENS), range(seqs)))
    seconds = time.monotonic() - start
    errors = [e for e, _ in replies if e]
    if errors:
        return LoadResult(
            requests_ok=1 + seqs - len(errors),
            error=f"{len(errors)} of {seqs} concurrent requests failed: {errors[0]}",
        )
    return LoadResult(
        requests_ok=1 + seqs,
        concurrency=min(seqs, 64),
        output_tokens=sum(n for _, n in replies),
        seconds=seconds,
    )
