"""The speed model: its roofline pieces, the concurrency vLLM's scheduler allows, and the
published serving measurements of throughput_points.jsonl (copied into
tests/data/calibration/ from ../shared/calibration/).

Each published point is pinned to today's predicted/measured ratio with a stated drift
tolerance: a change to the speed model that moves a point more than DRIFT away from where it
stands fails that point's test, and the medians may not get worse than the target.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script

from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.load import load_spec
from oominfer.rules.versions import CURRENT_VLLM
from oominfer.settings import EngineSettings
from oominfer.speed import Performance, Workload, predict
from oominfer.speed.roofline import (
    BANDWIDTH_EFFICIENCY,
    GDDR_BANDWIDTH_EFFICIENCY,
    bandwidth_efficiency,
    touched_expert_share,
)

REPO = Path(__file__).resolve().parents[1]
POINTS = REPO / "tests" / "data" / "calibration" / "throughput_points.jsonl"
SHARED = REPO.parent / "shared" / "calibration" / "throughput_points.jsonl"

DRIFT = 0.15
"""How far (as a factor, either way) a point's predicted/measured ratio may move from
today's before its test fails."""
# predicted / measured per point today (bench/speed.py): output tokens/s and TPOT.
TODAY: dict[str, dict[str, float]] = {
    "t01": {"output_tokens_per_s": 1.069, "tpot_s": 1.168},
    "t02": {"output_tokens_per_s": 1.345, "tpot_s": 0.775},
    "t03": {"output_tokens_per_s": 0.99, "tpot_s": 1.01},
    "t04": {"output_tokens_per_s": 0.843, "tpot_s": 1.186},
    # The older AWQ kernel (--quantization awq) at the 16-bit read share (0.633 / 1.574 at
    # the 0.45 it had before).
    "t07": {"output_tokens_per_s": 0.941, "tpot_s": 1.056},
    "t08": {"output_tokens_per_s": 1.097, "tpot_s": 0.876},
    "t09": {"output_tokens_per_s": 1.186, "tpot_s": 0.843},
    # At the tile floor (roofline.GEMM_MIN_TOKENS) this 4-bit single stream is bound by its
    # weight reads; it had matched (1.103 / 0.907) only as compute-bound at 1/65 of the peak,
    # where Qwen's own 4-bit single streams (u20, u21) came out at 0.65x.
    "t10": {"output_tokens_per_s": 1.753, "tpot_s": 0.571},
    # Replayed with the deployment flags its notes give from the source's own manifest for
    # this model on an L4 (--max-num-seqs=16 --max-model-len=8192 --enforce-eager), which
    # its 285 tok/s at 54.8 ms TPOT (about 16 requests decoding at once) bear out; with
    # vLLM's default 256 sequences it was 2.949 / 2.021.
    "t11": {"output_tokens_per_s": 1.036, "tpot_s": 0.946},
    # The A10G's tensor cores at half the A10's rate (70 TFLOPS; 1.904 at the A10's 125).
    "t12": {"output_tokens_per_s": 1.526},
    "t15": {"output_tokens_per_s": 0.889},
    "t16": {"output_tokens_per_s": 0.865},
    # MoE points: the experts read at moe_read_share of the dense share (t17 was 1.457,
    # t31 1.150 / 0.556, t32 1.191 / 1.033, t33 1.277 / 1.092 at the dense share).
    "t17": {"output_tokens_per_s": 1.081},
    # Open loops of 200 prompts at 1 and 4 a second: tokens over the run's duration,
    # arrivals then the last request's latency (bench/speed.py at_rate; 1.140 and 1.609 when
    # the steady state was taken for the whole run).
    "t18": {"output_tokens_per_s": 1.043, "tpot_s": 0.804},
    "t19": {"output_tokens_per_s": 1.296, "tpot_s": 0.767},
    "t20": {"output_tokens_per_s": 1.154},
    # A burst, stepped through as the scheduler runs it (predict_burst): the TPOT of each
    # request holds the prompt chunks computed beside it (0.675 as a token-weighted mean).
    "t21": {"output_tokens_per_s": 1.543, "tpot_s": 0.693},
    "t22": {"output_tokens_per_s": 0.97, "tpot_s": 1.023},
    "t23": {"output_tokens_per_s": 2.868, "tpot_s": 0.349},
    "t31": {"output_tokens_per_s": 1.04, "tpot_s": 0.616},
    "t32": {"output_tokens_per_s": 1.158, "tpot_s": 1.062},
    "t33": {"output_tokens_per_s": 1.115, "tpot_s": 1.252},
    # DeepSeek-R1 AWQ on 8 H100s, one stream: the latent-attention layer floor is set on it
    # (roofline.MLA_LAYER_FLOOR_S; 3.18 / 0.305 without it).
    "t34": {"output_tokens_per_s": 1.005, "tpot_s": 0.993},
    # SGLang (secondary), whose fused DeepSeek kernels run the layers faster than vLLM's
    # (1.074 before the latent-attention floor and the MoE read share).
    "t35": {"tpot_s": 1.825},
}


