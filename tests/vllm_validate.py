"""vLLM's own validation of oominfer's plans, without a GPU.

For each plan, the argv oominfer would launch (``engines.vllm.serve_argv``) goes through
what ``python -m vllm.entrypoints.openai.api_server`` does before it touches a GPU:

1. vLLM's OpenAI-server argument parser and ``validate_parsed_serve_args``;
2. ``AsyncEngineArgs.create_engine_config``: ModelConfig, CacheConfig, ParallelConfig,
   SchedulerConfig, the quantization config (with its minimum capability), the CUDA
   platform's ``check_and_update_config``; then the GPU worker's dtype check;
3. the model built as the GPU worker's loader builds it (``initialize_model``), on the meta
   device, as rank 0 of the plan's tensor- and pipeline-parallel groups: the layers' own
   checks run (KV heads and vocabulary per rank, quantized shapes and kernels per capability,
   the attention backend).

It runs in a fresh interpreter where ``vllm.platforms.current_platform`` is a CUDA platform
with the plan's compute capability, GPU count per node, memory and name. The model folder
holds the catalog's config.json (and a stub tokenizer); nothing reaches the Hub.

Two halves:

- the parent (``validate``) runs in the test process: it plans with oominfer's public API
  and hands each compute-capability class's plans to the worker as soon as they are planned;
- the worker (``python tests/vllm_validate.py OUT JOBS``, group files named on stdin) imports
  only the standard library and vLLM, so it runs under any venv that has a vLLM. It imports
  vLLM once and forks one child per class (nothing may read the capability while importing:
  checked).

What is patched to make a CPU machine look like a CUDA host, each for a reason:

- CUDA-only extensions imported at module level (``vllm._C_stable_libtorch`` by
  platforms/cuda.py, ``vllm.vllm_flash_attn`` by v1/attention/backends/fa_utils.py) and the
  CUDA kernels layers look up in ``__init__`` (``torch.ops._C.*``): stand-ins that raise
  when called; ``torch.cuda.Stream``/``Event`` (MoE's shared-expert overlap): inert objects.
- ``vllm._custom_ops.cutlass_scaled_mm_supports_*``: the CUTLASS capability queries,
  answered as csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu answers them.
- ``vllm.platforms._current_platform``: a ``CudaPlatformBase`` subclass reporting the plan's
  GPU instead of asking NVML.
- Triton: the placeholder vLLM uses without a driver stays (nothing is compiled), with a
  ``Config`` that keeps its arguments; ``vllm.config.vllm.HAS_TRITON`` is True as on a GPU
  host (it picks the V2 model runner).
- torchvision (imported by transformers' image processors; the PyPI build is CUDA's and
  cannot load beside the CPU torch): stub modules.
- ``registry._run_in_subprocess`` runs in-process (a child interpreter would see the CPU
  platform and cost seconds per architecture); ``repo_utils`` retries do not sleep.
- Model construction: every tensor on the meta device, explicit ``cuda`` ones included; the
  custom ops' ``torch.compile`` wrapping and the weight-reload bookkeeping are skipped.

An error that comes from one of these stand-ins, from FlashInfer missing here (vLLM's CUDA
install brings it, and the attention backend chosen without it differs), or from Ray missing
(vLLM's image carries it; ``--distributed-executor-backend ray`` needs it importable) is
"inconclusive", not a rejection.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

# ---- the worker: standard library and vLLM only ----------------------------------------


def _stub_cuda_extensions() -> None:
    def unavailable(*args: object, **kwargs: object) -> Any:
        raise RuntimeError("CUDA kernels are not available in validation")

    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    flash = types.ModuleType("vllm.vllm_flash_attn")
    for name in (
        "compile_flash_attn_varlen_func_from_specs",
        "flash_attn_varlen_func",
        "get_scheduler_metadata",
        "fa_version_unsupported_reason",
        "is_fa_version_supported",
    ):
        setattr(flash, name, unavailable)
    sys.modules.setdefault("vllm.vllm_flash_attn", flash)


class _Anything:
    """Stands for any torchvision object at import time (a default argument, a base class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return self

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _TorchvisionStub:
    """A meta-path finder that answers ``import torchvision...`` with stub modules.

    The multimodal model modules import transformers' image processors, which import
    torchvision at module level; the PyPI torchvision is a CUDA build that cannot load beside
    the CPU torch. Nothing of it runs while configs are validated."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> Any:
        if name != "torchvision" and not name.startswith("torchvision."):
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _stub_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
    except Exception:  # missing, or a CUDA build that fails beside the CPU torch
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStub())


class _MissingKernel:
    """A CUDA kernel this build lacks: fine to name (``torch.ops._C.x.default``), an error
    to call."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(f"the CUDA kernel {self.name} is not available in validation")

    def __getattr__(self, name: str) -> _MissingKernel:
        return self


class _CudaObject:
    """A CUDA stream or event that layers create in ``__init__`` and use only when running."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


class _KernelNamespace:
    """``torch.ops._C`` and its kin, where layers look their CUDA kernels up in ``__init__``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._real, name)
        except (AttributeError, RuntimeError):
            return _MissingKernel(name)


