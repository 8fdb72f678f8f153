"""The model: loading it per the settings, and its prefill and decode forward passes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from oominfer.base.errors import ModelNotFoundError
from oominfer.engines.transformers.config import ServerConfig
from oominfer.engines.transformers.kv import Batch
from oominfer.settings import json_object

log = logging.getLogger("oominfer.transformers")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a settings dtype name."""
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def resolve_device(requested: str) -> str:
    """``cuda`` when asked for (or ``auto``) and torch sees a GPU, else ``cpu``."""
    if requested == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        log.warning("The plan asks for CUDA but torch sees no GPU: serving on the CPU.")
    return "cpu"


def model_kwargs(config: ServerConfig) -> tuple[str, dict[str, Any]]:
    """The device and ``from_pretrained`` keyword arguments the settings ask for: dtype,
    bitsandbytes int8/nf4 (placed on the device as loaded), sdpa attention."""
    import transformers

    bnb_config: Any = transformers.BitsAndBytesConfig
    s = config.settings
    device = resolve_device(config.device)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
    if s.dtype != "auto":
        dtype: Any = torch_dtype(s.dtype)
    elif s.quantization == "int8":
        # LLM.int8 multiplies in float16: other dtypes are cast on every forward.
        dtype = torch.float16
    else:
        dtype = "auto"
    kwargs["dtype"] = dtype
    if s.quantization == "int8":
        kwargs["quantization_config"] = bnb_config(load_in_8bit=True)
    elif s.quantization == "bitsandbytes":
        compute = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
        kwargs["quantization_config"] = bnb_config(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
        )
    elif s.quantization is not None:
        log.warning(
            "--quantization %s: the checkpoint's own quantization config is used as is.",
            s.quantization,
        )
    overrides = json_object("hf_overrides", s.hf_overrides)
    if overrides:
        # vLLM's --hf-overrides: the config.json keys replaced before the model is built
        # (its RoPE included), as vLLM applies them.
        auto_config: Any = transformers.AutoConfig
        model_config = auto_config.from_pretrained(config.model, revision=config.revision)
        model_config.update(overrides)
        kwargs["config"] = model_config
    if "quantization_config" in kwargs:
        kwargs["device_map"] = {"": device}
        # Each LLM.int8 matmul logs a cast warning otherwise.
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    return device, kwargs


class ModelRunner:
    """A causal LM and its tokenizer; every forward pass runs under ``inference_mode``."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str) -> None:
        """Wrap a loaded model."""
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.forward_passes = 0
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_id: int = int(pad)
        self.vocab_size: int = int(model.get_input_embeddings().weight.shape[0])
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        self.eos_ids: frozenset[int] = frozenset(eos)
        self.weights_bytes: int = int(model.get_memory_footprint())

    @classmethod
    def load(cls, config: ServerConfig) -> ModelRunner:
        """Load the model per the settings: dtype, bitsandbytes int8/nf4, sdpa attention.

        Raises:
            ModelNotFoundError: the folder or id cannot be loaded.
        """
        import transformers

        # transformers' own annotations are partial: keep its objects as Any at this edge.
        auto_model: Any = transformers.AutoModelForCausalLM
        auto_tokenizer: Any = transformers.AutoTokenizer
        device, kwargs = model_kwargs(config)
        try:
            tokenizer = auto_tokenizer.from_pretrained(config.model, revision=config.revision)
            model = auto_model.from_pretrained(config.model, revision=config.revision, **kwargs)
        except (OSError, ValueError) as err:
            raise ModelNotFoundError(
                f"cannot load {config.model!r} with transformers: {err}",
                hint="Pass --model with a local folder holding config.json, weights and a "
                "tokenizer.",
            ) from None
        if "quantization_config" not in kwargs:
            model.to(device)
        model.eval()
        if "config" in kwargs:
            c = model.config
            rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None)
            log.info("Config overridden (--hf-overrides): max_position_embeddings %s, RoPE %s",
                     getattr(c, "max_position_embeddings", None), rope)  # fmt: skip
        return cls(model, tokenizer, device=device)

    def _forward(self, **inputs: Any) -> Any:
        self.forward_passes += 1
        with torch.inference_mode():
            return self.model(**inputs, use_cache=True, logits_to_keep=1)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run left-padded prompts; return (cache, mask, last-position logits as float32)."""
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self._forward(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache
        )
        return out.past_key_values, mask, out.logits[:, -1, :].float()

    def decode(self, batch: Batch) -> torch.Tensor:
        """One step for the whole batch; updates its cache and mask; returns float32 logits."""
        ones = torch.ones((batch.mask.shape[0], 1), dtype=batch.mask.dtype, device=self.device)
        mask = torch.cat([batch.mask, ones], dim=1)
        positions = mask.sum(-1, keepdim=True) - 1
        out = self._forward(
            input_ids=batch.last[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=batch.cache,
        )
        batch.mask = mask
        batch.cache = out.past_key_values
        return out.logits[:, -1, :].float()  # type: ignore[no-any-return]
