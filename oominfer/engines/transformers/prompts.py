"""From a validated request to a sequence: the model name, the prompt's tokens, the limits."""

from __future__ import annotations

from typing import Any

from oominfer.engines.transformers.config import ServerConfig
from oominfer.engines.transformers.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
)
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.sequence import Seq

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions`` (chat defaults to the context)."""


class SeqBuilder:
    """Checks a request against the served model and its limits, and makes its sequence."""

    def __init__(self, config: ServerConfig, engine: ModelRunner, *, max_model_len: int) -> None:
        """Check against ``config``'s names and ``engine``'s tokenizer and vocabulary."""
        self.config = config
        self.engine = engine
        self.max_model_len = max_model_len

    def completion(self, req: CompletionRequest) -> Seq:
        """The sequence of ``POST /v1/completions``.

        Raises:
            ApiError: 404 for another model, 400 for what cannot be served.
        """
        self._check_model(req.model)
        max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
        return self._new_seq(req, self._completion_prompt(req), max_tokens, "prompt")

    def chat(self, req: ChatRequest) -> Seq:
        """The sequence of ``POST /v1/chat/completions``.

        Raises:
            ApiError: 404 for another model, 400 for what cannot be served.
        """
        self._check_model(req.model)
        max_tokens = req.max_completion_tokens or req.max_tokens
        return self._new_seq(req, self._chat_prompt(req), max_tokens, "messages")

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.served_model_name, self.config.model):
            raise ApiError(
                404,
                f"The model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}.",
                param="model",
                code="model_not_found",
            )

    def _new_seq(
        self, req: SamplingRequest, prompt: list[int], max_tokens: int | None, what: str
    ) -> Seq:
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported by the transformers backend.", param="n")
        if req.logprobs not in (None, False, 0):
            raise ApiError(
                400, "logprobs are not supported by the transformers backend.", param="logprobs"
            )
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
            max_tokens = limit - len(prompt)
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
        return Seq(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(s for s in stop if s),
            ignore_eos=req.ignore_eos,
            seed=req.seed,
        )

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        if req.echo:
            raise ApiError(400, "echo is not supported by the transformers backend.", param="echo")
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