def _stand_in_kernels() -> None:
    import torch

    for namespace in ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_vllm_fa2_C"):
        torch.ops.__dict__[namespace] = _KernelNamespace(getattr(torch.ops, namespace))


def _present_triton() -> None:
    """Triton as on a GPU host, where vLLM finds it working (it then defaults to the V2 model
    runner, vllm/config/vllm.py). Nothing is compiled here, so the placeholder module vLLM
    uses without a driver stays, with a ``Config`` that keeps its arguments (modules build
    autotune lists at import, e.g. mamba/ops/ssd_chunk_scan.py)."""
    from vllm.triton_utils import HAS_TRITON, triton

    if not HAS_TRITON:

        def config(kwargs: Any = None, num_warps: int = 4, num_stages: int = 3, **kw: Any) -> Any:
            return types.SimpleNamespace(
                kwargs=kwargs or {}, num_warps=num_warps, num_stages=num_stages, **kw
            )

        triton.Config = config
    import vllm.config.vllm as vllm_config

    vllm_config.HAS_TRITON = True


class _Gpu(dict[str, Any]):
    """What the validation platform answers, set per plan. Reading the capability before it is
    set (while vLLM is imported, before the worker forks one child per capability) is
    recorded: such a value would be shared by every class."""

    early_reads: int = 0

    def capability(self) -> tuple[int, int]:
        if "capability" not in self:
            _Gpu.early_reads += 1
            raise RuntimeError("the compute capability was read while vLLM was imported")
        major, minor = self["capability"]
        return int(major), int(minor)


def _install_platform(gpu: _Gpu) -> None:
    """Make ``current_platform`` a CUDA platform that answers from ``gpu`` (before any vLLM
    module binds it)."""
    _stub_cuda_extensions()
    _stub_torchvision()
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    class ValidationGpu(CudaPlatformBase):  # type: ignore[misc]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            major, minor = gpu.capability()
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return str(gpu["device_name"])

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return int(gpu["memory_bytes"])

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return False

        @classmethod
        def device_count(cls) -> int:
            return int(gpu["count"])

        @classmethod
        def get_device_uuid(cls, device_id: int = 0) -> str:
            return f"GPU-validation-{device_id}"

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return 132  # SMs: sizes kernels' workspaces only

        @classmethod
        def current_device(cls) -> int:
            return 0

    platforms._current_platform = ValidationGpu()
    _present_triton()

    import vllm._custom_ops as ops

    ops.cutlass_scaled_mm_supports_fp8 = lambda c: c >= 89
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda c: c >= 90
    ops.cutlass_group_gemm_supported = lambda c: c in (90, 100)

    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()
    _stand_in_kernels()
    import torch

    torch.cuda.Stream = torch.cuda.Event = _CudaObject  # MoE's shared-expert overlap
    import vllm.transformers_utils.repo_utils as repo_utils

    # Retries wait for the Hub to come back (2 s, then 4 s); offline, a config's error stands.
    repo_utils.time = types.SimpleNamespace(sleep=lambda seconds: None)


_CLI_ARGS = (
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.common.cli_args",  # 0.33
    "vllm.entrypoints.openai.cli_args",  # before
)
"""Where the OpenAI server's ``make_arg_parser`` and ``validate_parsed_serve_args`` live."""


