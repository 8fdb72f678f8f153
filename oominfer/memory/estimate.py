"""The memory model: (model, hardware, settings) -> a per-GPU breakdown. All numbers in bytes.

vLLM V1 (vllm/v1/worker/gpu_worker.py ``determine_available_memory``, 0.32)::

    budget       = cuda_total * gpu_memory_utilization
    non_kv       = weights/tp + non_torch + activation_peak + cuda_graphs
    kv_cache     = budget - non_kv            (or --kv-cache-memory-bytes when given)
    num_blocks   = kv_cache // page_bytes_per_layer // layers
    kv_tokens    = num_blocks * block_size

and the engine refuses to start when one request at max_model_len needs more blocks than
there are. Every constant below is derived from vLLM's source or fitted to the points in
shared/calibration (``bench/calibration.py`` prints the fit).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GiB
from oominfer.hardware.hardware import Hardware
from oominfer.memory.additions import (
    Additions,
    Draft,
    check_additions,
    draft,
    encoder_forward_bytes,
    encoder_items,
    expert_share,
    expert_slices,
    item_rows,
    lora_cpu_cache_bytes,
    lora_slot_bytes,
    multimodal_bytes,
    padded_rows,
    profiled_item,
    state_blocks,
    tower_built,
    vision_tower_bytes,
)
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.dtypes import dtype_bytes, kv_dtype_bytes
from oominfer.memory.kv import (
    indexer_key_bytes,
    kv_bytes_per_token_layer,
    kv_layout,
    longest,
)
from oominfer.memory.profile import (
    CPU_RUNTIME_BYTES,
    activation_bytes,
    cuda_graph_bytes,
    graph_estimate_excess,
    non_torch_bytes,
    post_capture_short,
    sampler_bytes,
    startup_free_bytes,
    vllm_defaults,
)
from oominfer.memory.transformers import transformers_breakdown, unquantized_expert_bytes
from oominfer.memory.weights import (
    marlin_fp8_scale_bytes,
    mla_dequantized_bytes,
    mxfp4_expert_ratio,
    on_gpu_rounding,
    pp_layer_ranges,
    resolve_dtype,
    rope_cache_bytes,
    stage_expert_bytes,
    stage_replicated_bytes,
    stage_weights,
    weight_rounding_bytes,
)
from oominfer.model.spec import ATTENTION_KINDS, STATE_KINDS, ModelSpec
from oominfer.rules import kv_cache as kv_cache_rules
from oominfer.rules import quantization as quantization_rules
from oominfer.rules import speculative as speculative_rules
from oominfer.rules.attention import (
    block_size,
    max_capture_size,
    pinned_capture_size,
    spec_decode_full_graphs,
    state_blocks_per_request,
    triton_mla_workspace_bytes,
)
from oominfer.rules.dtypes import allowed_dtypes
from oominfer.rules.parallel import tensor_parallel_refusal
from oominfer.rules.versions import EngineVersion
from oominfer.settings import Engine, EngineSettings, flag


def resolved_kv_cache_dtype(
    spec: ModelSpec, s: EngineSettings, version: EngineVersion, engine: Engine
) -> str:
    """The KV cache's dtype vLLM runs: the one asked for, except that ``auto``
    takes a ModelOpt checkpoint's FP8 cache from 0.14 (``EngineVersion.checkpoint_kv_cache``)
    where the checkpoint's own quantization is served."""
    fmt = spec.quantization
    if (
        s.kv_cache_dtype == "auto"
        and engine == "vllm"
        and version.checkpoint_kv_cache
        and fmt is not None
        and fmt.kv_cache_fp8
        and s.quantization in (None, fmt.method)
    ):
        return "fp8"
    return s.kv_cache_dtype