EXTRA = REPO / "tests" / "data" / "calibration" / "extra_throughput_points.jsonl"
# The gathered measurements (bench/speed.py's second set), pinned the same way.
TODAY_EXTRA: dict[str, dict[str, float]] = {
    "u01": {"output_tokens_per_s": 0.969, "tpot_s": 1.06},
    "u02": {"output_tokens_per_s": 0.991, "tpot_s": 1.055},
    "u03": {"output_tokens_per_s": 1.01, "tpot_s": 1.07},
    "u04": {"output_tokens_per_s": 1.062, "tpot_s": 1.055},
    # Bursts of ShareGPT prompts (gpustack's performance lab): a request's TPOT is its own
    # mean, and short ones live through the prompt-heavy first steps.
    "u05": {"output_tokens_per_s": 1.159, "tpot_s": 0.722},
    "u06": {"output_tokens_per_s": 1.229, "tpot_s": 0.928},
    # Output tokens/s where the source gives only the total: its output share by the stated
    # mean lengths (bench/speed.py _measured).
    "u07": {"output_tokens_per_s": 0.778, "tpot_s": 1.06},
    "u08": {"output_tokens_per_s": 0.743, "tpot_s": 1.338},
    # A100 bursts whose 3.4 and 4.0 s mean TTFT are below the A100's compute bound for
    # their prompts (secondary: the notes' ANOMALY).
    "u09": {"output_tokens_per_s": 0.671, "tpot_s": 0.325},
    "u10": {"output_tokens_per_s": 0.785, "tpot_s": 0.261},
    "u11": {"output_tokens_per_s": 1.035, "tpot_s": 0.739},
    # MoE prompt throughput (roofline.MOE_COMPUTE_SHARE, MOE_HALF_WIDTH are solved on u13
    # and u18; 1.37x and 1.78x at the dense rate).
    "u12": {"output_tokens_per_s": 1.162, "tpot_s": 0.737},
    "u13": {"output_tokens_per_s": 1.115, "tpot_s": 0.943},
    # The GB10's LPDDR5x: the experts read at nearly the dense share there
    # (roofline.MOE_READ_HALF_BANDWIDTH_GBPS; 0.768 / 1.287, 0.444 / 2.381 and 0.842 / 2.439
    # at one HBM share for every GPU). One source, llama-benchy against vLLM 0.26.
    "u14": {"output_tokens_per_s": 0.934, "tpot_s": 1.061},
    "u15": {"output_tokens_per_s": 0.946, "tpot_s": 1.115},
    "u16": {"output_tokens_per_s": 0.94, "tpot_s": 1.532},
    "u17": {"output_tokens_per_s": 1.14, "tpot_s": 0.585},
    "u18": {"output_tokens_per_s": 1.07, "tpot_s": 1.072},
    "u19": {"output_tokens_per_s": 1.013, "tpot_s": 0.987},
    "u20": {"output_tokens_per_s": 1.17, "tpot_s": 0.854},
    "u21": {"output_tokens_per_s": 1.106, "tpot_s": 0.904},
    "u22": {"output_tokens_per_s": 1.108, "tpot_s": 0.902},
    "u24": {"output_tokens_per_s": 1.195, "tpot_s": 0.659},
    # vllm bench serve at a stated --max-concurrency (a second gathering). The consumer and
    # workstation cards reach COMPUTE_EFFICIENCY_MMA of their peak (v03-v06 were 0.82-0.88
    # at the Hopper share); the RTX 4090 still streams its weights at 88% of its datasheet
    # bandwidth single-stream (v01), and the RTX PRO 6000's mixed steps at 128 concurrent
    # (v08) run past even that share.
    "v01": {"output_tokens_per_s": 0.897, "tpot_s": 1.11},
    "v02": {"output_tokens_per_s": 0.931, "tpot_s": 1.136},
    "v03": {"output_tokens_per_s": 1.052, "tpot_s": 1.102},
    "v04": {"output_tokens_per_s": 0.936, "tpot_s": 1.091},
    "v05": {"output_tokens_per_s": 1.003, "tpot_s": 1.016},
    "v06": {"output_tokens_per_s": 1.035, "tpot_s": 1.023},
    "v07": {"output_tokens_per_s": 1.09, "tpot_s": 1.012},
    "v08": {"output_tokens_per_s": 0.851, "tpot_s": 1.771},
    "v09": {"output_tokens_per_s": 1.317, "tpot_s": 0.776},
    "v10": {"output_tokens_per_s": 0.872, "tpot_s": 1.349},
    "v11": {"output_tokens_per_s": 1.439, "tpot_s": 0.745},
    # gpustack performance lab, vLLM 0.10.2/0.11.0 (a third gathering, w1/w2): the same
    # models and benchmarks on A100s and H100s (and DeepSeek-R1 on H200s): ShareGPT bursts,
    # random 32K/4K/2K/128-token prompt bursts, concurrency-4 streams. Their prompt-only
    # 128/4 bursts on Hopper run well below the roofline (w1-12, w2-82: 2.4x and 3.6x).
    "w1-01": {"output_tokens_per_s": 1.004, "tpot_s": 1.02},
    "w1-02": {"output_tokens_per_s": 1.264, "tpot_s": 0.796},
    "w1-03": {"output_tokens_per_s": 1.142, "tpot_s": 0.898},
    "w1-04": {"output_tokens_per_s": 0.849, "tpot_s": 1.156},
    "w1-05": {"output_tokens_per_s": 0.964, "tpot_s": 1.065},
    "w1-06": {"output_tokens_per_s": 0.908, "tpot_s": 1.128},
    "w1-07": {"output_tokens_per_s": 1.164, "tpot_s": 1.502},
    "w1-08": {"output_tokens_per_s": 1.269, "tpot_s": 0.725},
    "w1-09": {"output_tokens_per_s": 1.095, "tpot_s": 0.887},
    "w1-10": {"output_tokens_per_s": 1.169, "tpot_s": 0.915},
    "w1-11": {"output_tokens_per_s": 1.208, "tpot_s": 0.926},
    "w1-12": {"output_tokens_per_s": 2.554, "tpot_s": 0.934},
    "w1-13": {"output_tokens_per_s": 0.773, "tpot_s": 1.049},
    "w1-14": {"output_tokens_per_s": 1.204, "tpot_s": 0.777},
    "w1-15": {"output_tokens_per_s": 1.082, "tpot_s": 0.873},
    "w1-16": {"output_tokens_per_s": 0.732, "tpot_s": 0.775},
    "w1-17": {"output_tokens_per_s": 0.826, "tpot_s": 1.344},
    "w1-18": {"output_tokens_per_s": 0.768, "tpot_s": 1.441},
    "w1-19": {"output_tokens_per_s": 0.916, "tpot_s": 1.56},
    "w1-20": {"output_tokens_per_s": 1.112, "tpot_s": 0.755},
    "w1-21": {"output_tokens_per_s": 1.258, "tpot_s": 0.899},
    "w1-22": {"output_tokens_per_s": 1.575, "tpot_s": 0.984},
    "w2-01": {"output_tokens_per_s": 1.233, "tpot_s": 0.649},
    "w2-02": {"output_tokens_per_s": 1.211, "tpot_s": 0.91},
    "w2-03": {"output_tokens_per_s": 1.112, "tpot_s": 0.882},
    "w2-04": {"output_tokens_per_s": 1.191, "tpot_s": 0.823},
    "w2-05": {"output_tokens_per_s": 1.109, "tpot_s": 0.852},
    "w2-06": {"output_tokens_per_s": 1.116, "tpot_s": 0.846},
    "w2-07": {"output_tokens_per_s": 1.043, "tpot_s": 0.94},
    "w2-08": {"output_tokens_per_s": 1.053, "tpot_s": 0.92},
    "w2-09": {"output_tokens_per_s": 0.982, "tpot_s": 1.043},
    "w2-10": {"output_tokens_per_s": 1.325, "tpot_s": 1.307},
    "w2-11": {"output_tokens_per_s": 0.842, "tpot_s": 1.172},
    "w2-12": {"output_tokens_per_s": 0.949, "tpot_s": 1.007},
    "w2-13": {"output_tokens_per_s": 0.872, "tpot_s": 1.158},
    "w2-14": {"output_tokens_per_s": 0.987, "tpot_s": 1.54},
    "w2-15": {"output_tokens_per_s": 0.912, "tpot_s": 0.787},
    "w2-16": {"output_tokens_per_s": 1.346, "tpot_s": 0.572},
    "w2-17": {"output_tokens_per_s": 1.011, "tpot_s": 0.706},
    "w2-18": {"output_tokens_per_s": 1.073, "tpot_s": 0.63},
    "w2-19": {"output_tokens_per_s": 0.981, "tpot_s": 0.643},
    "w2-20": {"output_tokens_per_s": 0.706, "tpot_s": 1.446},
    "w2-21": {"output_tokens_per_s": 0.722, "tpot_s": 1.471},
    "w2-22": {"output_tokens_per_s": 0.769, "tpot_s": 1.407},
    "w2-23": {"output_tokens_per_s": 1.606, "tpot_s": 1.434},
    "w2-24": {"output_tokens_per_s": 1.005, "tpot_s": 1.006},
    "w2-25": {"output_tokens_per_s": 0.895, "tpot_s": 1.163},
    "w2-26": {"output_tokens_per_s": 0.922, "tpot_s": 1.163},
    "w2-27": {"output_tokens_per_s": 1.056, "tpot_s": 2.568},
    "w2-28": {"output_tokens_per_s": 0.943, "tpot_s": 0.821},
    "w2-29": {"output_tokens_per_s": 0.906, "tpot_s": 0.865},
    "w2-30": {"output_tokens_per_s": 1.069, "tpot_s": 0.816},
    "w2-31": {"output_tokens_per_s": 0.893, "tpot_s": 0.848},
    "w2-32": {"output_tokens_per_s": 0.891, "tpot_s": 0.837},
    "w2-33": {"output_tokens_per_s": 1.424, "tpot_s": 0.697},
    "w2-34": {"output_tokens_per_s": 0.952, "tpot_s": 0.718},
    "w2-35": {"output_tokens_per_s": 0.915, "tpot_s": 0.803},
    "w2-36": {"output_tokens_per_s": 1.167, "tpot_s": 1.005},
    "w2-37": {"output_tokens_per_s": 1.068, "tpot_s": 0.96},
    "w2-38": {"output_tokens_per_s": 1.351, "tpot_s": 0.784},
    "w2-39": {"output_tokens_per_s": 0.86, "tpot_s": 0.8},
    "w2-40": {"output_tokens_per_s": 0.835, "tpot_s": 0.899},
    "w2-41": {"output_tokens_per_s": 1.012, "tpot_s": 0.609},
    "w2-42": {"output_tokens_per_s": 1.012, "tpot_s": 1.015},
    "w2-43": {"output_tokens_per_s": 1.29, "tpot_s": 1.068},
    "w2-44": {"output_tokens_per_s": 1.277, "tpot_s": 1.106},
    "w2-45": {"output_tokens_per_s": 0.894, "tpot_s": 0.783},
    "w2-46": {"output_tokens_per_s": 0.911, "tpot_s": 0.865},
    "w2-47": {"output_tokens_per_s": 1.0, "tpot_s": 0.712},
    "w2-48": {"output_tokens_per_s": 1.308, "tpot_s": 1.138},
    "w2-49": {"output_tokens_per_s": 0.922, "tpot_s": 2.813},
    "w2-50": {"output_tokens_per_s": 1.022, "tpot_s": 1.512},
    "w2-51": {"output_tokens_per_s": 1.039, "tpot_s": 1.523},
    "w2-52": {"output_tokens_per_s": 1.617, "tpot_s": 0.86},
    "w2-53": {"output_tokens_per_s": 1.117, "tpot_s": 0.928},
    "w2-54": {"output_tokens_per_s": 0.894, "tpot_s": 1.103},
    "w2-55": {"output_tokens_per_s": 1.131, "tpot_s": 0.897},
    "w2-56": {"output_tokens_per_s": 1.152, "tpot_s": 0.935},
    "w2-57": {"output_tokens_per_s": 1.416, "tpot_s": 0.884},
    "w2-58": {"output_tokens_per_s": 1.124, "tpot_s": 0.937},
    "w2-59": {"output_tokens_per_s": 1.04, "tpot_s": 0.924},
    "w2-60": {"output_tokens_per_s": 0.928, "tpot_s": 1.038},
    "w2-61": {"output_tokens_per_s": 0.927, "tpot_s": 0.998},
    "w2-62": {"output_tokens_per_s": 0.931, "tpot_s": 0.977},
    "w2-63": {"output_tokens_per_s": 1.331, "tpot_s": 0.758},
    "w2-64": {"output_tokens_per_s": 0.93, "tpot_s": 1.056},
    "w2-65": {"output_tokens_per_s": 0.841, "tpot_s": 1.213},
    "w2-66": {"output_tokens_per_s": 0.676, "tpot_s": 1.973},
    "w2-67": {"output_tokens_per_s": 1.308, "tpot_s": 0.764},
    "w2-68": {"output_tokens_per_s": 0.891, "tpot_s": 1.092},
    "w2-69": {"output_tokens_per_s": 0.798, "tpot_s": 1.271},
    "w2-70": {"output_tokens_per_s": 0.65, "tpot_s": 2.215},
    "w2-71": {"output_tokens_per_s": 1.001, "tpot_s": 0.773},
    "w2-72": {"output_tokens_per_s": 1.006, "tpot_s": 0.644},
    "w2-73": {"output_tokens_per_s": 0.835, "tpot_s": 1.196},
    "w2-74": {"output_tokens_per_s": 1.173, "tpot_s": 0.932},
    "w2-75": {"output_tokens_per_s": 1.486, "tpot_s": 0.973},
    "w2-76": {"output_tokens_per_s": 0.839, "tpot_s": 1.197},
    "w2-77": {"output_tokens_per_s": 1.092, "tpot_s": 0.95},
    "w2-78": {"output_tokens_per_s": 1.131, "tpot_s": 0.957},
    "w2-79": {"output_tokens_per_s": 1.278, "tpot_s": 2.317},
    "w2-80": {"output_tokens_per_s": 1.234, "tpot_s": 0.825},
    "w2-81": {"output_tokens_per_s": 1.082, "tpot_s": 1.026},
    "w2-82": {"output_tokens_per_s": 3.627, "tpot_s": 0.954},
    "w2-83": {"output_tokens_per_s": 1.023, "tpot_s": 1.014},
    # A fourth gathering (w3): benchmark_serving bursts of Qwen2/2.5 on A100s (vLLM 0.10.1),
    # tt-inference-server GPU reference single streams, Mistral-7B on an RTX 4090, and a 32k
    # long-prompt run of Qwen3-30B-A3B-FP8 on an H200 (w3-18, its prefill skipped by a KV
    # connector, is secondary).
    "w3-01": {"output_tokens_per_s": 1.056, "tpot_s": 0.941},
    "w3-02": {"output_tokens_per_s": 1.102, "tpot_s": 0.899},
    "w3-03": {"output_tokens_per_s": 0.948, "tpot_s": 0.972},
    "w3-04": {"output_tokens_per_s": 1.054, "tpot_s": 0.922},
    "w3-05": {"output_tokens_per_s": 1.132, "tpot_s": 0.877},
    "w3-06": {"output_tokens_per_s": 0.996, "tpot_s": 0.992},
    "w3-07": {"output_tokens_per_s": 1.068, "tpot_s": 0.929},
    "w3-08": {"output_tokens_per_s": 0.715, "tpot_s": 0.981},
    "w3-09": {"output_tokens_per_s": 1.31, "tpot_s": 0.756},
    "w3-10": {"output_tokens_per_s": 1.246, "tpot_s": 0.726},
    "w3-11": {"output_tokens_per_s": 1.352, "tpot_s": 0.699},
    "w3-12": {"output_tokens_per_s": 1.424, "tpot_s": 0.695},
    "w3-13": {"output_tokens_per_s": 1.267, "tpot_s": 0.691},
    "w3-14": {"output_tokens_per_s": 0.967, "tpot_s": 1.022},
    "w3-15": {"output_tokens_per_s": 0.962, "tpot_s": 1.04},
    "w3-16": {"output_tokens_per_s": 0.859, "tpot_s": 1.025},
    "w3-17": {"output_tokens_per_s": 1.232, "tpot_s": 1.198},
    "w3-19": {"output_tokens_per_s": 0.985},
    "w3-20": {"output_tokens_per_s": 1.039},
    "w3-21": {"output_tokens_per_s": 1.064},
    # A fifth gathering: benchmark_serving bursts of 10 to 320 prompts on H100s and A100s
    # (LambdaLabsML/vllm-benchmark, vLLM 0.5.4-0.6, whose steps ran slower at high load than
    # today's: TPOT 0.53-0.83x), gpt-oss-120b at TP 2-8 on H100s (SemiAnalysis InferenceX,
    # 4-64 streams of 1k/1k), and single reports of gpt-oss, Qwen3-30B-A3B and DeepSeek-R1.
    "s1-01": {"output_tokens_per_s": 1.293, "tpot_s": 0.829},
    "s1-02": {"output_tokens_per_s": 1.235, "tpot_s": 0.533},
    "s1-03": {"output_tokens_per_s": 1.328, "tpot_s": 0.559},
    "s1-04": {"output_tokens_per_s": 0.846, "tpot_s": 0.625},
    "s1-05": {"output_tokens_per_s": 0.723, "tpot_s": 0.655},
    "s1-06": {"output_tokens_per_s": 0.94, "tpot_s": 0.92},
    "s1-07": {"output_tokens_per_s": 1.046, "tpot_s": 0.826},
    "s1-08": {"output_tokens_per_s": 0.88, "tpot_s": 0.764},
    "s1-09": {"output_tokens_per_s": 1.2, "tpot_s": 0.696},
    "s1-10": {"output_tokens_per_s": 1.09, "tpot_s": 0.846},
    "s2-01": {"output_tokens_per_s": 1.269, "tpot_s": 0.812},
    "s2-02": {"output_tokens_per_s": 1.143, "tpot_s": 0.902},
    "s2-03": {"output_tokens_per_s": 1.037, "tpot_s": 0.981},
    "s2-04": {"output_tokens_per_s": 0.938, "tpot_s": 1.1},
    "s2-05": {"output_tokens_per_s": 0.886, "tpot_s": 1.163},
    "s2-06": {"output_tokens_per_s": 0.779, "tpot_s": 1.319},
    "s2-07": {"output_tokens_per_s": 0.704, "tpot_s": 1.448},
    "s2-08": {"output_tokens_per_s": 1.226, "tpot_s": 0.828},
    "s2-09": {"output_tokens_per_s": 2.344, "tpot_s": 0.3},
    "s2-10": {"output_tokens_per_s": 0.687, "tpot_s": 1.489},
    "s2-11": {"output_tokens_per_s": 2.3, "tpot_s": 0.455},
    "s2-12": {"output_tokens_per_s": 1.053},
    "s2-13": {"output_tokens_per_s": 0.997, "tpot_s": 1.003},
    # A sixth gathering, replayed before any change: Qwen3-32B on an H100 NVL under 0.8.5
    # (max_num_seqs 32), Gemma 3 4B single streams on Tenstorrent's A100 reference runs
    # (slower than the model, as their other A100 runs: w3-09..13), Qwen3-8B offline on an
    # H100 under 0.8.5 and 0.10.2, Nemotron-3-Nano FP8 on an H200.
    "s3-03": {"output_tokens_per_s": 1.363},
    "s3-05": {"output_tokens_per_s": 1.144, "tpot_s": 0.866},
    "s3-06": {"output_tokens_per_s": 1.303, "tpot_s": 0.763},
    "s3-07": {"output_tokens_per_s": 1.392, "tpot_s": 0.682},
    "s3-08": {"output_tokens_per_s": 1.222, "tpot_s": 0.739},
    "s3-09": {"output_tokens_per_s": 0.956},
    "s3-11": {"output_tokens_per_s": 0.792},
    "s3-13": {"output_tokens_per_s": 0.9, "tpot_s": 1.111},
}