def _cli_args() -> Any:
    import importlib

    for name in _CLI_ARGS:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"none of {_CLI_ARGS} in this vLLM")


def _serve_parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return _cli_args().make_arg_parser(FlexibleArgumentParser(description="validation"))


def _validate_serve_args(args: Any) -> None:
    _cli_args().validate_parsed_serve_args(args)


def _message(exc: BaseException) -> str:
    """vLLM's own words: a pydantic error's inner ``Value error, ...`` text, else str()."""
    text = str(exc)
    m = re.search(r"Value error, (.*?)(?: \[type=|$)", text, re.S)
    if m:
        text = m.group(1)
    return f"{type(exc).__name__}: {' '.join(text.split())}"[:600]


def _group(size: int) -> Any:
    """Rank 0 of a process group of ``size`` ranks, as the layers ask it."""
    torch_group = types.SimpleNamespace(size=lambda: size, rank=lambda: 0)
    return types.SimpleNamespace(world_size=size, rank_in_group=0, rank=0, local_rank=0,
                                 ranks=list(range(size)), first_rank=0, last_rank=size - 1,
                                 is_first_rank=True, is_last_rank=size == 1, next_rank=1 % size,
                                 prev_rank=size - 1, device_group=torch_group,
                                 cpu_group=torch_group, use_device_communicator=False)  # fmt: skip


def _on_meta() -> Any:
    """A torch function mode that puts every tensor on the meta device, those a layer asks
    for on ``cuda`` explicitly too (workspaces, GDN buffers): no memory, no CUDA."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    meta = torch.device("meta")
    constructors = _device_constructors()

    class OnMeta(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if func in constructors or "device" in kwargs:
                kwargs = {**kwargs, "device": meta}
            elif func in (torch.Tensor.to, torch.Tensor.cuda):
                args = tuple(meta if _is_device(a) else a for a in args)
                if func is torch.Tensor.cuda:
                    return args[0].to(meta)
            return func(*args, **kwargs)

    return OnMeta()


def _is_device(value: Any) -> bool:
    import torch

    return isinstance(value, torch.device) or (
        isinstance(value, str) and value.split(":")[0] in ("cuda", "cpu", "meta")
    )


def _skip_runtime_preparation() -> None:
    """Two steps of model construction that only prepare running it, and cost most of its
    time here: compiling custom ops' forward (custom_op.py ``maybe_compile``) and recording
    the parameters' metadata for weight reloading (model_loader/reload/layerwise.py)."""
    import vllm.model_executor.model_loader.utils as loader_utils
    from vllm.model_executor.custom_op import CustomOp

    CustomOp.maybe_compile = lambda self, fn, *, enable=True: fn
    loader_utils.record_metadata_for_reloading = lambda model: None


def _build_model(config: Any) -> None:
    """Construct the model as the GPU worker's loader does (model_loader/base_loader.py
    ``load_model``: the model's dtype, ``initialize_model``), on the meta device, as rank 0 of
    the plan's tensor- and pipeline-parallel groups: the layers' own divisibility and
    quantization checks run (KV heads per rank, vocabulary per rank, quantized shapes)."""
    import vllm.distributed.parallel_state as state
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    _skip_runtime_preparation()
    parallel = config.parallel_config
    sizes = {"_TP": parallel.tensor_parallel_size, "_PP": parallel.pipeline_parallel_size,
             "_EP": parallel.tensor_parallel_size}  # fmt: skip
    names = [n for n, v in vars(state).items() if n.isupper() and n.startswith("_")
             and n != "_WORLD" and (v is None or n in sizes)]  # fmt: skip
    saved = {name: getattr(state, name) for name in names}
    try:
        for name in names:
            setattr(state, name, _group(sizes.get(name, 1)))
        with (
            set_current_vllm_config(config),
            set_default_torch_dtype(config.model_config.dtype),
            _on_meta(),
        ):
            initialize_model(vllm_config=config)
    finally:
        for name, value in saved.items():
            setattr(state, name, value)


