"""Parallel layouts vLLM accepts: tensor parallel against the heads, replicas across nodes.

- Attention heads: vllm/config/model.py ``verify_with_parallel_config``, "Total number of
  attention heads (N) must be divisible by tensor parallel size (T)." (config time).
- KV heads: split when they divide by TP, replicated when TP divides by them; any other
  ratio fails at model construction (``assert self.total_num_kv_heads % tp_size == 0`` in
  vllm/model_executor/models/llama.py and ~58 other model files; ``divide()`` in
  layers/linear.py QKVParallelLinear). vLLM's config accepts phi-4 (10 KV heads) at TP 4;
  the worker then dies, so this rule is data here.
- Across nodes: vllm/config/parallel.py ``ParallelConfig.__post_init__`` refuses a world
  size larger than the GPUs of the node unless ``--distributed-executor-backend ray`` (or
  ``--nnodes``, not combinable with Ray).
- Pipeline parallel: vllm/distributed/utils.py ``get_pp_indices`` splits the layers
  (memory/weights.py ``pp_layer_ranges``); no check against the layer count.
"""

from __future__ import annotations

from typing import Final

from oominfer.model.spec import ModelSpec
from oominfer.settings import ExecutorBackend

SOURCE: Final = (
    "vllm/config/model.py verify_with_parallel_config; vllm/model_executor/models/llama.py "
    "LlamaAttention; vllm/config/parallel.py ParallelConfig.__post_init__"
)


def tensor_parallel_refusal(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM refuses tensor parallel ``tp`` for this model, or None when it accepts it."""
    heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
    if heads % tp:
        return (
            f"total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp})"
        )
    if not spec.is_mla and kv_heads % tp and tp % kv_heads:
        return (
            f"tensor parallel {tp} neither divides the {kv_heads} KV heads nor is divided by "
            "them (vLLM's attention layers assert one or the other)"
        )
    group = spec.quantization.group_size if spec.quantization else None
    if group and spec.quantization is not None and spec.quantization.method == "mxfp4":
        # MXFP4 quantizes only the experts, and its MoE methods round each rank's slice of
        # the intermediate size up to their kernel's tile (fused_moe/oracle/mxfp4.py
        # ``mxfp4_round_up_hidden_size_and_intermediate_size``: gpt-oss-120b's 2,880 at TP 4
        # is 720 a rank, run as 768; memory/weights.py mxfp4_expert_ratio counts the padding).
        group = None
    if group:
        # A row-parallel layer's slice of its input must hold whole quantization groups
        # (quantization/auto_awq.py, gptq: "The input size is not aligned with the quantized
        # weight shape. This can be caused by too large tensor parallel size.").
        inputs = {
            "the MLP's": spec.moe_intermediate_size if spec.is_moe else spec.intermediate_size,
            "attention's": spec.num_attention_heads * spec.head_dim,
        }
        for what, size in inputs.items():
            if size and (size // tp) % group:
                return (
                    f"tensor parallel {tp} splits {what} {size} inputs into slices that are not "
                    f"whole groups of {group} quantized weights"
                )
    return None


def executor_backend(world_size: int, gpus_per_node: int) -> ExecutorBackend | None:
    """``ray`` when a replica spans nodes, else None (vLLM's multiprocessing default)."""
    return "ray" if world_size > gpus_per_node else None