def _replay(path: Path) -> dict[str, dict[str, Any]]:
    """Each point of a measurement file through bench/speed.py, by id."""
    bench = load_script("bench/speed.py")
    return {r["id"]: r for r in (bench.replay(p) for p in bench.load_points(path))}


def _stays_where_it_is(row: dict[str, Any], pinned: dict[str, float]) -> None:
    """The point's predicted/measured ratios are within DRIFT of the pinned ones."""
    assert "errors" in row, row.get("skip")
    for key, ratio in pinned.items():
        now = 1 + row["errors"][key]
        assert abs(math.log(now / ratio)) <= math.log(1 + DRIFT), (key, now, ratio)


@pytest.fixture(scope="module")
def replayed_extra() -> dict[str, dict[str, Any]]:
    return _replay(EXTRA)


@pytest.mark.parametrize("point", sorted(TODAY_EXTRA))
def test_each_gathered_point_stays_where_it_is(
    replayed_extra: dict[str, dict[str, Any]], point: str
) -> None:
    _stays_where_it_is(replayed_extra[point], TODAY_EXTRA[point])


def test_the_gathered_medians_meet_the_target(replayed_extra: dict[str, dict[str, Any]]) -> None:
    bench = load_script("bench/speed.py")
    s = bench.summary(list(replayed_extra.values()))
    # Today 12.0% and 17.1% (188 and 181 points: u09, u10 and w3-18 are secondary).
    assert s["output_tokens_per_s"]["median_abs_error"] <= 0.25
    assert s["tpot_s"]["median_abs_error"] <= 0.25


