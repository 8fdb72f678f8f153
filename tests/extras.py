"""The test suite in a base install: which tests need an extra, and skipping them with why.

A base install (``pip install -e . pytest``) has click, huggingface_hub, PyYAML, rich and
nvidia-ml-py; the tests that need more (torch, vLLM, an HTTP client, the Kubernetes schemas)
say so, with ``@pytest.mark.needs("torch")`` on a test or ``needs("httpx")`` at the top of a
module whose imports need it, and skip with the reason and the extra that brings it.
"""

from __future__ import annotations

import importlib.util

import pytest

EXTRAS: dict[str, str] = {
    "torch": "hf",
    "transformers": "hf",
    "bitsandbytes": "hf",
    "uvicorn": "hf",
    "fastapi": "hf",
    "starlette": "hf",
    "httpx": "dev",
    "openai": "dev",
    "schemathesis": "dev",
    "kubernetes_validate": "dev",
    "tokenizers": "dev",
    "vllm": "cpu",
}
"""The modules beyond the base install (click, huggingface_hub, PyYAML, rich, nvidia-ml-py)
that tests use, each with the extra of pyproject.toml that brings it."""


TRANSFORMERS_SERVER = ("torch", "transformers", "starlette", "uvicorn")
"""What importing ``oominfer.engines.transformers`` (oominfer's own server) loads."""


def missing_extras(modules: tuple[str, ...]) -> str | None:
    """Why a test that imports ``modules`` cannot run in this Python, or None when it can.

    Found without importing them: torch or vLLM would slow the test process and change its
    state, and a module that is present but broken should fail its test, not skip it."""
    missing = [m for m in dict.fromkeys(modules) if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    extras = sorted({EXTRAS.get(m, "dev") for m in missing})
    return (
        f"needs {', '.join(missing)}, not installed in this Python "
        f"(pip install -e '.[{','.join(extras)}]')"
    )


def needs(*modules: str) -> None:
    """Skip the whole test module, with the reason, unless ``modules`` are installed: call it
    before the module's imports of them (``pytestmark`` comes too late for those)."""
    __tracebackhide__ = True  # the skip is reported at the test module's line, not here
    reason = missing_extras(modules)
    if reason:
        pytest.skip(reason, allow_module_level=True)
