"""Issue 17, the planner half: what the operator names is a requirement, every GPU given is
used or named idle, marginal levers are not bought, and the no-fit text is true.

Through `oominfer fit` (click's CliRunner) where the behaviour is the user's, through the
planner where the numbers are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from checkpoints import model_folder
from click.testing import CliRunner, Result

from oominfer.base.errors import DoesNotFitError, ExitStatus, InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.model.load import load_spec
from oominfer.planning.constraints import Constraints
from oominfer.planning.layout import Layout, groups, idle_gpus, layouts
from oominfer.planning.planner import plan
from oominfer.planning.search import candidates

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"
LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"
REPO = Path(__file__).resolve().parent.parent


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main_cli(), list(args), prog_name="oominfer")


def main_cli() -> Any:
    from oominfer.cli import main

    return main


def fit_json(*args: str) -> dict[str, Any]:
    result = invoke("fit", *args, "--no-verify", "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def fit_error(*args: str) -> dict[str, Any]:
    result = invoke("fit", *args, "--no-verify", "--json")
    assert result.exit_code == ExitStatus.DOES_NOT_FIT, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- every explicit setting is a requirement ------------------------------------------


def test_max_model_len_is_met_exactly_by_turning_other_levers() -> None:
    """vLLM refuses to serve less than --max-model-len; so does the plan. On one L4 the
    bf16 weights leave too little room: an FP8 KV cache or FP8 weights make it."""
    data = fit_json(LLAMA_8B, "--gpu", "L4", "--max-model-len", "65536")
    s = data["settings"]
    assert s["max_model_len"] == 65536
    assert s["quantization"] is not None or s["kv_cache_dtype"] != "auto"
    lever = next(lv for lv in data["levers"] if lv["name"] == "max_model_len")
    assert lever["reason"] == "set by --max-model-len"


def test_vllm_token_forms_are_read_as_vllm_reads_them() -> None:
    assert (
        fit_json(LLAMA_8B, "--gpu", "H100", "--max-model-len", "32k")["settings"]["max_model_len"]
        == 32000
    )
    assert (
        fit_json(LLAMA_8B, "--gpu", "H100", "--max-model-len", "32K")["settings"]["max_model_len"]
        == 32768
    )


def test_auto_keeps_the_longest_that_fits() -> None:
    auto = fit_json(LLAMA_8B, "--gpu", "L4", "--max-model-len", "auto", "--prefer", "context")
    default = fit_json(LLAMA_8B, "--gpu", "L4", "--prefer", "context")
    assert auto["settings"]["max_model_len"] == default["settings"]["max_model_len"]


def test_estimate_auto_is_the_longest_context_that_fits() -> None:
    """``estimate --max-model-len auto`` answers with the longest context that fits: one
    block more does not fit, and the no-fit hint of the defaults names the same length."""
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "auto", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    longest = doc["settings"]["max_model_len"]
    assert 8192 < longest < 131072
    assert doc["per_gpu"]["kv_cache_tokens"] >= longest
    longer = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", str(longest + 16))
    assert longer.exit_code == ExitStatus.DOES_NOT_FIT, longer.output
    defaults = invoke("estimate", LLAMA_8B, "--gpu", "L4")
    assert f"--max-model-len {longest}" in defaults.output + defaults.stderr


def test_a_sliding_window_plan_on_transformers_counts_what_its_cache_holds() -> None:
    """Gemma-3-27B on one L4 through the transformers engine: 52 of its 62 layers keep a
    1,023-token window, so the plan's short context still holds a request of the typical
    length, and the plan says how fast it serves it (counted as if every layer grew, it
    promised 0 requests of 4,096 tokens and no speed). Its context is below the practical
    floor, and its reason says so."""
    doc = fit_json("google/gemma-3-27b-it", "--gpu", "L4", "--engine", "transformers")
    context = doc["settings"]["max_model_len"]
    assert 4096 < context < 8192
    assert doc["concurrency"]["typical_requests"] >= 1
    assert doc["performance"]["output_tokens_per_s"] > 0
    assert doc["predicted"]["kv_cache_tokens"] >= context
    (lever,) = [lv for lv in doc["levers"] if lv["name"] == "max_model_len"]
    assert "below the practical 8,192 tokens" in lever["reason"]
    assert "vLLM" not in " ".join(lv["reason"] for lv in doc["levers"])


def test_a_model_too_big_for_the_transformers_engine_is_shown_its_ways_out() -> None:
    """Qwen2.5-72B in nf4 needs 41 GiB beside its cache: no L4 holds it, and the
    transformers engine runs on one GPU. The ways out are vLLM over several L4s and a GPU
    kind that holds it, each checked by planning it."""
    err = fit_error("Qwen/Qwen2.5-72B-Instruct", "--gpu", "L4", "--engine", "transformers")
    ways = err["ways_out"]
    assert ways[0].startswith("--engine vllm --gpus 4 ")
    gpu = next(w for w in ways if w.startswith("--gpu ")).split()[1]
    assert fit_json("Qwen/Qwen2.5-72B-Instruct", "--gpu", gpu, "--engine", "transformers")
    assert fit_json("Qwen/Qwen2.5-72B-Instruct", "--gpu", "L4", "--gpus", "4")


def test_a_model_too_big_for_the_gpus_names_a_rented_kind_that_holds_it() -> None:
    """Llama-3.3-70B on one L4: beside more L4s, the way out names the smallest GPU kind the
    clouds rent on which one GPU holds it, checked by planning it there (a smaller one
    does not)."""
    from oominfer.hardware.gpu import find_gpu
    from oominfer.planning.no_fit import RENTED_GPUS

    ways = fit_error(LLAMA_70B, "--gpu", "L4")["ways_out"]
    (way,) = [w for w in ways if w.startswith("--gpu ")]
    gpu = way.split()[1]
    assert gpu in RENTED_GPUS
    assert fit_json(LLAMA_70B, "--gpu", gpu)
    smaller = [
        name
        for name in RENTED_GPUS
        if find_gpu("L4").cuda_total_bytes
        < find_gpu(name).cuda_total_bytes
        < find_gpu(gpu).cuda_total_bytes
    ]
    assert smaller
    for name in smaller:
        fit_error(LLAMA_70B, "--gpu", name)


def test_a_model_too_big_for_the_host_is_shown_the_memory_that_holds_it() -> None:
    """Llama-3.1-70B in nf4 on a CPU with 16 GiB: the way out is the host memory that
    holds it (checked by planning it there), and the message speaks of no GPU."""
    llama_70b = "meta-llama/Llama-3.1-70B-Instruct"
    cpu = ("--device", "cpu", "--engine", "transformers")
    err = fit_error(llama_70b, *cpu, "--memory", "16GiB")
    assert "GPU" not in err["message"] and "TP 1" not in err["message"]
    (way,) = [w for w in err["ways_out"] if w.startswith("--memory ")]
    memory = way.split()[1]
    assert fit_json(llama_70b, *cpu, "--memory", memory)
    smaller = f"{int(memory.removesuffix('GiB')) * 3 // 4}GiB"
    fit_error(llama_70b, *cpu, "--memory", smaller)


@pytest.mark.parametrize("command", ["fit", "estimate"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--kv-cache-dtype", "fp8"), "--kv-cache-dtype is a vLLM setting"),
        (("--enforce-eager",), "--enforce-eager is a vLLM setting"),
        (("-tp", "2", "--gpus", "2"), "--tensor-parallel-size is a vLLM setting"),
        (
            ("--max-num-batched-tokens", "4096", "--enable-prefix-caching"),
            "--max-num-batched-tokens, --enable-prefix-caching are vLLM settings",
        ),
    ],
)
def test_a_vllm_setting_on_the_transformers_engine_is_refused(
    command: str, flags: tuple[str, ...], named: str
) -> None:
    """What the operator types they mean: a setting the transformers engine does not take
    is refused, naming it, rather than planned without (an FP8 KV cache estimated at half
    the bytes the engine then holds). The share of the GPU the plan may use still counts."""
    extra = ("--no-verify",) if command == "fit" else ()
    result = invoke(command, "Qwen/Qwen3-8B", "--gpu", "L4", "--engine", "transformers",
                    *extra, *flags)  # fmt: skip
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert named in result.stderr and "--engine vllm" in result.stderr
    assert "Traceback" not in result.output
    utilization = invoke(command, "Qwen/Qwen3-8B", "--gpu", "L4", "--engine", "transformers",
                         "--max-model-len", "4096", "--gpu-memory-utilization", "0.8",
                         *extra)  # fmt: skip
    assert utilization.exit_code == 0, utilization.output


@pytest.mark.parametrize("value", ["1", "100"])
def test_a_context_too_short_to_serve_is_refused(value: str) -> None:
    result = invoke("fit", LLAMA_8B, "--gpu", "L4", "--max-model-len", value, "--no-verify")
    assert result.exit_code == ExitStatus.USAGE
    assert "too short to serve" in result.stderr
    assert "Traceback" not in result.output


def test_max_num_seqs_is_honoured() -> None:
    s = fit_json(LLAMA_8B, "--gpu", "A100-80GB", "--max-num-seqs", "64")["settings"]
    assert s["max_num_seqs"] == 64


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        (("--max-num-batched-tokens", "8k"), "max_num_batched_tokens", 8000),
        (("--enforce-eager",), "enforce_eager", True),
        (("--kv-cache-dtype", "fp8"), "kv_cache_dtype", "fp8"),
        (("-q", "fp8"), "quantization", "fp8"),
        (("--gpus", "2", "-tp", "2"), "tensor_parallel_size", 2),
    ],
)
def test_each_setting_named_is_kept(flags: tuple[str, ...], field: str, value: Any) -> None:
    data = fit_json(LLAMA_8B, "--gpu", "H100", *flags)
    assert data["settings"][field] == value
    named = next((lv for lv in data["levers"] if lv["name"] == field), None)
    assert named is None or named["reason"].startswith("set by ")


def test_a_setting_the_engine_refuses_here_is_refused_with_why() -> None:
    result = invoke("fit", LLAMA_8B, "--gpu", "V100", "--kv-cache-dtype", "fp8", "--no-verify")
    assert result.exit_code == ExitStatus.USAGE
    assert "--kv-cache-dtype fp8" in result.stderr and "compute capability" in result.stderr


def test_a_requirement_that_cannot_be_met_names_the_closest_miss_and_the_ways() -> None:
    """Full context in bf16 on one L4 with --prefer quality: the error says how far the KV
    cache falls short, that --prefer balanced releases the FP8 levers, and the longest
    context that does fit."""
    err = fit_error(LLAMA_8B, "--gpu", "L4", "--max-model-len", "131072", "--prefer", "quality")
    assert "fewer than the 131,072 of --max-model-len" in err["message"]
    ways = err["ways_out"]
    assert any(w.startswith("--prefer balanced") for w in ways)
    longest = next(w for w in ways if w.endswith("(the longest that fits)"))
    length = int(longest.split()[1])
    assert 8192 < length < 131072
    relaxed = fit_json(LLAMA_8B, "--gpu", "L4", "--max-model-len", str(length), "--prefer",
                       "quality")  # fmt: skip
    assert relaxed["settings"]["max_model_len"] == length


def test_concurrency_that_cannot_be_met_says_how_many_do_fit() -> None:
    err = fit_error(LLAMA_8B, "--gpu", "L4", "--concurrency", "200")
    assert "200 requests of 4,096 tokens do not fit at once" in err["message"]
    way = next(w for w in err["ways_out"] if w.startswith("--concurrency "))
    fitting = int(way.split()[1])
    assert 1 < fitting < 200
    assert fit_json(LLAMA_8B, "--gpu", "L4", "--concurrency", str(fitting))


# --- every GPU given is used, or named idle -------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpu", "count", "per_node"),
    [
        (LLAMA_405B, "A100-80GB", 16, 4),
        (LLAMA_70B, "L40S", 6, 4),
        (LLAMA_405B, "H100", 12, 8),
        (LLAMA_8B, "L4", 3, 8),
        (LLAMA_70B, "A100-80GB", 8, 3),
    ],
)
def test_every_gpu_is_used_or_named_idle(model: str, gpu: str, count: int, per_node: int) -> None:
    data = fit_json(model, "--gpu", gpu, "--gpus", str(count), "--gpus-per-node", str(per_node))
    s = data["settings"]
    tp, pp = s["tensor_parallel_size"], s["pipeline_parallel_size"]
    used = tp * pp * data["replicas"]
    assert used + data["idle_gpus"] == count
    assert tp <= per_node  # every TP group inside one node
    # every stage of every replica is a TP group that fits in a node of the given sizes
    assert groups(tp, count, per_node) >= pp * data["replicas"]
    assert bool(data["idle_reason"]) == (data["idle_gpus"] > 0)


def test_the_cases_the_issue_saw_idle_now_use_every_gpu() -> None:
    """405B on 16 A100s, 4 per node: PP 4 uses all 16 (PP 3 left 4 idle)."""
    data = fit_json(LLAMA_405B, "--gpu", "A100-80GB", "--gpus", "16", "--gpus-per-node", "4")
    s = data["settings"]
    assert s["tensor_parallel_size"] * s["pipeline_parallel_size"] * data["replicas"] == 16
    data = fit_json(LLAMA_8B, "--gpu", "L4", "--gpus", "3")
    assert data["idle_gpus"] == 0


def test_no_layout_puts_a_tp_group_across_nodes() -> None:
    """8 GPUs on nodes of 3, 3 and 2 hold three TP-2 groups: TP 2 x PP 4 cannot be placed."""
    spec = load_spec(LLAMA_70B)
    hardware = Hardware.from_gpu("A100-80GB", 8)
    found = layouts(spec, hardware, Constraints(gpus_per_node=3))
    assert Layout(2, 4) not in found
    assert all(groups(lay.tp, 8, 3) >= lay.pp for lay in found)


def test_idle_gpus_are_reported_with_the_gpus_that_use_them_all() -> None:
    hardware = Hardware.from_gpu("L4", 3)
    assert idle_gpus(Layout(2, 1), hardware) == 1
    r = plan(load_spec(LLAMA_8B), hardware, Constraints(requested={"tensor_parallel_size": 2}))
    assert r.idle_gpus == 1
    assert "--gpus 2" in r.idle_reason and "--gpus 4" in r.idle_reason
    text = invoke("fit", LLAMA_8B, "--gpu", "L4", "--gpus", "3", "-tp", "2", "--no-verify")
    assert "Idle: 1 GPU: " in text.stdout and "1 sits idle" in text.stdout


# --- marginal levers ------------------------------------------------------------------


def test_eager_and_few_sequences_only_for_a_quarter_more_context() -> None:
    """Llama-3.1-8B on a V100-32GB, --prefer context: a handful of sequences and eager
    mode bought only ~15% more context; the plan keeps graphs and 8 sequences."""
    spec, hardware = load_spec(LLAMA_8B), Hardware.from_gpu("V100-32GB")
    c = Constraints(prefer="context")
    r = plan(spec, hardware, c)
    s = r.settings
    assert not s.enforce_eager and (s.max_num_seqs or 8) >= 8
    longest = max(cand.context for cand in candidates(spec, hardware, c))
    assert longest > r.settings.max_model_len  # a longer one existed: it was not worth it
    assert longest < 1.25 * (r.settings.max_model_len or 0)


# --- no-fit text that is true ---------------------------------------------------------


def test_the_shortfall_is_need_minus_budget_of_the_closest_plan() -> None:
    """70B on one RTX 5090: the closest plan under vLLM quantizes to FP8 and still misses;
    the message quotes that miss, not the bf16 need."""
    with pytest.raises(DoesNotFitError) as caught:
        plan(load_spec(LLAMA_70B), Hardware.from_gpu("RTX-5090"), Constraints())
    err = caught.value
    assert "fp8" in str(err) and "closest plan" in str(err)
    assert "even with every lever turned" not in str(err)
    assert err.shortfall_bytes < 50 * 2**30  # the FP8 miss, not 132 GiB of bf16


def test_a_lever_held_back_is_named_with_the_flag_that_releases_it() -> None:
    """Mistral-Small-24B on a V100-32GB: vLLM has no 8-bit path there, the transformers
    engine's bitsandbytes int8 fits."""
    with pytest.raises(DoesNotFitError) as caught:
        plan(
            load_spec("mistralai/Mistral-Small-24B-Instruct-2501"),
            Hardware.from_gpu("V100-32GB"),
            Constraints(),
        )
    assert any(w.startswith("--engine transformers") for w in caught.value.ways_out)