@pytest.fixture(scope="module")
def replayed() -> dict[str, dict[str, Any]]:
    return _replay(POINTS)


@pytest.mark.parametrize("point", sorted(TODAY))
def test_each_published_point_stays_where_it_is(
    replayed: dict[str, dict[str, Any]], point: str
) -> None:
    _stays_where_it_is(replayed[point], TODAY[point])


def test_the_medians_meet_the_target(replayed: dict[str, dict[str, Any]]) -> None:
    bench = load_script("bench/speed.py")
    s = bench.summary(list(replayed.values()))
    # The target: within 25% median; today 11.5% and 17.7% (vLLM points that their
    # source does not flag as anomalous).
    assert s["output_tokens_per_s"]["median_abs_error"] <= 0.25
    assert s["tpot_s"]["median_abs_error"] <= 0.25
    # None past 2x: at worst 1.75x in tokens/s and TPOT (t10, a 4-bit single stream whose
    # source notes its overheads).
    assert s["tpot_s"]["worst_factor"] <= 2.0
    assert s["output_tokens_per_s"]["worst_factor"] <= 2.0


@pytest.mark.skipif(not SHARED.is_file(), reason="no ../shared/calibration beside the checkout")
def test_the_copy_matches_the_shared_points() -> None:
    assert POINTS.read_bytes() == SHARED.read_bytes(), f"copy {SHARED} to {POINTS}"


