"""vLLM's speculative-decoding rules (vllm/config/speculative.py, 0.32), as data.

``--speculative-config`` is a JSON object; vLLM infers the method when it is left out and
refuses configurations before it loads anything. Pure.
"""

from __future__ import annotations

from typing import Any, Final

from oominfer.model.spec import ModelSpec

MTP_ALIASES: Final = frozenset(
    {"deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp", "longcat_flash_mtp",
     "pangu_ultra_moe_mtp", "step3p5_mtp", "gemma4_mtp", "glm5_next_mtp"}
)  # fmt: skip
"""Model-specific MTP spellings vLLM still takes and maps to ``mtp`` (with a warning)."""

NO_MODEL_METHODS: Final = frozenset({"ngram", "ngram_gpu", "suffix"})
"""Proposers that need no weights: they look tokens up in the prompt and output."""

METHODS: Final = frozenset(
    {"draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator", "dflash", "dspark",
     "custom_class", "extract_hidden_states"}
) | NO_MODEL_METHODS  # fmt: skip
"""vLLM's ``SpeculativeMethod`` values (besides the MTP aliases)."""


def speculative_method(spec: ModelSpec, config: dict[str, Any]) -> str | None:
    """The method vLLM runs for ``config`` (``SpeculativeConfig.__post_init__``): the one
    named, else ngram for ``"model": "ngram"``, eagle/eagle3 from the draft's name, else
    draft_model. None without a config."""
    if not config:
        return None
    method = config.get("method")
    model = config.get("model")
    if method in MTP_ALIASES:
        return "mtp"
    if method == "[ngram]":
        return "ngram"
    if method is not None:
        return str(method)
    if model in ("ngram", "[ngram]"):
        return "ngram"
    name = str(model or "").lower()
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    return "draft_model"


def drafted_tokens(spec: ModelSpec, config: dict[str, Any]) -> int:
    """Tokens drafted per step: ``num_speculative_tokens``, or for MTP without one the
    model's MTP layers (``SpeculativeConfig.__post_init__`` takes ``n_predict``); 0 without
    speculative decoding."""
    tokens = config.get("num_speculative_tokens") if config else None
    if isinstance(tokens, int):
        return tokens
    if speculative_method(spec, config) == "mtp":
        return max(1, spec.mtp_layers)
    return 0


def refusal(spec: ModelSpec, config: dict[str, Any]) -> str | None:
    """Why vLLM refuses ``config`` for ``spec``, or None.

    - ``num_speculative_tokens`` must be a positive integer (``Field(gt=0)``);
    - an unknown method fails pydantic's ``SpeculativeMethod`` literal;
    - a method that needs a model without one ("num_speculative_tokens was provided but
      without speculative model"); mtp on a model without MTP layers.
    """
    if not config:
        return None
    tokens = config.get("num_speculative_tokens")
    if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
        return f"num_speculative_tokens must be a positive integer, got {tokens!r}"
    method = speculative_method(spec, config)
    if method not in METHODS:
        return f"unknown speculative method {method!r}; vLLM takes {', '.join(sorted(METHODS))}"
    if method == "mtp" and config.get("model") is None and spec.mtp_layers == 0:
        return (
            f"method mtp drafts with the model's own MTP layers, and {spec.model_id} has none "
            "(no num_nextn_predict_layers in its config.json)"
        )
    if config.get("model") is None and method not in NO_MODEL_METHODS | {"mtp"}:
        return f'method {method} needs a draft: add "model" to the speculative config'
    if tokens is None and method != "mtp":
        return "num_speculative_tokens is missing"
    return None