def _where(exc: BaseException) -> str:
    """The innermost vLLM source line of a traceback (an ``assert`` has no message)."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    path = frame.filename.split("/vllm/", 1)[1]
    return f" [vllm/{path}:{frame.lineno}: {(frame.line or '').strip()}]"


INCONCLUSIVE = "inconclusive: "
"""The prefix of a verdict that this machine cannot reach (not a rejection by vLLM)."""

_HARNESS_LIMITS = (
    "not available in validation",  # the CUDA kernels and extensions stood in for
    "Torch not compiled with CUDA",
    "requires CUDA support",
    "preprocessor_config.json",  # a processor's files beside config.json
    # Expert parallel's expert map (fused_moe/expert_map_manager.py) reads its values:
    # data-dependent, so the meta device the model is built on cannot answer.
    "register_meta function for torch.nonzero",
    "cannot be called on meta tensors",
)


def _inconclusive(exc: BaseException) -> str | None:
    """Why an error during model construction says nothing about the plan, if it does not."""
    import traceback

    text = f"{exc}"
    for limit in _HARNESS_LIMITS:
        if limit in text:
            return f"a part of a GPU host this machine lacks ({limit})"
    files = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    if "Failed to import Ray" in text or any("/executor/ray" in f for f in files):
        return "Ray, which vLLM's image carries for plans across nodes, is not installed here"
    attention = any("/v1/attention/" in f for f in files)
    if attention:
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            return "FlashInfer, which vLLM's CUDA install brings, is missing here, so the " \
                "attention backend chosen is not the one a GPU host would use"  # fmt: skip
    return None


_BUILT: dict[tuple[Any, ...], str | None] = {}
"""Model constructions already done in this process: what vLLM said, by what shapes them."""


def _built(config: Any) -> str | None:
    """None when the model builds, else why not (construction is shared between plans that
    differ only in scheduler and memory settings)."""
    model, cache, parallel = config.model_config, config.cache_config, config.parallel_config
    key = (model.model, str(model.dtype), model.quantization, cache.cache_dtype,
           parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
           getattr(config, "offload_config", None) and str(config.offload_config))  # fmt: skip
    if key not in _BUILT:
        try:
            _build_model(config)
            _BUILT[key] = None
        except Exception as exc:
            why = _inconclusive(exc)
            where = _message(exc) + _where(exc)
            _BUILT[key] = f"{INCONCLUSIVE}{why}: {where}" if why else f"building the model: {where}"
    return _BUILT[key]


def _check_one(parser: Any, argv: list[str]) -> str | None:
    """None when vLLM accepts the argv, else its error (on the platform as it stands)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return "argparse: " + (lines[-1] if lines else "rejected the command line")
    try:
        _validate_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        # The GPU worker's first check (v1/worker/gpu_worker.py init_device).
        current_platform.check_if_supports_dtype(config.model_config.dtype)
    except Exception as exc:  # vLLM raises ValueError, ValidationError, AssertionError...
        why = _inconclusive(exc)
        return f"{INCONCLUSIVE}{why}: {_message(exc)}" if why else _message(exc)
    return _built(config)


def _validate_group(gpu: _Gpu, parser: Any, group: dict[str, Any]) -> dict[str, Any]:
    start = time.monotonic()
    verdicts = {}
    for plan in group["plans"]:
        gpu.clear()
        gpu.update(plan["gpu"], capability=group["capability"])
        verdicts[plan["key"]] = _check_one(parser, list(plan["argv"]))
    return {"verdicts": verdicts, "seconds": round(time.monotonic() - start, 1)}