def test_touched_experts() -> None:
    # Mixtral, top-2 of 8: one token touches 2/8; eight touch 1 - (6/8)^8 = 0.8999.
    assert touched_expert_share(2 / 8, 1) == pytest.approx(0.25)
    assert touched_expert_share(2 / 8, 8) == pytest.approx(1 - 0.75**8)
    assert touched_expert_share(0.0, 64) == 0.0


def test_a_prompt_pays_the_lm_head_at_its_last_token_only() -> None:
    """vLLM computes logits at each scheduled request's last token: a compute-bound prompt
    chunk of 8,192 tokens pays the LM head once, not 8,192 times; a batch of decodes pays it
    for every request."""
    import dataclasses

    from oominfer.speed.performance import chip, stage
    from oominfer.speed.roofline import GEMM_HALF_TOKENS, step_time

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=8192)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    st, c = stage(spec, s, b), chip(hw.gpu, s, spec)
    assert c is not None
    # Llama-3.1-8B: 128,256 x 4,096 head parameters, 1.05 GFLOP a token.
    assert st.head_flops_per_token == 2 * 128_256 * 4096
    # The head counted as any other weight: at every token of the chunk.
    everywhere = dataclasses.replace(st, head_flops_per_token=0.0)

    def prompt(stage_: Any, sequences: int) -> float:
        return step_time(stage_, c, decodes=0, context=0, prefill_tokens=8192,
                         prefill_context=4096, prefill_sequences=sequences).seconds  # fmt: skip

    # Charging the head at every prompt token costs 8,191 heads' FLOPs more (~22 ms), at
    # the tensor-core fill of an 8,192-row GEMM.
    fill = 8192 / (8192 + GEMM_HALF_TOKENS)
    head = st.head_flops_per_token / (c.flops * fill)
    assert prompt(everywhere, 1) - prompt(st, 1) == pytest.approx(8191 * head, rel=1e-6)
    # 64 prompts in the chunk: 63 heads more than one.
    assert prompt(st, 64) - prompt(st, 1) == pytest.approx(63 * head, rel=1e-6)


def _predict(settings: EngineSettings, workload: Workload, gpu: str = "H100") -> Any:
    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu(gpu)
    b = estimate(spec, hardware=hw, settings=settings, version=CURRENT_VLLM)
    return predict(spec, gpu=hw.gpu, settings=settings, breakdown=b, workload=workload)


def test_concurrency_is_capped_by_max_num_seqs() -> None:
    s = EngineSettings(max_model_len=8192, max_num_seqs=8)
    perf = _predict(s, Workload(input_len=1000, output_len=200, concurrency=32))
    assert (perf.concurrency, perf.limited_by, perf.requested_concurrency) == (
        8,
        "max_num_seqs",
        32,
    )
    alone = _predict(s, Workload(input_len=1000, output_len=200, concurrency=8))
    # The 24 waiting requests add their queueing to the time to first token.
    assert perf.ttft_s > alone.ttft_s + 1.0
    assert perf.output_tokens_per_s == pytest.approx(alone.output_tokens_per_s)


def test_concurrency_is_capped_by_the_kv_cache() -> None:
    # An L4 holds ~ 4 GiB of KV for Llama-3.1-8B: 128 KiB a token, ~ 30k tokens, so about
    # 3 requests of 8,192 tokens.
    s = EngineSettings(max_model_len=8192)
    perf = _predict(s, Workload(input_len=7000, output_len=1000, concurrency=64), gpu="L4")
    assert perf.limited_by == "kv_cache"
    assert 1 <= perf.concurrency < 8


