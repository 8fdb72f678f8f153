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
    """True when every layer is a plain ``DynamicLayer`` (no sliding window): rows can join."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad dim -2 (a cache's sequence axis) on the left with zeros."""
    if width == 0:
        return t
    return torch.cat([t.new_zeros((*t.shape[:-2], width, t.shape[-1])), t], dim=-2)


def merge_batches(a: Batch, b: Batch) -> Batch:
    """Append ``b``'s rows to ``a``: caches and masks left-padded to the longer of the two."""
    la, lb = a.mask.shape[1], b.mask.shape[1]
    width = max(la, lb)
    for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
        layer_a.keys = torch.cat(
            [_pad_left(layer_a.keys, width - la), _pad_left(layer_b.keys, width - lb)]
        )
        layer_a.values = torch.cat(
            [_pad_left(layer_a.values, width - la), _pad_left(layer_b.values, width - lb)]
        )
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
            for layer in batch.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]
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