def worker(out: Path, groups: Iterable[Path], jobs: int) -> None:
    """Import vLLM once, then fork one child per group file (a compute capability and its
    plans) as the files are named, ``jobs`` at a time; each child writes its verdicts
    ({key: vLLM's error, or None}) next to its group file."""
    start = time.monotonic()
    gpu = _Gpu()
    _install_platform(gpu)
    import vllm

    parser = _serve_parser()
    if _Gpu.early_reads:
        raise RuntimeError("vLLM read the compute capability at import: one process per class")
    imported = time.monotonic() - start
    children: set[int] = set()
    failed = []
    for path in groups:
        while len(children) >= jobs:
            pid, status = os.wait()
            children.discard(pid)
            failed += [pid] if status else []
        pid = os.fork()
        if pid == 0:  # the child: validate this group, never return into the loop
            code = 1
            try:
                group = json.loads(path.read_text())
                result = _validate_group(gpu, parser, group)
                (out / f"{path.stem}.verdicts.json").write_text(json.dumps(result))
                code = 0
            finally:
                os._exit(code)
        children.add(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed += [pid] if status else []
    summary = {
        "vllm_version": vllm.__version__,
        "import_seconds": round(imported, 1),
        "seconds": round(time.monotonic() - start, 1),
        "failed_children": len(failed),
    }
    (out / "worker.json").write_text(json.dumps(summary))


def _worker_main() -> None:
    """``python vllm_validate.py OUT JOBS``; group files' paths on stdin, one a line."""
    out, jobs = Path(sys.argv[1]), int(sys.argv[2])
    worker(out, (Path(line.strip()) for line in sys.stdin if line.strip()), jobs)


# ---- the parent: plans with oominfer, one worker per compute capability -----------------


@dataclass(frozen=True, slots=True)
class Case:
    """One point of the matrix: a catalog model on ``count`` GPUs of a kind, one objective."""

    model_id: str
    gpu: str
    count: int
    prefer: str

    @property
    def key(self) -> str:
        return f"{self.model_id}|{self.gpu}|{self.count}|{self.prefer}"


@dataclass(frozen=True, slots=True)
class Planned:
    """A case's plan as vLLM is given it: the argv after ``-m module`` and the GPU it sees."""

    case: Case
    argv: tuple[str, ...]
    capability: tuple[int, int]
    gpu: dict[str, Any]
    """What the platform answers for this plan: GPUs per node (``count``: the GPUs of the
    node vLLM starts on), memory, device name."""
    summary: str


CLASSES: tuple[tuple[str, ...], ...] = (
    ("V100-SXM2-32GB",),  # 7.0
    ("T4-16GB",),  # 7.5
    ("A100-SXM-80GB",),  # 8.0
    ("A10G-24GB",),  # 8.6
    ("L4-24GB", "L40S-48GB"),  # 8.9
    ("H100-SXM-80GB", "H200-SXM-141GB"),  # 9.0
    ("B200-180GB",),  # 10.0
    ("RTX-PRO-6000-Blackwell-Server",),  # 12.0
)
"""The compute-capability classes vLLM tells apart, one or two GPU kinds each."""
COUNTS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
PREFERS: tuple[str, ...] = ("context", "throughput", "quality")


def matrix(model_ids: Sequence[str]) -> list[Case]:
    """Every model on every compute-capability class; the GPU kind within a class, the GPU
    count and the objective rotate so that each model meets many counts and every objective,
    and each class meets every count with many models."""
    cases = []
    for i, model_id in enumerate(model_ids):
        for j, kinds in enumerate(CLASSES):
            gpu = kinds[i % len(kinds)]
            count = COUNTS[(i + 3 * j) % len(COUNTS)]
            prefer = PREFERS[(i + j) % len(PREFERS)]
            cases.append(Case(model_id, gpu, count, prefer))
    return cases


def catalog_matrix() -> list[Case]:
    """The matrix over every model of oominfer's catalog."""
    from oominfer.model.catalog import catalog_ids

    return matrix(catalog_ids())


QUANTIZER_DEFAULTS: dict[str, Any] = {"group_size": 128, "desc_act": False, "sym": True}
"""What GPTQ and AutoRound write when not told otherwise. The catalog reconstructs some
quantized re-uploads' quantization_config from the checkpoint's name, without these fields
(vLLM requires them: quantization/auto_gptq.py, inc/inc.py); a real config.json has them."""


def catalog_config(model_id: str) -> dict[str, Any]:
    """The catalog's config.json, a reconstructed quantization_config completed."""
    from oominfer.model.catalog import _catalog

    entry = _catalog()[model_id]
    config: dict[str, Any] = json.loads(json.dumps(entry["config"]))
    quant = config.get("quantization_config")
    reconstructed = not entry.get("verbatim") and isinstance(quant, dict)
    if reconstructed and quant.get("quant_method") in ("gptq", "auto-round"):
        defaults = {**QUANTIZER_DEFAULTS, "sym": "asym" not in model_id.lower()}
        config["quantization_config"] = {**defaults, **quant}
    return config


def _model_folder(root: Path, model_id: str) -> Path:
    """The catalog's config.json (and hf_quant_config.json) in a folder of their own."""
    from oominfer.model.catalog import _catalog

    folder = root / model_id.replace("/", "--")
    if not folder.exists():
        entry = _catalog()[model_id]
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(catalog_config(model_id), indent=1))
        if entry.get("hf_quant_config"):
            (folder / "hf_quant_config.json").write_text(json.dumps(entry["hf_quant_config"]))
        _write_tokenizer(folder)
    return folder