def test_more_requests_more_tokens_per_second_slower_each() -> None:
    s = EngineSettings(max_model_len=8192)
    one = _predict(s, Workload(input_len=500, output_len=500, concurrency=1))
    many = _predict(s, Workload(input_len=500, output_len=500, concurrency=32))
    assert one.bound == "memory"
    assert many.output_tokens_per_s > 5 * one.output_tokens_per_s
    assert many.tpot_s > one.tpot_s
    assert one.requests_per_s == pytest.approx(one.output_tokens_per_s / 500)


def test_a_burst_with_varied_lengths_drains_slower_than_fixed_lengths() -> None:
    from oominfer.speed.performance import predict_burst

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=4096)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    kw: dict[str, Any] = {"gpu": hw.gpu, "settings": s, "breakdown": b, "requests": 3000,
                          "input_len": 200, "output_len": 200}  # fmt: skip
    fixed = predict_burst(spec, spread=False, **kw)
    varied = predict_burst(spec, spread=True, **kw)
    assert fixed is not None and varied is not None
    assert fixed.concurrency == varied.concurrency == b.max_num_seqs
    # The last requests finish at an ever smaller batch: fewer tokens per second overall.
    assert varied.output_tokens_per_s < fixed.output_tokens_per_s
    # The lengths' mean is the output length (whole tokens: within rounding).
    assert varied.requests_per_s == pytest.approx(varied.output_tokens_per_s / 200, rel=1e-3)


def test_a_long_closed_loop_run_is_extended_at_the_pace_of_its_middle_waves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """predict_run steps through SIMULATED_WAVES batches of a closed loop and extends the
    rest at their pace: within 4% of stepping through all of it."""
    import oominfer.speed.performance as performance

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=4096)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    w = Workload(input_len=300, output_len=100, concurrency=8)
    kw: dict[str, Any] = {"gpu": hw.gpu, "settings": s, "breakdown": b, "workload": w,
                          "prompts": 800, "spread": True}  # fmt: skip
    short = performance.predict_run(spec, **kw)
    monkeypatch.setattr(performance, "SIMULATED_WAVES", 1000)
    full = performance.predict_run(spec, **kw)
    assert short is not None and full is not None
    assert short.output_tokens_per_s == pytest.approx(full.output_tokens_per_s, rel=0.04)
    assert short.ttft_s == pytest.approx(full.ttft_s, rel=0.05)
    assert short.tpot_s == pytest.approx(full.tpot_s, rel=0.05)


def test_a_burst_request_decoding_beside_prompts_sees_longer_steps() -> None:
    """Every prompt of a burst is computed in the first steps, beside the decodes of those
    that already have their first token: the mean TPOT over requests is longer than a
    decode step of the full batch, and the more so the longer the prompts."""
    from oominfer.speed.performance import chip, predict_burst, stage
    from oominfer.speed.roofline import step_time

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=8192)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    kw: dict[str, Any] = {"gpu": hw.gpu, "settings": s, "breakdown": b, "requests": 200,
                          "output_len": 100, "spread": False}  # fmt: skip
    short = predict_burst(spec, input_len=100, **kw)
    long = predict_burst(spec, input_len=4000, **kw)
    assert short is not None and long is not None
    decode = step_time(stage(spec, s, b), chip(hw.gpu, s, spec), decodes=200, context=4050)
    assert long.tpot_s > 1.5 * decode.seconds
    assert long.tpot_s > short.tpot_s
    # Each request waits for the prompts before its own: the mean TTFT is about half the
    # time all prompts take, far above one prompt's.
    assert long.ttft_s > 10 * short.ttft_s


def test_a_long_run_of_varied_lengths_is_extended_at_its_pace_per_token() -> None:
    """A single stream of 100 prompts is stepped through 16 of them and extended at the pace
    of their middle half: with varied output lengths that pace is per token, so the run's
    tokens/s is the fixed-length run's (it was 1.26x that when the middle half's requests,
    shorter than the mean, set a per-request pace)."""
    from oominfer.speed.performance import predict_run

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=4096)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    w = Workload(input_len=100, output_len=256, concurrency=1)
    fixed, varied = (
        predict_run(
            spec, gpu=hw.gpu, settings=s, breakdown=b, workload=w, prompts=100, spread=spread
        )
        for spread in (False, True)
    )
    assert fixed is not None and varied is not None
    assert varied.output_tokens_per_s == pytest.approx(fixed.output_tokens_per_s, rel=0.01)


def test_an_open_loop_reports_its_arrivals_and_its_drain() -> None:
    """200 requests at 1 a second, on a plan whose closed loop serves c / 5 a second at c
    requests at once: the steady state is 5 at once; the run lasts the 199 s of arrivals and
    the last request's 0.1 + 99 x 0.05 s, so it serves 200 / 204.05 requests a second."""
    bench = load_script("bench/speed.py")

    def perf_at(c: int) -> Performance:
        return Performance(ttft_s=0.1, tpot_s=0.05, output_tokens_per_s=c * 20.0,
                           requests_per_s=c / 5, concurrency=c, input_len=100, output_len=100,
                           bound="memory", requested_concurrency=c)  # fmt: skip

    perf = bench.at_rate(perf_at, 1.0, 256, 200)
    assert perf.concurrency == 5
    assert perf.requests_per_s == pytest.approx(200 / 204.05)
    assert perf.output_tokens_per_s == pytest.approx(100 * 200 / 204.05)
    # A rate past what the cap serves: the capped batch's rate, and its own drain.
    over = bench.at_rate(perf_at, 100.0, 8, 200)
    assert over.concurrency == 8
    assert over.requests_per_s == pytest.approx(200 / (199 / 1.6 + 5.05))


def test_a_point_is_replayed_with_the_flags_its_source_states() -> None:
    """Its own fields first; then a flag its quote or notes give (switches too)."""
    bench = load_script("bench/speed.py")
    point = {
        "quote": "vllm serve m --max-num-seqs 64 --enforce-eager",
        "notes": "the manifest uses --max-model-len=8192",
    }
    assert bench._stated(point, "max-num-seqs") == "64"
    assert bench._stated(point, "max-model-len") == "8192"
    assert bench._stated(point, "enforce-eager") == ""
    assert bench._stated(point, "max-num-batched-tokens") is None
    # A longer flag is not read as a shorter one.
    assert bench._stated({"quote": "--max-num-seqs-x 3"}, "max-num-seqs") is None
    # A short form where one is given (-pp), never inside a longer flag.
    assert bench._stated({"quote": "vllm serve m -pp 2"}, "pipeline-parallel-size", "pp") == "2"
    assert bench._stated({"quote": "--pp 3"}, "pipeline-parallel-size", "pp") is None


