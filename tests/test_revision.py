"""--revision reaches the plan, the engine's command line and the cache of verified plans."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from checkpoints import TINY_CONFIG, llama_tensors, model_folder, write_safetensors
from click.testing import CliRunner
from extras import TRANSFORMERS_SERVER
from test_api import _ReadyProber

import oominfer
from oominfer.cli import main
from oominfer.engines.command import engine_argv
from oominfer.hardware.hardware import Hardware
from oominfer.planning.constraints import Constraints
from oominfer.rules import installed
from oominfer.serving.run import server_argv
from oominfer.settings import EngineSettings
from oominfer.verify import prober as prober_module
from oominfer.verify.cache import cache_key

OLD, NEW = "1" * 40, "2" * 40


@pytest.fixture
def cached_repo(offline_hub: Path) -> str:  # noqa: F811
    """acme/tiny in the Hugging Face cache: main, and the tag v1 at an older commit."""
    repo = offline_hub / "hub" / "models--acme--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(NEW)
    (repo / "refs" / "v1").write_text(OLD)
    for commit in (OLD, NEW):
        folder = model_folder(repo / "snapshots" / commit)
        write_safetensors(folder / "model.safetensors", llama_tensors(TINY_CONFIG))
    return "acme/tiny"


@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_the_engine_is_told_the_revision(engine: Any) -> None:
    argv = engine_argv(
        "acme/tiny", EngineSettings(), engine=engine, port=8000, python="py", revision="v1"
    )
    assert argv[argv.index("--revision") + 1] == "v1"
    assert argv[argv.index("--model") + 1] == "acme/tiny"
    plain = engine_argv("acme/tiny", EngineSettings(), engine=engine, port=8000, python="py")
    assert "--revision" not in plain


@pytest.mark.needs(*TRANSFORMERS_SERVER)
def test_the_transformers_server_reads_the_revision(tmp_path: Path) -> None:
    # Importing the server's package loads torch and its HTTP stack.
    from oominfer.engines.transformers.config import parse_args, resolve_config

    config = resolve_config(parse_args(["--model", "acme/tiny", "--revision", "v1"]))
    assert config.revision == "v1"
    plan = oominfer.Plan(model_id="acme/tiny", revision="v2", engine="transformers")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert resolve_config(parse_args(["--plan", str(path)])).revision == "v2"


def test_the_plan_records_the_revision_and_serve_passes_it(cached_repo: str) -> None:
    cpu = Hardware.cpu(4 * 1024**3)
    plan = oominfer.plan(oominfer.load_model(cached_repo, revision="v1"), cpu)
    assert plan.revision == "v1"
    argv = server_argv(plan, host="127.0.0.1", port=8000, python=sys.executable)
    assert argv[argv.index("--model") + 1 : argv.index("--model") + 4] == [
        cached_repo, "--revision", "v1"
    ]  # fmt: skip


def test_fit_revision_reaches_the_plan_file(cached_repo: str) -> None:
    args = ["fit", cached_repo, "--revision", "v1", "--device", "cpu", "--memory", "4GiB",
            "--no-verify", "--json"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["revision"] == "v1"


def test_verified_plans_are_cached_per_revision(cached_repo: str) -> None:
    cpu, c = Hardware.cpu(4 * 1024**3), Constraints()
    main_spec = oominfer.load_model(cached_repo)
    v1 = oominfer.load_model(cached_repo, revision="v1")
    by_commit = oominfer.load_model(cached_repo, revision=NEW)
    keys = {cache_key(s, cpu, c, version="x") for s in (main_spec, v1, by_commit)}
    assert len(keys) == 3


class _Prober(_ReadyProber):
    """test_api's prober (every launch READY at once) that keeps what it was made with."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _Prober.made.append(kwargs)


def test_fit_launches_the_engine_at_the_revision(
    cached_repo: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(installed, "engine_installed", lambda engine: True)
    monkeypatch.setattr(prober_module, "EngineProber", _Prober)
    _Prober.made = []
    spec = oominfer.load_model(cached_repo, revision="v1")
    plan = oominfer.fit(spec, Hardware.cpu(4 * 1024**3))
    assert plan.verified and plan.revision == "v1"
    assert [made["revision"] for made in _Prober.made] == ["v1"]
