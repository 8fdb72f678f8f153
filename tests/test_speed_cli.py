"""The predicted speed on the command line: estimate's and fit's --json ``performance``,
the report, --prefer throughput, and the latency requirements --max-tpot/--max-ttft."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner, Result

from oominfer.cli import main
from oominfer.planning.document import plan_from_dict

KEYS = {
    "ttft_s", "tpot_s", "output_tokens_per_s", "requests_per_s", "concurrency", "input_len",
    "output_len", "bound",
}  # fmt: skip
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_estimate_json_carries_the_performance() -> None:
    lengths = ["--input-len", "1000", "--output-len", "200", "--concurrency", "32"]
    r = invoke("estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192", *lengths, "--json")
    assert r.exit_code == 0, r.output
    perf = _json(r)["performance"]
    assert set(perf) >= KEYS
    assert (perf["input_len"], perf["output_len"], perf["concurrency"]) == (1000, 200, 32)
    assert perf["bound"] in ("memory", "compute")
    # All requests together: 32 streams of one token per TPOT, less the prefill time.
    assert perf["output_tokens_per_s"] < 32 / perf["tpot_s"]
    assert perf["output_tokens_per_s"] > 0.5 * 32 / perf["tpot_s"]


def test_estimate_caps_the_concurrency_at_max_num_seqs() -> None:
    r = invoke("estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192",
               "--max-num-seqs", "4", "--concurrency", "32", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    perf = _json(r)["performance"]
    assert (perf["concurrency"], perf["limited_by"]) == (4, "max_num_seqs")


def test_estimate_says_when_the_lengths_asked_exceed_the_context() -> None:
    """vLLM refuses a request longer than max_model_len: the prediction is for the prompt
    cut to fit, and both the JSON and the report say what was asked."""
    asked = ["--input-len", "8000", "--output-len", "1000", "--max-model-len", "4096"]
    r = invoke("estimate", LLAMA, "--gpu", "H100", *asked, "--json")
    assert r.exit_code == 0, r.output
    perf = _json(r)["performance"]
    assert (perf["input_len"], perf["output_len"]) == (3096, 1000)
    assert (perf["asked_input_len"], perf["asked_output_len"]) == (8000, 1000)
    text = invoke("estimate", LLAMA, "--gpu", "H100", *asked).stdout
    assert "8,000 prompt + 1,000 output tokens asked" in text and "--max-model-len" in text
    within = _json(invoke("estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192",
                          "--input-len", "1000", "--json"))["performance"]  # fmt: skip
    assert within["asked_input_len"] is None and within["input_len"] == 1000


def test_fit_refuses_named_lengths_longer_than_the_named_context() -> None:
    """fit counts its concurrency in the typical request: one longer than --max-model-len
    could never be served, so it is a bad flag (exit 2), not a plan of cut prompts."""
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--max-model-len", "4096",
               "--input-len", "8000", "--output-len", "1000")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "9,000 tokens" in r.output and "--max-model-len 9000" in r.output
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--max-model-len", "4096",
               "--typical-length", "9000")  # fmt: skip
    assert r.exit_code == 2 and "--typical-length 9,000" in r.output, r.output
    # The default prompt is no request the user named: cut to the context, as before.
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--max-model-len", "2048",
               "--output-len", "512", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert _json(r)["performance"]["input_len"] == 1536


def test_estimate_predicts_a_benchmark_run_of_num_prompts() -> None:
    """--num-prompts: what vllm bench serve reports for that many requests at
    --max-concurrency (all at once here): the ramp and the drain make its tokens/s lower
    than the steady state's and its first tokens later, and the JSON says which it is."""
    base = [
        "estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192", "--input-len", "1000",
        "--output-len", "200", "--concurrency", "256", "--json",
    ]  # fmt: skip
    steady = _json(invoke(*base))["performance"]
    run = _json(invoke(*base, "--num-prompts", "256"))["performance"]
    assert steady["num_prompts"] is None and run["num_prompts"] == 256
    assert run["output_tokens_per_s"] < steady["output_tokens_per_s"]
    assert run["ttft_s"] > steady["ttft_s"]
    # Twenty waves of the same clients come near the steady state (requests of one length
    # sent together stay in step: each wave's prompts are computed before its decodes).
    long = _json(invoke(*base, "--num-prompts", "5000"))["performance"]
    assert run["output_tokens_per_s"] < long["output_tokens_per_s"]
    assert long["output_tokens_per_s"] == pytest.approx(steady["output_tokens_per_s"], rel=0.15)
    text = invoke(*base[:-1], "--num-prompts", "256").stdout
    assert "over a run of 256 requests" in text


def test_estimate_report_shows_the_speed() -> None:
    r = invoke("estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192")
    assert r.exit_code == 0, r.output
    assert "output tok/s" in r.stdout and "TPOT" in r.stdout and "TTFT" in r.stdout


def test_fit_json_has_performance_for_the_plan_and_each_alternative() -> None:
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--json")
    assert r.exit_code == 0, r.output
    doc = _json(r)
    assert set(doc["performance"]) >= KEYS
    assert doc["alternatives"]
    for alt in doc["alternatives"]:
        assert set(alt["performance"]) >= KEYS, alt["name"]
    # --typical-length is --input-len + --output-len (defaults 3,072 + 1,024).
    assert doc["constraints"]["typical_length"] == 4096
    assert (doc["performance"]["input_len"], doc["performance"]["output_len"]) == (3072, 1024)
    assert plan_from_dict(doc).performance is not None


