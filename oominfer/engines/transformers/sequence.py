"""One request's generation: its state, the events it sends back, and how its tokens are drawn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from oominfer.engines.transformers.protocol import ApiError


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New text for the client (may be empty while a multi-byte character is incomplete)."""

    text: str


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The sequence ended."""

    reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The sequence failed; the others go on."""

    error: ApiError


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass(eq=False)
class Seq:
    """One request's generation state, owned by the scheduler's worker thread."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    generator: torch.Generator | None = None
    """Seeded from the request's ``seed``; None draws from torch's global generator."""
    emit: Callable[[Event], None] = lambda event: None
    generated: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    sent: str = ""
    done: bool = False
    cancelled: bool = False
    solo: bool = False
    """Failed for memory beside others: retried alone before it is failed."""

    @property
    def ids(self) -> list[int]:
        """Prompt plus output: what a re-prefill after an out-of-memory error runs."""
        return self.prompt + self.generated


def sample(
    logits: torch.Tensor, seqs: Sequence[Seq], fail: Callable[[Seq, Exception], None]
) -> list[int]:
    """One token per row: greedy at temperature 0, else drawn with temperature and top_p.

    A row whose draw raises is handed to ``fail`` (its token is then meaningless); the other
    rows go on.
    """
    tokens: list[int] = logits.argmax(-1).tolist()
    for row, seq in enumerate(seqs):
        if seq.temperature <= 1e-5:
            continue
        try:
            tokens[row] = _draw(logits[row], seq)
        except Exception as err:
            fail(seq, err)
    return tokens


def _draw(logits: torch.Tensor, seq: Seq) -> int:
    probs = torch.softmax(logits / seq.temperature, dim=-1)
    if seq.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > seq.top_p
        sorted_probs[outside] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=seq.generator))