def test_the_kv_layout_counts_sliding_and_global_layers_apart() -> None:
    from oominfer.planning.no_fit import _kv_layout

    gemma = load_spec("google/gemma-3-27b-it")
    text = _kv_layout(gemma)
    assert "global layers" in text and "sliding-window layers" in text
    assert _kv_layout(load_spec(LLAMA_8B)) == ""


# --- words that mislead ---------------------------------------------------------------


def test_the_report_has_no_misleading_words() -> None:
    out = invoke("fit", LLAMA_8B, "--gpu", "V100-32GB", "--prefer", "context", "--no-verify")
    assert out.exit_code == 0, out.output
    assert "inference_mode" not in out.stdout
    assert "--prefer context)" not in out.stdout  # the plan already prefers it
    assert " 1 requests" not in out.stdout and " 1 tokens" not in out.stdout
    capped = invoke("fit", LLAMA_8B, "--gpu", "L4", "--max-model-len", "65536", "--no-verify")
    assert "--prefer context)" not in capped.stdout
    fp8 = invoke("fit", LLAMA_8B, "--gpu", "L4", "--prefer", "context", "--no-verify")
    kv = next(line for line in fp8.stdout.splitlines() if "kv_cache_dtype = fp8" in line)
    assert "saves" not in kv and "tokens instead of" in kv
    # vLLM's defaults do not fit one L4 at 131,072 tokens: no bar drawn as if they did
    assert "vLLM defaults ████" not in fp8.stdout
    assert "(vLLM defaults: DOES NOT FIT" in fp8.stdout