def test_a_plan_without_performance_still_loads() -> None:
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--json")
    doc = _json(r)
    del doc["performance"]
    for alt in doc["alternatives"]:
        del alt["performance"]
    assert plan_from_dict(doc).performance is None


def test_typical_length_and_input_output_lengths_must_agree() -> None:
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--typical-length", "2048",
               "--input-len", "1000", "--output-len", "500")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "--typical-length 2048" in r.stderr
    ok = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--json", "--typical-length", "2048")
    perf = _json(ok)["performance"]
    assert perf["input_len"] + perf["output_len"] == 2048


def test_prefer_throughput_picks_the_most_predicted_tokens_per_second() -> None:
    """Within 10% of the most: closer predictions tie (planning/costs.py throughput_steps)."""
    r = invoke("fit", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100", "--gpus", "4",
               "--no-verify", "--prefer", "throughput", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = _json(r)
    mine = doc["performance"]["output_tokens_per_s"]
    assert all(mine * 1.1 >= a["performance"]["output_tokens_per_s"] for a in doc["alternatives"])


def test_max_tpot_picks_the_fastest_plan_that_meets_it() -> None:
    args = ["fit", LLAMA, "--gpu", "H100", "--gpus", "2", "--no-verify", "--json"]
    free = _json(invoke(*args))["performance"]
    # A TPOT requirement between the single-GPU plan's and the least a plan reaches.
    r = invoke(*args, "--max-tpot", f"{free['tpot_s'] * 0.9:.4f}", "--concurrency", "8")
    assert r.exit_code == 0, r.output
    perf = _json(r)["performance"]
    assert perf["tpot_s"] <= free["tpot_s"] * 0.9


def test_a_tpot_bound_caps_the_requests_a_replica_takes() -> None:
    """Qwen3-8B on four L4s, --max-tpot 0.03: at the load each layout runs at once none
    meets it (a GPU each: 76 ms at one request), but four GPUs at TP 4 with fewer requests
    at once do. The plan lowers max_num_seqs to the most that meet it, says why, and is the
    fastest such plan; with --concurrency the load is the user's and is not lowered."""
    args = ["fit", "Qwen/Qwen3-8B", "--gpu", "L4", "--gpus", "4", "--no-verify", "--json"]
    r = invoke(*args, "--max-tpot", "0.03")
    assert r.exit_code == 0, r.output
    doc = _json(r)
    perf, settings = doc["performance"], doc["settings"]
    assert perf["tpot_s"] <= 0.03
    seqs = settings["max_num_seqs"]
    assert seqs < 256 and perf["concurrency"] == seqs
    (lever,) = [lv for lv in doc["levers"] if lv["name"] == "max_num_seqs"]
    assert "--max-tpot 0.03" in lever["reason"]
    # Twice the requests at once on the same plan miss it: the cap is the most that meet it.
    same = ["--tensor-parallel-size", str(settings["tensor_parallel_size"]),
            "--kv-cache-dtype", settings["kv_cache_dtype"]]  # fmt: skip
    if settings["quantization"]:
        same += ["-q", settings["quantization"]]
    more = invoke(*args, "--max-tpot", "1", "--max-num-seqs", str(2 * seqs), *same)
    assert more.exit_code == 0, more.output
    assert _json(more)["performance"]["tpot_s"] > 0.03
    asked = invoke(*args, "--max-tpot", "0.03", "--concurrency", "64")
    assert asked.exit_code == 3, asked.output
    assert "64 requests" in _json(asked)["message"]


def test_an_impossible_latency_exits_3_naming_the_closest() -> None:
    r = invoke("fit", LLAMA, "--gpu", "L4", "--no-verify", "--max-tpot", "0.0005")
    assert r.exit_code == 3, r.output
    assert "--max-tpot 0.0005" in r.stderr and "closest" in r.stderr and "TPOT" in r.stderr


def test_an_estimate_without_a_prediction_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The human report names the reason: the CPU backend, or a GPU given only by its
    memory (no bandwidth or FLOPs to put in the roofline). A cache of its own: what other
    tests' engines measured on this machine must not move the estimate."""
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "cache"))
    cpu = invoke("estimate", "Qwen/Qwen2.5-0.5B-Instruct", "--device", "cpu", "--memory", "8GiB")
    assert cpu.exit_code == 0, cpu.output
    assert "not predicted (the speed model is a GPU roofline; vLLM's CPU backend" in cpu.stdout
    bare = invoke("estimate", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu-memory", "24GiB")
    assert bare.exit_code == 0, bare.output
    assert "has no bandwidth or FLOPs figures in the catalog; pass --gpu by name" in bare.stdout


@pytest.mark.parametrize(
    ("ttft_s", "shown"),
    [
        (0.0072, "7.2 ms"),
        (0.841, "841 ms"),
        (9.4, "9,400 ms"),
        (12.44, "12.4 s"),
        (1687.6, "28 min"),
        (532_380.0, "148 h"),
    ],
)
def test_latencies_read_in_their_unit(ttft_s: float, shown: str) -> None:
    """A queued run's TTFT of half an hour reads "28 min", not "1,687,649 ms"; one request
    at a time is "1 request"."""
    from oominfer.report.speed import speed_lines, speed_phrase
    from oominfer.speed import Performance

    perf = Performance(
        ttft_s=ttft_s, tpot_s=0.1, output_tokens_per_s=9.0, requests_per_s=0.01,
        concurrency=1, input_len=3072, output_len=1024, bound="memory",
        requested_concurrency=1,
    )  # fmt: skip
    assert speed_phrase(perf).endswith(f"TTFT {shown}")
    assert "for 1 request at once" in speed_lines(perf)[0]