def _write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of a few tokens: multimodal models build their processor (and
    so load a tokenizer) in ``__init__``; its vocabulary is never used."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = ["<unk>", "<s>", "</s>", "<|image|>", "<image>", "<|begin_of_text|>"]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(special)}, "<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(special)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 1 << 30}))  # fmt: skip


def _planned(case: Case, argv: Sequence[str], summary: str) -> Planned:
    """``argv`` (what follows ``-m module``) for ``case.count`` GPUs of ``case.gpu``."""
    from oominfer.hardware.gpu import find_gpu
    from oominfer.planning.constraints import Constraints

    spec = find_gpu(case.gpu)
    gpu = {
        "name": spec.name,
        "count": min(case.count, Constraints().gpus_per_node),
        "memory_bytes": spec.cuda_total_bytes,
        "device_name": (spec.product_label or spec.name).replace("-", " "),
    }
    return Planned(case, tuple(argv), spec.compute_capability, gpu, summary)


def plan_case(case: Case, root: Path) -> Planned | str:
    """The case's plan as vLLM sees it, or why there is none to validate."""
    import oominfer
    from oominfer.base.errors import DoesNotFitError, InvalidSettingError
    from oominfer.engines.vllm import serve_argv

    hardware = oominfer.Hardware.from_gpu(case.gpu, case.count)
    constraints = oominfer.Constraints(prefer=case.prefer)  # type: ignore[arg-type]
    try:
        plan = oominfer.plan(case.model_id, hardware, constraints)
    except DoesNotFitError as exc:
        return f"does not fit: {exc}"
    except InvalidSettingError as exc:  # oominfer's rules refuse it before vLLM would
        return f"refused by oominfer: {exc}"
    if plan.engine != "vllm":
        return f"planned for {plan.engine}"
    argv = serve_argv(str(_model_folder(root, case.model_id)), plan.settings)
    s = plan.settings
    summary = (
        f"tp={s.tensor_parallel_size} pp={s.pipeline_parallel_size} dtype={s.dtype} "
        f"quantization={s.quantization} kv={s.kv_cache_dtype} len={s.max_model_len}"
    )
    return _planned(case, argv[argv.index("-m") + 2 :], summary)


def manual(case: Case, flags: Sequence[str], root: Path) -> Planned:
    """A hand-written command line for the case's model on its GPUs (the suite's controls)."""
    argv = ["--model", str(_model_folder(root, case.model_id)), *flags]
    return _planned(case, argv, " ".join(flags))


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of one validation run."""

    vllm_version: str
    verdicts: dict[str, str | None]
    """Case key -> vLLM's error, None when accepted."""
    skipped: dict[str, str]
    """Case key -> why it has no vLLM plan (does not fit, planned for transformers)."""
    summaries: dict[str, str]
    """Case key -> the plan's main settings."""
    seconds: float
    worker_seconds: list[float]

    @property
    def rejected(self) -> dict[str, str]:
        """Case key -> vLLM's error, for the plans vLLM rejects."""
        return {k: v for k, v in self.verdicts.items() if v and not v.startswith(INCONCLUSIVE)}

    @property
    def inconclusive(self) -> dict[str, str]:
        """Case key -> why this machine could not finish the plan's checks."""
        return {k: v for k, v in self.verdicts.items() if v and v.startswith(INCONCLUSIVE)}


