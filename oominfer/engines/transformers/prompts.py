"""From a validated request to a sequence: the model name, the prompt's tokens, the limits.

``SeqBuilder``'s methods tokenize and may take seconds on a long prompt: the server runs them
on a worker thread, never on the event loop.
"""

from __future__ import annotations

from typing import Any

import torch

from oominfer.engines.transformers.config import DEFAULT_MAX_TOKENS, ServerConfig
from oominfer.engines.transformers.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
)
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.sequence import Seq

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's and vLLM's default ``max_tokens`` for ``/v1/completions``."""


def default_max_tokens(flag: int | None, generation_config: Any) -> int:
    """``max_tokens`` of a chat that gives none, before the context left bounds it too.

    vLLM's OpenAI server (``get_max_tokens``, 0.32) takes the least of the context left after
    the prompt, the checkpoint's generation_config.json ``max_new_tokens`` and
    ``--override-generation-config '{"max_new_tokens": N}'``; with neither set, a chat runs to
    the end of the context (a temperature-0 chat reached 28k tokens in four minutes). Here
    ``--default-max-tokens`` plays the override's part, and without either a chat stops at
    ``DEFAULT_MAX_TOKENS`` (``finish_reason: "length"``); a request's own ``max_tokens`` may
    ask for more, up to the context.
    """
    if flag is not None:
        return flag
    checkpoint = getattr(generation_config, "max_new_tokens", None)
    if isinstance(checkpoint, int) and checkpoint > 0:
        return checkpoint
    return DEFAULT_MAX_TOKENS


class SeqBuilder:
    """Checks a request against the served model and its limits, and makes its sequence."""

    def __init__(self, config: ServerConfig, engine: ModelRunner, *, max_model_len: int) -> None:
        """Check against ``config``'s names and ``engine``'s tokenizer and vocabulary."""
        self.config = config
        self.engine = engine
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens(
            config.default_max_tokens, getattr(engine.model, "generation_config", None)
        )

    def completion(self, req: CompletionRequest) -> Seq:
        """The sequence of ``POST /v1/completions``.

        Raises:
            ApiError: 404 for another model, 400 for what cannot be served.
        """
        self._check(req)
        prompt = self._completion_prompt(req)
        return self._new_seq(req, prompt, req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, "prompt")

    def chat(self, req: ChatRequest) -> Seq:
        """The sequence of ``POST /v1/chat/completions``.

        Raises:
            ApiError: 404 for another model, 400 for what cannot be served.
        """
        self._check(req)
        max_tokens = req.max_completion_tokens or req.max_tokens
        prompt = self._chat_prompt(req)
        return self._new_seq(req, prompt, max_tokens, self.default_max_tokens, "messages")

    def _check(self, req: SamplingRequest) -> None:
        """What needs no tokenizing: the model's name, fields this backend does not do."""
        model = req.model
        if model is not None and model not in (self.config.served_model_name, self.config.model):
            raise ApiError(
                404,
                f"The model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}.",
                param="model",
                code="model_not_found",
            )
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported by the transformers backend.", param="n")
        field = req.unsupported()
        if field is not None:
            raise ApiError(
                400,
                f"{field} is not supported by the transformers backend: leave it out.",
                param=field,
                code="unsupported_parameter",
            )

    def _new_seq(
        self,
        req: SamplingRequest,
        prompt: list[int],
        max_tokens: int | None,
        default: int,
        what: str,
    ) -> Seq:
        if not prompt:
            raise ApiError(400, f"The {what} is empty.", param=what)
        bad = [t for t in prompt if not 0 <= t < self.engine.vocab_size]
        if bad:
            raise ApiError(
                400,
                f"Token id {bad[0]} is out of range: the vocabulary has "
                f"{self.engine.vocab_size} tokens.",
                param=what,
            )
        limit = self.max_model_len
        if max_tokens is None:
            max_tokens = min(default, limit - len(prompt))
            if max_tokens < 1:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"{what} has {len(prompt)} tokens, leaving no room for a completion. "
                    f"Please reduce the length of the {what}.",
                    param=what,
                    code="context_length_exceeded",
                )
        elif len(prompt) + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the {what}, {max_tokens} "
                f"in the completion). Please reduce the length of the {what} or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        generator = None
        if req.seed is not None:  # made here, so that a seed torch refuses fails this request
            try:
                generator = torch.Generator(device=self.engine.device).manual_seed(req.seed)
            except (RuntimeError, ValueError, OverflowError) as err:
                raise ApiError(
                    400, f"seed {req.seed} is not usable: {err}.", param="seed"
                ) from None
        return Seq(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(s for s in stop if s),
            ignore_eos=req.ignore_eos,
            generator=generator,
        )

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(
                    400, "Send one prompt per request (batched prompts are not supported).",
                    param="prompt",
                )  # fmt: skip
            prompt = prompt[0]
        if isinstance(prompt, str):
            return list(self.engine.tokenizer(prompt)["input_ids"])
        if not all(isinstance(t, int) for t in prompt):
            raise ApiError(400, "prompt must be a string or a list of token ids.", param="prompt")
        return [t for t in prompt if isinstance(t, int)]

    def _chat_prompt(self, req: ChatRequest) -> list[int]:
        tokenizer = self.engine.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "This model's tokenizer has no chat template: use /v1/completions.")
        messages: list[dict[str, Any]] = []
        for m in req.messages:
            message = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                message["content"] = "".join(
                    str(part.get("text", "")) for part in m.content if part.get("type") == "text"
                )
            messages.append(message)
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt, tokenize=False
            )
        except Exception as err:  # jinja2 errors from the template itself
            raise ApiError(
                400, f"The chat template rejected the messages: {err}", param="messages"
            ) from None
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