def test_a_pipeline_parallel_point_is_replayed_on_all_its_gpus(
    replayed_extra: dict[str, dict[str, Any]],
) -> None:
    """w2-47 serves gpt-oss-120b with `-pp 2` (TP 1 on 2 H100s), a ShareGPT burst of 1,000:
    replayed on one GPU it was predicted at 0.63x its tokens/s and 0.45x its TPOT; on its two
    stages but one batch at a time, 0.69x and 1.05x; with a batch in flight per stage (vLLM's
    batch queue), 0.94x and 0.74x (its median TPOT, 69.6 ms, is 0.60x its mean)."""
    row = replayed_extra["w2-47"]
    assert row["gpu"] == "H100-SXM-80GB x2 (PP 2)"
    assert abs(row["errors"]["output_tokens_per_s"]) < 0.1
    assert 0.65 < 1 + row["errors"]["tpot_s"] < 1.0


def test_a_steady_state_computes_the_others_prompts_in_whole_chunks() -> None:
    """Ten streams of 2k/1k on a MoE model: the other nine prompts come as nine whole chunks
    in a thousand steps, the rest decode alone. Each kind is timed as it runs, so the mean
    step is the mix of a decode-only step and a chunk step, not a step with a thin slice of
    prompt tokens, which would touch most experts in every step (s2-10: Qwen3-30B-A3B on an
    H100, measured 13.2 ms a token, 30.8 predicted when the slices were spread)."""
    from oominfer.speed.performance import _steady_step, chip, stage
    from oominfer.speed.roofline import step_time

    spec = load_spec("Qwen/Qwen3-30B-A3B")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=4096)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    w = Workload(input_len=2048, output_len=1024, concurrency=10)
    predicted = predict(spec, gpu=hw.gpu, settings=s, breakdown=b, workload=w)
    assert predicted is not None
    st = stage(spec, s, b)
    c = chip(hw.gpu, s, spec)
    assert c is not None
    steady = _steady_step(st, c, w, 10, b.max_num_batched_tokens, 1)
    alone = step_time(st, c, decodes=10, context=2048 + 512)
    chunk = step_time(st, c, decodes=10, context=2048 + 512, prefill_tokens=2048,
                      prefill_context=1024)  # fmt: skip
    share = 9 / 1024
    assert steady.seconds == pytest.approx((1 - share) * alone.seconds + share * chunk.seconds)
    spread = step_time(st, c, decodes=10, context=2048 + 512, prefill_tokens=9 * 2048 / 1024,
                       prefill_context=1024, prefill_sequences=9 / 1024)  # fmt: skip
    assert steady.seconds < 0.8 * spread.seconds
    assert predicted.tpot_s == pytest.approx(steady.seconds)


def test_gddr_reads_at_a_higher_share_of_its_peak_than_hbm() -> None:
    """A graphics card's GDDR streams nearer its datasheet peak than HBM (an RTX 4090's
    single stream reads at 0.88 of it, an H100's at about 0.7); the GB10's LPDDR5X reads at
    the HBM share. The single stream's time per token follows."""
    assert GDDR_BANDWIDTH_EFFICIENCY > BANDWIDTH_EFFICIENCY
    assert bandwidth_efficiency(find_gpu("RTX-4090")) == GDDR_BANDWIDTH_EFFICIENCY
    assert bandwidth_efficiency(find_gpu("L4")) == GDDR_BANDWIDTH_EFFICIENCY
    assert bandwidth_efficiency(find_gpu("H100")) == BANDWIDTH_EFFICIENCY
    assert bandwidth_efficiency(find_gpu("GB10")) == BANDWIDTH_EFFICIENCY
    spec = load_spec("Qwen/Qwen2.5-7B-Instruct")
    w = Workload(input_len=217, output_len=217, concurrency=1)

    def tpot(name: str) -> float:
        gpu = find_gpu(name)
        b = estimate(spec, hardware=Hardware(gpu=gpu), settings=EngineSettings(),
                     version=CURRENT_VLLM)  # fmt: skip
        perf = predict(spec, gpu=gpu, settings=EngineSettings(), breakdown=b, workload=w)
        assert perf is not None
        return perf.tpot_s

    # An RTX 4090 (1,008 GB/s) and an RTX 5090 (1,792): measured 15.9 ms on the 4090.
    assert 14e-3 < tpot("RTX-4090") < 18e-3
    assert tpot("RTX-5090") < tpot("RTX-4090")


def _burst_parts(max_model_len: int) -> tuple[Any, Any]:
    """The stage and chip of Llama-3.1-8B on one H100 at ``max_model_len``."""
    from oominfer.speed.performance import chip, stage

    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu("H100")
    s = EngineSettings(max_model_len=max_model_len)
    b = estimate(spec, hardware=hw, settings=s, version=CURRENT_VLLM)
    return stage(spec, s, b), chip(hw.gpu, s, spec)


def test_a_burst_that_outgrows_the_kv_cache_preempts_the_last_admitted_and_finishes() -> None:
    """200 prompts of 100 tokens with 900-token answers, on a pool that holds 50 whole
    requests (a share of 1 / 50,000 a token): all 200 prompts fit at once, so vLLM admits
    them all and preempts as the answers grow; every request still gets all its tokens.
    With a pool that holds all 200 whole, nothing is preempted."""
    from oominfer.speed.performance import _run_burst

    s, c = _burst_parts(4096)
    w = Workload(input_len=100, output_len=900, concurrency=200)
    outputs = [900] * 200
    kw: dict[str, Any] = {"cap": 200, "chunk": 8192, "pp": 1}
    tight = _run_burst(s, c, w, outputs, footprint=(0.0, 1 / 50_000), **kw)
    ample = _run_burst(s, c, w, outputs, footprint=(0.0, 1 / 250_000), **kw)
    assert tight is not None and ample is not None
    assert ample.preemptions == 0
    assert tight.preemptions > 150
    assert all(f > 0 for f in tight.first)
    assert all(f > t for f, t in zip(tight.finish, tight.first, strict=True))
    # The first admitted is never preempted, and decodes in smaller steps than with all 200
    # in the pool; the preempted ones' prompts and tokens are computed again: the run is longer.
    assert tight.finish[0] < ample.finish[0]
    assert tight.clock > ample.clock