def worker_env(tmp: Path) -> dict[str, str]:
    """Offline, quiet, and every cache in ``tmp``."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
        "HF_HOME": str(tmp / "hf"),
    }


def validate(
    cases: Iterable[Case],
    *,
    controls: Sequence[tuple[Case, Sequence[str]]] = (),
    pythons: Sequence[str] = (sys.executable,),
    jobs: int = 2,
    timeout: float = 600,
    workdir: Path | None = None,
) -> list[Report]:
    """Plan every case with oominfer, then have each vLLM (one per interpreter of
    ``pythons``) validate each plan; one report per interpreter, in order.

    ``controls`` are hand-written command lines (case, flags) validated alongside. The workers
    import vLLM while the first class is planned; each class is handed to them as soon as it
    is planned. ``jobs``: children per worker at a time."""
    start = time.monotonic()
    tmp = workdir or Path(tempfile.mkdtemp(prefix="oominfer-vllm-validate-"))
    tmp.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    summaries: dict[str, str] = {}
    by_kind: dict[str, list[Case]] = {}
    for case in cases:
        by_kind.setdefault(case.gpu, []).append(case)
    unknown = {*by_kind, *(c.gpu for c, _ in controls)} - {k for kinds in CLASSES for k in kinds}
    if unknown:
        raise ValueError(f"GPU kinds outside CLASSES: {sorted(unknown)}")
    outs = [tmp / f"vllm-{i}" for i in range(len(pythons))]
    groups = []
    with contextlib.ExitStack() as stack:
        procs = []
        for python, out in zip(pythons, outs, strict=True):
            out.mkdir(exist_ok=True)
            log = stack.enter_context((out / "worker.log").open("w"))
            procs.append(subprocess.Popen([python, str(HERE), str(out), str(jobs)],
                                          stdin=subprocess.PIPE, stdout=log,
                                          stderr=subprocess.STDOUT, env=worker_env(out),
                                          text=True))  # fmt: skip
        try:
            for kinds in CLASSES:
                planned = [manual(c, flags, tmp / "models") for c, flags in controls
                           if c.gpu in kinds]  # fmt: skip
                for case in (c for kind in kinds for c in by_kind.get(kind, [])):
                    answer = plan_case(case, tmp / "models")
                    if isinstance(answer, str):
                        skipped[case.key] = answer
                    else:
                        summaries[case.key] = answer.summary
                        planned.append(answer)
                if not planned:
                    continue
                major, minor = planned[0].capability
                path = tmp / f"group-{major}.{minor}.json"
                plans = [{"key": p.case.key, "argv": list(p.argv), "gpu": p.gpu} for p in planned]
                path.write_text(json.dumps({"capability": [major, minor], "plans": plans}))
                groups.append(path)
                for proc in procs:
                    _tell(proc, f"{path}\n")
            for proc in procs:
                _tell(proc, None)
            for proc in procs:
                proc.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    seconds = time.monotonic() - start
    return [
        _report(python, proc, out, groups, skipped, summaries, seconds)
        for python, proc, out in zip(pythons, procs, outs, strict=True)
    ]


def _tell(proc: subprocess.Popen[str], line: str | None) -> None:
    """Name a group file to a worker (None: there are no more); a dead one is reported by
    ``_report``."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        if line is None:
            proc.stdin.close()
        else:
            proc.stdin.write(line)
            proc.stdin.flush()


def _report(
    python: str,
    proc: subprocess.Popen[str],
    out: Path,
    groups: list[Path],
    skipped: dict[str, str],
    summaries: dict[str, str],
    seconds: float,
) -> Report:
    verdicts: dict[str, str | None] = {}
    child_seconds = []
    missing = []
    for path in groups:
        result_path = out / f"{path.stem}.verdicts.json"
        if not result_path.exists():
            missing.append(path.name)
            continue
        result = json.loads(result_path.read_text())
        verdicts.update(result["verdicts"])
        child_seconds.append(result["seconds"])
    summary_path = out / "worker.json"
    if proc.returncode != 0 or missing or not summary_path.exists():
        log = (out / "worker.log").read_text(errors="replace")
        tail = "\n".join(log.strip().splitlines()[-30:])
        raise RuntimeError(
            f"the vLLM validation worker ({python}) failed (status {proc.returncode}; "
            f"no verdicts for {missing or 'none'}):\n{tail}"
        )
    summary = json.loads(summary_path.read_text())
    return Report(
        vllm_version=summary["vllm_version"],
        verdicts=verdicts,
        skipped=skipped,
        summaries=summaries,
        seconds=seconds,
        worker_seconds=[summary["import_seconds"], *child_seconds],
    )


if __name__ == "__main__":
    _worker_main()
