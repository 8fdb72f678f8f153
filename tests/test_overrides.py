"""``--hf-overrides``: the context a model's config.json overrides give, as each vLLM release
derives it, through the library, the CLI, the plan, the engine's command line and the
manifests (the real engine loading one: tests/test_fit_e2e.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from oominfer.base.errors import InvalidSettingError
from oominfer.cli import main
from oominfer.model.load import load_spec
from oominfer.planning.document import plan_from_json
from oominfer.rules.overrides import with_overrides
from oominfer.rules.versions import EngineVersion
from oominfer.serving.run import server_argv

QWEN3 = "Qwen/Qwen3-32B"  # 40,960 positions in its config.json, no RoPE scaling
ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
YARN_OLD = json.dumps({"rope_scaling": ROPE})
YARN = json.dumps({"rope_parameters": ROPE, "max_position_embeddings": 131072})
V31, V33 = EngineVersion.parse("0.31"), EngineVersion.parse("0.33")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="oominfer")


def test_releases_before_0_32_scale_the_original_length_by_the_yarn_factor() -> None:
    spec = load_spec(QWEN3)
    extended = with_overrides(spec, YARN_OLD, V31, max_model_len=131072)
    assert spec.max_position_embeddings == 40960
    assert extended.max_position_embeddings == 32768 * 4
    assert extended.config_overrides == json.dumps({"rope_scaling": ROPE}, separators=(", ", ": "))


def test_from_0_32_yarn_keeps_max_position_embeddings_and_the_error_names_the_key() -> None:
    spec = load_spec(QWEN3)
    assert with_overrides(spec, YARN_OLD, V33).max_position_embeddings == 40960
    with pytest.raises(InvalidSettingError) as err:
        with_overrides(spec, YARN_OLD, V33, max_model_len=131072)
    assert "40,960 tokens vLLM 0.33 derives" in err.value.message
    assert '"max_position_embeddings": 131072' in (err.value.hint or "")
    assert with_overrides(spec, YARN, V33, max_model_len=131072).max_position_embeddings == 131072


def test_applying_the_same_overrides_again_changes_nothing() -> None:
    once = with_overrides(load_spec(QWEN3), YARN_OLD, V31)
    assert with_overrides(once, YARN_OLD, V31) is once
    assert with_overrides(once, YARN_OLD, V31).max_position_embeddings == 131072


@pytest.mark.parametrize("version", [V31, V33])
def test_a_linear_factor_stretches_the_context_in_every_release(version: EngineVersion) -> None:
    linear = json.dumps({"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert with_overrides(load_spec(QWEN3), linear, version).max_position_embeddings == 81920


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ('{"num_hidden_layers": 2}', "sets num_hidden_layers"),
        ('{"rope_parameters": 4}', "must be an object with a rope_type"),
        ('{"rope_scaling": {"factor": 4.0}}', "must be an object with a rope_type"),
        ('{"max_position_embeddings": -1}', "must be a positive number"),
        ('{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}', "lacks one"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_overrides_are_refused_saying_why(overrides: str, says: str) -> None:
    with pytest.raises(InvalidSettingError) as err:
        with_overrides(load_spec(QWEN3), overrides, V31)
    assert says in err.value.message


def test_estimate_serves_the_extended_context_and_says_so_in_its_json() -> None:
    args = ["estimate", QWEN3, "--gpu", "H100", "--gpus", "4", "-tp", "4"]
    result = invoke(*args, "--max-model-len", "131072", "--hf-overrides", YARN, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["per_gpu"]["max_model_len"] == 131072
    assert json.loads(doc["settings"]["hf_overrides"]) == json.loads(YARN)
    refused = invoke(*args, "--max-model-len", "131072")
    assert refused.exit_code == 2
    assert "--hf-overrides" in refused.output and "40960 or less" in refused.output


def test_the_transformers_engine_takes_them_too() -> None:
    result = invoke("estimate", "Qwen/Qwen3-8B", "--gpu", "H100", "--engine", "transformers",
                    "--max-model-len", "131072", "--hf-overrides", YARN, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["per_gpu"]["max_model_len"] == 131072


def test_the_plan_passes_them_to_the_engine_and_the_manifests(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    result = invoke("fit", QWEN3, "--gpu", "H100", "--gpus", "4", "--max-model-len", "131072",
                    "--hf-overrides", YARN, "--no-verify", "-o", str(plan_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = plan_from_json(plan_path.read_text(), source=str(plan_path))
    assert plan.settings.max_model_len == 131072
    argv = server_argv(plan, host="127.0.0.1", port=8000)
    at = argv.index("--hf-overrides")
    assert json.loads(argv[at + 1]) == json.loads(YARN)  # one token, as vLLM parses it
    out = tmp_path / "k8s"
    assert invoke("k8s", str(plan_path), "-o", str(out)).exit_code == 0
    docs = list(yaml.safe_load_all((out / "deployment.yaml").read_text()))
    pod = next(d for d in docs if d and d.get("kind") == "Deployment")["spec"]["template"]
    shown = shlex.split(pod["metadata"]["annotations"]["oominfer.dev/engine-args"])
    at = shown.index("--hf-overrides")
    assert json.loads(shown[at + 1]) == json.loads(YARN)  # the JSON survives YAML and the shell


def test_serve_refuses_other_overrides_after_the_plan(tmp_path: Path) -> None:
    """What the plan was verified with is what serves: --hf-overrides after ``--`` at another
    value than the plan's is refused, at the plan's value it is kept once."""
    from oominfer.serving.extra import merge_extra

    plan_path = tmp_path / "plan.json"
    result = invoke("fit", QWEN3, "--gpu", "H100", "--gpus", "4", "--max-model-len", "131072",
                    "--hf-overrides", YARN, "--no-verify", "-o", str(plan_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = plan_from_json(plan_path.read_text(), source=str(plan_path))
    with pytest.raises(InvalidSettingError) as err:
        merge_extra(plan, ["--hf-overrides", YARN_OLD])
    assert "contradicts the plan's --hf-overrides" in err.value.message
    merge_extra(plan, ["--hf-overrides", YARN])  # the plan's own: no contradiction
