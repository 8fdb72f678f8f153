"""The running batch and its KV cache: merging new rows in, dropping finished ones, its size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from oominfer.engines.transformers.sequence import Seq


@dataclass(slots=True)
class Batch:
    """The running batch: its cache, left-padded mask, last sampled tokens and sequences."""

    cache: Any
    mask: torch.Tensor
    last: torch.Tensor
    seqs: list[Seq]


def can_merge(cache: Any) -> bool:
    """True when every layer keeps keys and values by token, all of them or a sliding window
    of them (``DynamicLayer``, ``DynamicSlidingWindowLayer``): rows can join and leave. A
    cache of other states (a hybrid model's) cannot take new rows."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers)


def _kept(layer: Any, width: int) -> int:
    """Tokens a layer holds for a batch whose mask is ``width`` wide: all of them, or a
    sliding-window layer's last ``sliding_window - 1`` (the mask's last columns)."""
    if getattr(layer, "is_sliding", False):
        return int(min(width, layer.sliding_window - 1))
    return width


def _set_width(layer: Any, width: int) -> None:
    """A sliding-window layer sizes its attention mask by the tokens it has seen: the mask's
    width once rows are padded or trimmed."""
    if getattr(layer, "is_sliding", False):
        layer.cumulative_length = width


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad dim -2 (a cache's sequence axis) on the left with zeros."""
    if width == 0:
        return t
    return torch.cat([t.new_zeros((*t.shape[:-2], width, t.shape[-1])), t], dim=-2)


def merge_batches(a: Batch, b: Batch) -> Batch:
    """Append ``b``'s rows to ``a``: masks left-padded to the longer of the two, each layer's
    keys and values to what that layer keeps of it (all of it, or its window less one)."""
    la, lb = a.mask.shape[1], b.mask.shape[1]
    width = max(la, lb)
    for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
        kept = _kept(layer_a, width)
        pad_a, pad_b = kept - layer_a.keys.shape[-2], kept - layer_b.keys.shape[-2]
        layer_a.keys = torch.cat([_pad_left(layer_a.keys, pad_a), _pad_left(layer_b.keys, pad_b)])
        layer_a.values = torch.cat(
            [_pad_left(layer_a.values, pad_a), _pad_left(layer_b.values, pad_b)]
        )
        _set_width(layer_a, width)
    mask = torch.cat(
        [
            torch.nn.functional.pad(a.mask, (width - la, 0)),
            torch.nn.functional.pad(b.mask, (width - lb, 0)),
        ]
    )
    return Batch(cache=a.cache, mask=mask, last=torch.cat([a.last, b.last]), seqs=a.seqs + b.seqs)


def select_rows(batch: Batch, keep: list[int], *, trim: bool) -> Batch:
    """Keep only rows ``keep``; with ``trim``, drop the left columns that are padding in all."""
    index = torch.tensor(keep, dtype=torch.long, device=batch.mask.device)
    batch.cache.batch_select_indices(index)
    mask, last = batch.mask[index], batch.last[index]
    if trim:
        used = (mask.sum(0) > 0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first > 0:
            mask = mask[:, first:]
            width = mask.shape[1]
            for layer in batch.cache.layers:
                kept = _kept(layer, width)
                layer.keys = layer.keys[:, :, layer.keys.shape[-2] - kept :, :]
                layer.values = layer.values[:, :, layer.values.shape[-2] - kept :, :]
                _set_width(layer, width)
    return Batch(cache=batch.cache, mask=mask, last=last, seqs=[batch.seqs[i] for i in keep])


def cache_bytes(batch: Batch | None) -> int:
    """Bytes of the batch's keys and values (0 without a batch)."""
    if batch is None:
        return 0
    total = 0
    for layer in list(batch.cache.layers):
        for t in (layer.keys, layer.values):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total
