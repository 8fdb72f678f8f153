"""Fixtures shared by the pure-core and `oominfer estimate` tests.

Imported by name from the test modules (``from _pure_fixtures import offline_hub``), so
that they work whether or not tests/conftest.py defines its own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No test reaches the network or the user's Hugging Face cache and token.

    huggingface_hub reads its environment once, at import, so when it is already imported
    its module constants are patched too.
    """
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OOMINFER_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HOME", str(home))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    yield home
