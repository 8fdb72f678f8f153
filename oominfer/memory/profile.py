"""What vLLM reserves besides weights and KV cache: the profiling run's activation peak,
non-torch memory, CUDA graphs, and the batch defaults that size them."""

from __future__ import annotations

from typing import Final

from oominfer.base.units import GiB, MiB
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.rules.versions import EngineVersion

# Memory the engine holds after profiling beyond weights and activations: cuBLAS and
# attention workspaces, persistent input and sampler buffers; with tensor parallelism the
# NCCL and custom all-reduce buffers too. Fitted on calibration/ (bench/calibration.py).
NON_TORCH_BYTES: Final = 200 * MiB
NON_TORCH_TP_BYTES: Final = 400 * MiB

# The dummy forward over max_num_batched_tokens tokens: the residual stream and a few
# hidden-size temporaries, the fused QKV output, and the MLP's gate/up output plus its
# activation (3 x intermediate) are alive at the MLP's peak.
HIDDEN_TEMPORARIES: Final = 4
MLP_TEMPORARIES: Final = 3

# CUDA graphs: FULL_AND_PIECEWISE graphs for each capture size (capture_sizes below). vLLM
# measures their pool by capturing a sample and (>= 0.21) subtracts it before sizing the KV
# cache. The pool grows with layers x sizes; fitted on calibration point dp37 (Qwen3-8B,
# 36 layers, 67 sizes: 2.24 GiB).
GRAPH_BYTES_PER_LAYER_AND_SIZE: Final = 950 * 1024

# vLLM's CPU backend: the API server, the engine core and the torch runtime around the
# weights and the KV cache. Measured here: a 22M-parameter model with a 1 GiB KV cache has a
# process tree of about 3 GB resident (../shared/ENVIRONMENT.md), so about 2 GiB besides the
# two.
CPU_RUNTIME_BYTES: Final = 2 * GiB


def vllm_defaults(hardware: Hardware, *, world_size: int = 1) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) for its OpenAI server on this device.

    vllm/engine/arg_utils.py ``_get_default_max_num_seqs_and_batched_tokens`` (0.32):
    >= 160 GiB: (16384, 1024); >= 70 GiB and not an A100: (8192, 1024); else (2048, 256);
    CPU: (2048 x world, 128 x world).
    """
    gpu = hardware.gpu
    if hardware.is_cpu:
        return 2048 * world_size, 128 * world_size
    if gpu.cuda_total_bytes >= 160 * GiB:
        return 16384, 1024
    if gpu.cuda_total_bytes >= 70 * GiB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


def forward_bytes(spec: ModelSpec, *, tokens: int, dtype_size: int, tp: int) -> int:
    """Peak of one forward pass over ``tokens`` tokens above the weights: per token, a few
    hidden-size temporaries plus the fused QKV output and the MLP's gate/up output and
    activation (experts: top-k of them), split across TP ranks. The same in every engine."""
    inter = spec.intermediate_size
    if spec.is_moe:
        inter = max(spec.moe_intermediate_size * max(spec.num_experts_per_tok, 1), inter)
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = HIDDEN_TEMPORARIES * spec.hidden_size + (MLP_TEMPORARIES * inter + qkv) // tp
    return tokens * per_token * dtype_size


def activation_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    seqs: int,
    dtype_size: int,
    tp: int,
    version: EngineVersion,
) -> int:
    """Peak of vLLM's profiling run above the weights: a forward pass over ``tokens`` tokens
    (max_num_batched_tokens), then the dummy sampler over ``min(tokens, seqs)`` rows of logits.

    Forward: per token, a few hidden-size temporaries plus the fused QKV output and the MLP's
    gate/up output and activation (experts: top-k of them), split across TP ranks.
    Sampler: logits [rows, vocab] in the model dtype; the V1 runner adds fp32 logits,
    softmax probabilities and exponential noise (3 x 4 bytes per logit).
    """
    forward = forward_bytes(spec, tokens=tokens, dtype_size=dtype_size, tp=tp)
    rows = min(tokens, seqs)
    sampler = rows * spec.vocab_size * (dtype_size + version.sampler_bytes_per_logit_fp32)
    return forward + sampler