def test_a_prompt_is_admitted_only_when_the_whole_of_it_fits() -> None:
    """Prompts of 30,000 tokens on a pool that holds 1.5 of them: the second waits for the
    first to finish (vLLM's scheduler_reserve_full_isl) instead of computing its first
    chunks, being preempted as the cache fills, and computing them again."""
    from oominfer.speed.performance import _run_burst

    s, c = _burst_parts(32768)
    w = Workload(input_len=30_000, output_len=100, concurrency=4)
    run = _run_burst(s, c, w, [100] * 4, cap=4, chunk=8192, pp=1,
                     footprint=(0.0, 1 / 45_150))  # fmt: skip
    assert run is not None
    assert run.preemptions == 0
    # One at a time: each first token comes after the one before has finished.
    for before, after in zip(run.finish, run.first[1:], strict=False):
        assert after > before


def test_a_request_alone_in_the_kv_cache_is_never_preempted() -> None:
    """An answer longer than the mean (``spread``) can outgrow the line's estimate of the
    pool; alone in it, the request runs on (vLLM starts only where a max_model_len request
    fits) instead of preempting itself and leaving nothing to run."""
    from oominfer.speed.performance import _run_burst

    s, c = _burst_parts(4096)
    w = Workload(input_len=100, output_len=400, concurrency=3)
    run = _run_burst(s, c, w, [1200, 200, 200], cap=3, chunk=2048, pp=1,
                     footprint=(0.0, 1 / 500))  # fmt: skip
    assert run is not None
    assert all(f > 0 for f in run.finish)


@pytest.mark.parametrize(
    ("input_len", "outputs", "cap", "per_token"),
    [
        (200, [2000] * 60, 60, 1 / 300_000),  # ample pool: decode-only stretches
        (200, [3000] * 80, 80, 1 / 60_000),  # tight pool: preemptions between them
        (30_000, [500] * 6, 6, 1 / 40_000),  # prompts admitted one at a time
        (500, [(j * 7919) % 1500 + 2 for j in range(120)], 40, 1 / 80_000),  # varied, queued
    ],
)
def test_a_burst_run_in_stretches_matches_it_stepped_one_step_at_a_time(
    monkeypatch: pytest.MonkeyPatch, input_len: int, outputs: list[int], cap: int,
    per_token: float,
) -> None:  # fmt: skip
    """_run_burst takes decode-only stretches in which nothing can happen in one go
    (JUMP_MIN_STEPS); stepped one step at a time, the same bursts give the same run: every
    request's first and last token within 0.1%, the same preemptions."""
    from oominfer.speed import performance
    from oominfer.speed.performance import _run_burst

    s, c = _burst_parts(32768)
    w = Workload(input_len=input_len, output_len=max(outputs), concurrency=len(outputs))
    kw: dict[str, Any] = {"cap": cap, "chunk": 8192, "pp": 1, "footprint": (2e-5, per_token)}
    fast = _run_burst(s, c, w, outputs, **kw)
    monkeypatch.setattr(performance, "JUMP_MIN_STEPS", 10**9)
    exact = _run_burst(s, c, w, outputs, **kw)
    assert fast is not None and exact is not None
    assert fast.preemptions == exact.preemptions
    assert fast.bound_at_full == exact.bound_at_full
    assert fast.clock == pytest.approx(exact.clock, rel=1e-3)
    assert fast.first == pytest.approx(exact.first, rel=1e-3)
    assert fast.finish == pytest.approx(exact.finish, rel=1e-3)


def test_the_speed_bench_sets_the_previous_model_beside_today(tmp_path: Path) -> None:
    """bench/speed.py's summaries put the stored predictions of an earlier model beside
    today's: each point's errors recomputed against the same measured figures, and points
    the earlier model did not predict left out."""
    bench = load_script("bench/speed.py")
    stored = tmp_path / "speed_prev.json"
    stored.write_text('{"a": {"output_tokens_per_s": 150.0, "tpot_s": 0.01, "ttft_s": null}}')
    rows = [
        {"id": "a", "secondary": False, "errors": {"output_tokens_per_s": 0.0},
         "measured": {"output_tokens_per_s": 100.0, "tpot_s": 0.02, "ttft_s": 0.1}},
        {"id": "b", "secondary": False, "errors": {"output_tokens_per_s": 0.0},
         "measured": {"output_tokens_per_s": 100.0, "tpot_s": None, "ttft_s": None}},
    ]  # fmt: skip
    before = bench.previous_errors(rows, stored)
    assert [r["id"] for r in before] == ["a"]
    assert before[0]["errors"] == pytest.approx({"output_tokens_per_s": 0.5, "tpot_s": -0.5})
    assert bench.summary(before)["tpot_s"]["worst_factor"] == pytest.approx(2.0)
    # The stored file is today's point ids: every replayed vLLM point has a stored prediction.
    ids = set(json.loads(bench.PREVIOUS.read_text()))
    assert {"t01", "w1-08", "s3-13"} <= ids


def test_sparse_attention_reads_the_top_k_latents_and_every_indexer_key() -> None:
    """DeepSeek sparse attention (DeepSeek-V3.2: index_topk 2048) attends to 2,048 cached
    tokens at most: past that a decode step reads the latents of those only, but the
    indexer's 132-byte key of every cached token. Up to 2,048 tokens it is dense attention."""
    import dataclasses

    from oominfer.model.catalog import catalog_entry
    from oominfer.model.config import spec_from_config
    from oominfer.speed.performance import chip, stage
    from oominfer.speed.roofline import step_time

    entry = catalog_entry("deepseek-ai/DeepSeek-V3")
    assert entry is not None
    config = {**entry.config, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
    v32 = spec_from_config(config, model_id="deepseek-v3.2")
    hw = Hardware.from_gpu("H200")
    s = EngineSettings(max_model_len=65536, tensor_parallel_size=8)
    b = estimate(v32, hardware=Hardware(gpu=hw.gpu, count=8), settings=s, version=CURRENT_VLLM)
    sparse, c = stage(v32, s, b), chip(hw.gpu, s, v32)
    assert sparse.sparse_topk == 2048
    assert sparse.sparse_kv_bytes_per_token == 61 * 1152  # the latent; 61 x 132 is the keys'
    dense = dataclasses.replace(sparse, sparse_topk=0)

    def step(st: Any, context: int) -> float:
        return step_time(st, c, decodes=64, context=context).seconds

    assert step(sparse, 2048) == pytest.approx(step(dense, 2048), rel=0.01)
    assert step(sparse, 32768) < 0.6 * step(dense, 32768)
    # Still the indexer's keys grow with the context.
    assert step(sparse, 32768) > step(sparse, 4096)