def estimate(
    spec: ModelSpec,
    *,
    hardware: Hardware,
    settings: EngineSettings,
    engine: Engine = "vllm",
    version: EngineVersion,
    measured_offset_bytes: int = 0,
) -> MemoryBreakdown:
    """Memory needed to serve ``spec`` on ``hardware`` with ``settings``, per GPU.

    Args:
        spec: the model.
        hardware: the GPU kind and count; ``device="cpu"`` for vLLM's CPU backend (KV cache
            sized by kv_cache_memory_bytes, 128-token blocks, no graphs).
        settings: the engine settings; None fields take the engine's defaults.
        engine: ``vllm`` (paged KV cache, profiling run, CUDA graphs) or ``transformers``
            (dynamic KV cache per sequence, no graphs).
        version: the vLLM release whose behaviour to model (calibration replays old logs).
        measured_offset_bytes: memory besides the KV cache an engine held on this same setup
            beyond the model's (negative: less; verify/memory_store.py), counted with the
            non-torch memory.

    Raises:
        InvalidSettingError: settings that cannot work with this model or hardware.
    """
    s = settings
    device = hardware.device
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    _check_parallel(spec, s, hardware)
    check_additions(spec, s, engine)
    gpu = hardware.gpu
    dtype = resolve_dtype(spec, gpu, s.dtype)
    elem = dtype_bytes(dtype)
    refused = kv_cache_rules.refusal(
        s.kv_cache_dtype, gpu=gpu, model_dtype=dtype, device=device, version=version
    )
    if refused:
        raise InvalidSettingError(f"{refused}.", hint=f"Use {flag('kv_cache_dtype')} auto.")
    method = s.quantization or (spec.quantization.method if spec.quantization else None)
    if method is not None and engine == "vllm":
        quant_refused = quantization_rules.refusal_and_hint(
            method, gpu=gpu, dtype=dtype, engine=engine, device=device,
            release=version.release, runnable=allowed_dtypes(spec, gpu),
        )  # fmt: skip
        if quant_refused:
            why, hint = quant_refused
            raise InvalidSettingError(f"vLLM cannot load {spec.model_id} here: {why}.", hint=hint)
    kv_elem = kv_dtype_bytes(resolved_kv_cache_dtype(spec, s, version, engine), dtype)
    max_len = spec.context(s.max_model_len)
    default_tokens, default_seqs = vllm_defaults(
        hardware, world_size=s.model_world_size, version=version
    )
    seqs = s.max_num_seqs or default_seqs
    batched = s.max_num_batched_tokens or min(default_tokens, seqs * max_len)
    if not version.always_chunked_prefill and max_len <= 32768:
        batched = max(batched, max_len)
    offload = int(s.cpu_offload_gb * GiB)
    stages = stage_weights(
        spec, dtype=dtype, quantization=s.quantization, pp=pp, tower=tower_built(spec, s)
    )
    replicated = stage_replicated_bytes(spec, dtype=dtype, quantization=s.quantization, pp=pp)
    ranges = pp_layer_ranges(spec.num_layers, pp)
    plain_fp8 = gpu.compute_capability[0] == 10 and version.blackwell_sparse_mla_fp8
    per_layer = kv_bytes_per_token_layer(
        spec, kv_bytes=kv_elem, tp=tp, version=version, plain_fp8_latent=plain_fp8
    )
    per_full_layer = kv_bytes_per_token_layer(
        spec, kv_bytes=kv_elem, tp=tp, version=version, full=True, plain_fp8_latent=plain_fp8
    )

    shared_indexer = set(spec.indexer_shared_layers)
    indexer_key = indexer_key_bytes(spec)

    def kv_per_token(layers: Sequence[int]) -> int:
        """Bytes a token takes in the attention layers among ``layers`` (less the indexer
        key of those that reuse an earlier layer's indexer)."""
        kinds = spec.layer_kinds
        return sum(
            (per_full_layer if kinds[i] == "full" else per_layer)
            - (indexer_key if i in shared_indexer else 0)
            for i in layers
            if kinds[i] in ATTENTION_KINDS
        )

    state_dtype = dtype_bytes(spec.state_dtype) if spec.state_dtype else elem
    state_layer = spec.state_elements_per_layer * state_dtype // tp
    budget = math.ceil(gpu.cuda_total_bytes * s.gpu_memory_utilization)
    if engine == "transformers":
        kept = 0
        if device == "cuda":  # transformers keeps each projection as its own tensor
            (whole,) = weight_rounding_bytes(
                spec, dtype=dtype, quantization=s.quantization, tp=tp, fused=False
            )
            kept = on_gpu_rounding(whole, sum(stages) // tp, offload)
        return transformers_breakdown(
            spec,
            dtype=dtype,
            budget=budget,
            total=gpu.cuda_total_bytes,
            weights=max(0, sum(stages) // tp - offload)
            + unquantized_expert_bytes(spec, dtype=dtype, quantization=s.quantization) // tp
            + kept,
            per_token=kv_per_token(range(spec.num_layers)),
            state_per_seq=state_layer * spec.state_layers,
            seqs=seqs,
            max_len=max_len,
            elem=elem,
            tp=tp,
            device=device,
        )
    _check_lora_with_drafts(s, seqs=seqs, batched=batched)
    startup_short = 0
    if device == "cuda" and version.v1:
        startup_short = max(0, budget - startup_free_bytes(gpu, tp, version))
    items = encoder_items(spec, s, tokens=batched, seqs=seqs, max_len=max_len, version=version)
    modality, per_item = profiled_item(spec, s, max_len=max_len, version=version)
    rows = item_rows(spec, modality, per_item)
    proposer, extra = _additions(
        spec, s, dtype=dtype, kv_elem=kv_elem, batched=batched, items=items, version=version,
        modality=modality, per_item=per_item, rows=rows,
    )  # fmt: skip
    activation = activation_bytes(
        spec,
        tokens=batched,
        seqs=seqs,
        dtype_size=elem,
        tp=tp,
        version=version,
        # Each rank's fused-MoE buffers span whole experts under expert parallelism
        # (memory/additions.py ``expert_share``), a tensor-parallel slice otherwise.
        expert_slices=1 if s.enable_expert_parallel else tp,
        speculative=bool(s.speculative),
    )
    # The vision tower's forward over the dummy images runs first; its output, the encoder
    # cache, then stays alive through the text forward and the sampler: the peak is the
    # larger of the tower's and (cache + the text model's).
    tower = encoder_forward_bytes(spec, dtype=dtype, items=items, per_item=rows, tp=tp)
    activation = max(activation, tower - extra.multimodal_bytes)
    if device == "cuda" and version.sampler_warmup_pass:
        # 0.33's second dummy sampler pass copies the logits to fp32 (at least that much).
        activation += min(batched, seqs) * spec.vocab_size * 4
    if device == "cuda" and version.mla_workspace_in_profile:
        activation += triton_mla_workspace_bytes(
            spec, gpu, max_num_seqs=seqs, max_model_len=max_len, tp=tp
        )
    non_torch = CPU_RUNTIME_BYTES if device == "cpu" else non_torch_bytes(gpu, tp)
    non_torch += measured_offset_bytes
    # Each pipeline stage profiles and sizes its own cache; vLLM then gives every stage the
    # smallest block count among them (v1/core/kv_cache_utils.py get_kv_cache_configs), so
    # the stage with the fewest blocks decides.
    largest, pinned = max_capture_size(gpu, spec), pinned_capture_size(spec)
    decode_query_len = 1 + speculative_rules.drafted_tokens(spec, s.speculative)
    full_graphs = spec_decode_full_graphs(
        spec, gpu, version, kv_cache_dtype=s.kv_cache_dtype, decode_query_len=decode_query_len
    )

    def graphs_of(layers: int, recurrent: bool = False) -> int:
        """CUDA-graph memory of ``layers`` captured at this plan's sizes (none when eager);
        a draft's graphs are captured at the same sizes as the target's."""
        if device != "cuda" or s.enforce_eager:
            return 0
        return cuda_graph_bytes(
            layers=layers,
            gpu=gpu,
            tp=tp,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            largest=largest,
            version=version,
            recurrent=recurrent,
            decode_query_len=decode_query_len,
            full_graphs=full_graphs,
            pinned=pinned,
            quantized=method is not None,
        )

    if proposer is not None and full_graphs:
        # Where FULL graphs fall back to PIECEWISE, the draft runs eager (vLLM issue #54992).
        extra = dataclasses.replace(extra, speculative_graph_bytes=graphs_of(proposer.layers))
    expert_stages = stage_expert_bytes(spec, dtype=dtype, quantization=s.quantization, pp=pp)
    rounding = [0] * pp
    if device == "cuda":
        # MXFP4 MoE kernels hold the experts padded (memory/weights.py mxfp4_expert_ratio).
        ratio = mxfp4_expert_ratio(spec, gpu=gpu, version=version, expert_slices=expert_slices(s))
        grown = [int(e * (ratio - 1)) for e in expert_stages]
        stages = [w + g for w, g in zip(stages, grown, strict=True)]
        expert_stages = [e + g for e, g in zip(expert_stages, grown, strict=True)]
        # Marlin's widened FP8 block scales below compute capability 8.9.
        scales, expert_scales = (
            marlin_fp8_scale_bytes(spec, gpu=gpu, quantization=s.quantization, pp=pp, experts=e)
            for e in (False, True)
        )
        stages = [w + g for w, g in zip(stages, scales, strict=True)]
        expert_stages = [e + g for e, g in zip(expert_stages, expert_scales, strict=True)]
        # The caching allocator's rounding of each large weight tensor, on each GPU.
        rounding = weight_rounding_bytes(
            spec, dtype=dtype, quantization=s.quantization, tp=tp, pp=pp, fused=True
        )
    block = block_size(spec, gpu, device=device, kv_cache_dtype=s.kv_cache_dtype)
    blocks_of_state = state_blocks(
        state_blocks_per_request(spec, gpu, version), s, drafted=decode_query_len - 1
    )
    seen: dict[tuple[int, tuple[str, ...]], MemoryBreakdown] = {}
    rope = rope_cache_bytes(spec, dtype=dtype)  # whole on every GPU of every stage
    for index, (stage_bytes, layers) in enumerate(zip(stages, ranges, strict=True)):
        kinds = tuple(spec.layer_kinds[i] for i in layers)
        key = (stage_bytes, kinds)
        if key in seen:
            continue
        graphs = graphs_of(len(layers), recurrent=spec.state_layers > 0)
        experts, per_gpu = expert_share(spec, s, expert_stages[index])
        if s.data_parallel_size > 1 or s.enable_expert_parallel:
            stage_bytes = (stage_bytes - expert_stages[index]) + experts * tp
        weights = max(0, stage_bytes // tp - offload) + rope
        weights += replicated[index] * (tp - 1) // tp  # whole on every rank, not split
        weights += mla_dequantized_bytes(
            spec, dtype=dtype, quantization=s.quantization, tp=tp, layers=len(layers)
        )
        weights += on_gpu_rounding(rounding[index], stage_bytes // tp, offload)
        added = dataclasses.replace(extra, expert_weights_bytes=experts, experts_per_gpu=per_gpu)
        in_budget_extra = added.non_kv_bytes - (
            0 if version.graphs_in_budget else added.speculative_graph_bytes
        )
        overcommitted = 0
        after_capture = 0
        stage_activation = activation
        if s.kv_cache_memory_bytes is not None:
            kv_cache = s.kv_cache_memory_bytes
            if device == "cuda":  # vLLM does not check it (v1/worker/gpu_worker.py)
                rest = weights + activation + non_torch + graphs + added.non_kv_bytes
                overcommitted = rest + kv_cache - gpu.cuda_total_bytes
        else:
            in_budget = graphs if version.graphs_in_budget else 0
            # 0.20+ reserves its graph estimate, a little above the pool: the excess is
            # counted with the profiling peak, as vLLM prints it.
            stage_activation += graph_estimate_excess(graphs, version)
            kv_cache = budget - weights - stage_activation - non_torch - in_budget - in_budget_extra
            if device == "cuda":
                after_capture = post_capture_short(
                    total=gpu.cuda_total_bytes,
                    budget=budget,
                    # The profiling run frees its peak and the encoder cache it filled
                    # (gpu_model_runner.py ``profile_run``: ``encoder_cache.clear()``).
                    activation=activation + added.multimodal_bytes,
                    graphs=graphs,
                    sampler=sampler_bytes(
                        spec,
                        tokens=batched,
                        seqs=seqs,
                        dtype_size=elem,
                        version=version,
                        speculative=bool(s.speculative),
                    ),
                    version=version,
                )
        layout = kv_layout(
            spec,
            kinds,
            per_token_layer=per_layer,
            state_bytes_layer=state_layer,
            block=block,
            in_flight=version.in_flight_tokens(batched, pp),
            state_blocks=max(blocks_of_state, 1),
            full_token_layer=per_full_layer,
        )
        if layout is not None and added.speculative_kv_bytes_per_token:
            # The draft's layers page into the same pool: every block holds them too.
            layout = dataclasses.replace(
                layout,
                bytes_per_block=layout.bytes_per_block
                + added.speculative_kv_bytes_per_token * layout.block_size,
            )
        num_blocks = kv_cache // layout.bytes_per_block if layout and kv_cache > 0 else 0
        # Block 0 is the pool's null block (vllm/v1/core/block_pool.py): a request can use
        # num_blocks - 1 (measured: 512 blocks of 128 tokens admit 65,408 tokens, not 65,536).
        usable = num_blocks - 1 if version.v1 else num_blocks
        fits_len = 0
        concurrency = 0.0
        tokens = 0
        if layout is not None and num_blocks > 0:
            fits_len = longest(
                layout.blocks_per_request, usable, spec.max_position_embeddings, layout.block_size
            )
            # vLLM logs "KV cache size: int(num_blocks / blocks_per_request * L) tokens".
            concurrency = num_blocks / layout.blocks_per_request(max_len)
            tokens = int(concurrency * max_len)
        seen[key] = MemoryBreakdown(
            engine="vllm",
            dtype=dtype,
            total_bytes=gpu.cuda_total_bytes,
            budget_bytes=budget,
            weights_bytes=weights,
            activation_bytes=stage_activation,
            non_torch_bytes=non_torch,
            cuda_graph_bytes=graphs,
            kv_cache_bytes=kv_cache,
            kv_bytes_per_token=kv_per_token(layers) + added.speculative_kv_bytes_per_token,
            state_bytes_per_seq=state_layer * sum(1 for k in kinds if k in STATE_KINDS),
            block_size=layout.block_size if layout else 0,
            kv_cache_tokens=tokens,
            max_model_len=max_len,
            max_model_len_that_fits=fits_len,
            max_concurrency=round(concurrency, 2),
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            kv_block_bytes=layout.bytes_per_block if layout else 0,
            blocks_per_request=layout.blocks_per_request(max_len) if layout else 0,
            usable_blocks=max(usable, 0),
            overcommitted_bytes=max(0, overcommitted),
            post_capture_short_bytes=after_capture,
            startup_short_bytes=startup_short,
            pipeline_stage=index,
            layout=layout,
            additions=added,
        )
    return min(seen.values(), key=lambda b: (b.usable_blocks, b.kv_cache_bytes))


def _additions(
    spec: ModelSpec,
    s: EngineSettings,
    *,
    dtype: str,
    kv_elem: int,
    batched: int,
    items: int,
    version: EngineVersion,
    modality: str,
    per_item: int,
    rows: int,
) -> tuple[Draft | None, Additions]:
    """The operator additions that do not depend on the pipeline stage (memory/additions.py);
    the draft's graphs and the expert split are filled in per stage."""
    refused = speculative_rules.refusal(spec, s.speculative)
    if refused:
        raise InvalidSettingError(
            f"vLLM refuses {flag('speculative_config')} for {spec.model_id}: {refused}."
        )
    tp = s.tensor_parallel_size
    proposer = draft(
        spec, s.speculative, dtype=dtype, kv_bytes=kv_elem, tp=tp,
        quantization=s.quantization, version=version,
    )  # fmt: skip
    return proposer, Additions(
        speculative_method=speculative_rules.speculative_method(spec, s.speculative),
        speculative_weights_bytes=proposer.weights_bytes // tp if proposer else 0,
        speculative_kv_bytes_per_token=(
            proposer.layers * proposer.kv_bytes_per_token_layer if proposer else 0
        ),
        lora_bytes=lora_slot_bytes(spec, s, dtype=dtype, tokens=batched),
        lora_cpu_cache_bytes=lora_cpu_cache_bytes(spec, s, dtype=dtype),
        multimodal_bytes=multimodal_bytes(
            spec,
            dtype=dtype,
            items=items,
            per_item=rows,
            padded_to=padded_rows(version, tokens=batched, per_item=per_item),
        ),
        encoder_items=items,
        encoder_modality=modality,
        vision_tower_bytes=vision_tower_bytes(spec, s, dtype=dtype),
        data_parallel_size=s.data_parallel_size,
        prefix_caching=s.enable_prefix_caching,
    )


def _check_lora_with_drafts(s: EngineSettings, *, seqs: int, batched: int) -> None:
    """vLLM refuses LoRA with speculative decoding when a step cannot hold every sequence's
    drafted tokens (engine/arg_utils.py ``create_engine_config``: max_num_batched_tokens <
    max_num_seqs x (num_speculative_tokens + 1))."""
    drafted = s.speculative.get("num_speculative_tokens")
    if not s.enable_lora or not isinstance(drafted, int):
        return
    need = seqs * (drafted + 1)
    if batched < need:
        raise InvalidSettingError(
            f"vLLM refuses LoRA with {drafted} speculative tokens when "
            f"{flag('max_num_batched_tokens')} {batched} is below {flag('max_num_seqs')} "
            f"{seqs} x {drafted + 1} = {need}.",
            hint=f"Use {flag('max_num_batched_tokens')} {need} or a lower {flag('max_num_seqs')}.",
        )


def _check_parallel(spec: ModelSpec, s: EngineSettings, hardware: Hardware) -> None:
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    if s.world_size > hardware.count:
        raise InvalidSettingError(
            f"tensor_parallel_size x pipeline_parallel_size x data_parallel_size = "
            f"{s.world_size} needs {s.world_size} GPUs, but --gpus is {hardware.count}.",
            hint=f"Pass --gpus {s.world_size} or lower the parallel sizes.",
        )
    refused = tensor_parallel_refusal(spec, tp)
    if refused:
        valid = [n for n in (1, 2, 4, 8, 16) if tensor_parallel_refusal(spec, n) is None]
        raise InvalidSettingError(
            f"vLLM refuses --tensor-parallel-size {tp} for {spec.model_id}: {refused}.",
            hint=f"Use --tensor-parallel-size {' or '.join(map(str, valid))}.",
        )
    if pp > spec.num_layers:
        raise InvalidSettingError(
            f"--pipeline-parallel-size {pp} exceeds the model's {spec.num_layers} layers."
        )