# --- input forms ----------------------------------------------------------------------


def test_a_folder_without_weights_warns_for_an_estimate(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny")
    result = invoke("fit", str(folder), "--gpu", "L4", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "has no weights" in result.stderr
    result = invoke("estimate", str(folder), "--gpu", "L4")
    assert result.exit_code == 0, result.output
    assert "has no weights" in result.stderr


def test_a_folder_without_weights_is_refused_for_verification(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny")
    result = invoke("fit", str(folder), "--gpu", "L4", "--verify")
    assert result.exit_code == ExitStatus.MODEL_ERROR, result.output
    assert "no weights" in result.stderr and "--no-verify" in result.stderr


def test_output_to_a_closed_pipe_exits_quietly() -> None:
    """`oominfer fit ... | head -3`: the reader closing early is no failure."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "oominfer", "fit", LLAMA_8B, "--gpu", "L4", "--no-verify"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes its first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert b"Traceback" not in err and b"Error" not in err


def test_requirements_refused_by_constraints() -> None:
    with pytest.raises(InvalidSettingError, match="too short"):
        Constraints(max_model_len=16)


def test_k8s_renders_the_placement_the_plan_was_fitted_for(tmp_path: Path) -> None:
    """405B on 16 A100s of 4 per node: TP 4 x PP 4 is four pods of 4 GPUs, one stage each,
    without --gpus-per-node repeated on `oominfer k8s`."""
    plan_file = tmp_path / "plan.json"
    fitted = invoke("fit", LLAMA_405B, "--gpu", "A100-80GB", "--gpus", "16", "--gpus-per-node",
                    "4", "--no-verify", "-o", str(plan_file))  # fmt: skip
    assert fitted.exit_code == 0, fitted.output
    rendered = invoke("k8s", str(plan_file), "-o", str(tmp_path / "k8s"))
    assert rendered.exit_code == 0, rendered.output
    lws = (tmp_path / "k8s" / "leaderworkerset.yaml").read_text()
    assert "size: 4" in lws
    assert "nvidia.com/gpu: '4'" in lws and "nvidia.com/gpu: '8'" not in lws


def test_the_estimate_short_by_is_need_minus_budget() -> None:
    from oominfer.api import estimate
    from oominfer.planning.document import Prediction
    from oominfer.report.breakdown import verdict
    from oominfer.settings import EngineSettings

    b = estimate(LLAMA_70B, Hardware.from_gpu("L4"), EngineSettings())
    assert b.kv_cache_bytes <= 0
    _, line = verdict(Prediction.of(b))
    from oominfer.base.units import format_bytes

    assert f"(short by {format_bytes(b.non_kv_bytes - b.budget_bytes)}," in line


@pytest.mark.needs("vllm")  # serve checks the engine is installed first
def test_serve_refuses_a_folder_without_weights_before_launching(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny")
    result = invoke("serve", str(folder), "--device", "cpu", "--memory", "4GiB", "--no-verify")
    assert result.exit_code == ExitStatus.MODEL_ERROR, result.output
    assert "no weights" in result.stderr


def test_estimate_refuses_a_context_too_short_to_serve() -> None:
    result = invoke("estimate", LLAMA_8B, "--gpu", "L4", "--max-model-len", "1")
    assert result.exit_code == ExitStatus.USAGE
    assert "too short to serve" in result.stderr


def test_a_small_prefill_chunk_takes_max_num_seqs_down_with_it() -> None:
    """vLLM needs max_num_batched_tokens >= max_num_seqs: a chunk of 128 asked for is met by
    lowering the free lever, max_num_seqs, not refused."""
    s = fit_json(LLAMA_8B, "--gpu", "H100", "--max-num-batched-tokens", "128")["settings"]
    assert s["max_num_batched_tokens"] == 128
    assert s["max_num_seqs"] <= 128
    both = invoke("fit", LLAMA_8B, "--gpu", "H100", "--max-num-batched-tokens", "128",
                  "--max-num-seqs", "256", "--no-verify")  # fmt: skip
    assert both.exit_code == ExitStatus.USAGE  # two requirements vLLM refuses together


def test_a_release_newer_than_oominfer_knows_is_planned_by_the_newest_and_says_so() -> None:
    from oominfer.rules.versions import LATEST_VLLM

    known = ".".join(map(str, LATEST_VLLM.release))
    newer = invoke("estimate", LLAMA_8B, "--gpu", "H100", "--engine-version", "9.9")
    assert newer.exit_code == 0, newer.output
    assert f"taken as {known}'s" in newer.stderr
    same = invoke("estimate", LLAMA_8B, "--gpu", "H100", "--engine-version", known)
    assert same.exit_code == 0 and "Warning" not in same.stderr
    assert newer.stdout == same.stdout


def test_an_estimate_on_the_transformers_engine_offers_only_what_that_engine_takes() -> None:
    """Qwen3-8B in bf16 on an L4 through the transformers engine: the ways out are its own
    int8 and nf4 weights, each estimated to fit, never vLLM's FP8 or tensor parallelism
    (which that engine refuses)."""
    result = invoke("estimate", "Qwen/Qwen3-8B", "--gpu", "L4", "--engine", "transformers",
                    "--json")  # fmt: skip
    assert result.exit_code == ExitStatus.DOES_NOT_FIT, result.output
    ways = json.loads(result.stdout)["ways_out"]
    assert ways == ["-q int8", "-q bitsandbytes"]
    for way in ways:
        again = invoke("estimate", "Qwen/Qwen3-8B", "--gpu", "L4", "--engine", "transformers",
                       *way.split())  # fmt: skip
        assert again.exit_code == 0, again.output


def test_an_estimate_no_single_flag_can_fix_names_what_fit_would_do() -> None:
    """Qwen2.5-72B on one L4: no single flag makes the estimate fit, so the ways out are
    those `oominfer fit` finds, which turns several levers at once."""
    result = invoke("estimate", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "L4", "--json")
    assert result.exit_code == ExitStatus.DOES_NOT_FIT, result.output
    ways = json.loads(result.stdout)["ways_out"]
    assert ways and all(w.startswith("`oominfer fit` with ") for w in ways)
    assert "`oominfer fit` with --gpus 4" in ways
    assert fit_json("Qwen/Qwen2.5-72B-Instruct", "--gpu", "L4", "--gpus", "4")
