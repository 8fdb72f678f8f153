"""A candidate plan's predicted speed, over all its replicas (oominfer.speed). Pure."""

from __future__ import annotations

import dataclasses
import math

from oominfer.base.errors import DoesNotFitError, InvalidSettingError
from oominfer.base.units import counted
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.search import SEQ_STEPS, Candidate, estimate_for
from oominfer.speed import Performance, Workload, predict


def performance_of(
    cand: Candidate, spec: ModelSpec, hardware: Hardware, c: Constraints
) -> Performance | None:
    """The speed ``cand`` serves the typical request at: --concurrency requests when asked
    (spread over the replicas), else as many as it runs at once. Tokens/s, requests/s and
    the concurrency are of all replicas together."""
    if hardware.is_cpu:
        return None
    replicas = max(cand.replicas, 1)
    asked = c.concurrency or cand.running * replicas
    per_replica = Workload(
        input_len=c.input_len,
        output_len=c.output_len,
        concurrency=max(math.ceil(asked / replicas), 1),
    )
    perf = predict(
        spec,
        gpu=hardware.gpu,
        settings=cand.settings,
        breakdown=cand.breakdown,
        workload=per_replica,
    )
    if perf is None or replicas == 1:
        return perf
    return dataclasses.replace(
        perf,
        output_tokens_per_s=perf.output_tokens_per_s * replicas,
        requests_per_s=perf.requests_per_s * replicas,
        concurrency=perf.concurrency * replicas,
        requested_concurrency=asked,
    )


def meets(perf: Performance | None, c: Constraints) -> bool:
    """True when the predicted speed meets --max-tpot and --max-ttft."""
    if perf is None:
        return False
    return (c.max_tpot is None or perf.tpot_s <= c.max_tpot) and (
        c.max_ttft is None or perf.ttft_s <= c.max_ttft
    )


def _miss(perf: Performance, c: Constraints) -> float:
    """How far a plan misses the latency requirement, as the worst ratio to it."""
    ratios = [1.0]
    if c.max_tpot is not None:
        ratios.append(perf.tpot_s / c.max_tpot)
    if c.max_ttft is not None:
        ratios.append(perf.ttft_s / c.max_ttft)
    return max(ratios)


def _capped(
    cand: Candidate, spec: ModelSpec, hardware: Hardware, c: Constraints
) -> list[tuple[Candidate, Performance | None]]:
    """``cand`` with max_num_seqs lowered, step by step (SEQ_STEPS), until the requests it
    runs at once meet the latency requirement: each step tried, the last one that meets it
    or, where none does, down to one request. None where the concurrency is the user's
    (--concurrency, or max_num_seqs named)."""
    if c.concurrency or "max_num_seqs" in c.requested:
        return []
    tried: list[tuple[Candidate, Performance | None]] = []
    for n in SEQ_STEPS:
        if n >= cand.running:
            continue
        settings = dataclasses.replace(cand.settings, max_num_seqs=n)
        try:
            breakdown = estimate_for(spec, hardware, settings, c)
        except InvalidSettingError:
            continue
        if not breakdown.fits:
            continue
        capped = dataclasses.replace(cand, settings=settings, breakdown=breakdown)
        perf = performance_of(capped, spec, hardware, c)
        tried.append((capped, perf))
        if meets(perf, c):
            break
    return tried


def fastest_within(
    found: list[Candidate], spec: ModelSpec, hardware: Hardware, c: Constraints
) -> Candidate:
    """The candidate with the most output tokens/s among those that meet the latency
    requirement. A candidate that misses it at the requests it runs at once is tried with
    fewer (max_num_seqs lowered until it meets it): a latency bound is a bound on the load
    a replica takes, so 4 GPUs at TP 4 and 32 requests can meet a TPOT that a GPU each at
    full load cannot.

    Raises:
        DoesNotFitError: none meets it; the message names the closest and what it predicts.
    """
    scored = [(cand, performance_of(cand, spec, hardware, c)) for cand in found]
    scored += [
        pair
        for cand, p in list(scored)
        if p is not None and not meets(p, c)
        for pair in _capped(cand, spec, hardware, c)
    ]
    ok = [(cand, p) for cand, p in scored if p is not None and meets(p, c)]
    if ok:
        return max(ok, key=lambda pair: pair[1].output_tokens_per_s)[0]
    known = [(cand, p) for cand, p in scored if p is not None]
    asked = latency_asked(c)
    if not known:
        raise DoesNotFitError(
            f"no plan's speed can be predicted on {hardware.gpu.name}, so none can be shown "
            f"to meet {asked}.",
            hint="Leave --max-tpot/--max-ttft out, or name a GPU from `oominfer gpus`.",
        )
    cand, p = min(known, key=lambda pair: _miss(pair[1], c))
    s = cand.settings
    raise DoesNotFitError(
        f"no plan meets {asked} at {counted(p.concurrency, 'request')} of {c.input_len:,}+"
        f"{c.output_len:,} tokens; the closest (-tp {s.tensor_parallel_size}, "
        f"{s.quantization or 'native weights'}) predicts TPOT {p.tpot_s:.4f} s and TTFT "
        f"{p.ttft_s:.3f} s.",
        ways_out=_latency_ways_out(c),
    )


def latency_asked(c: Constraints) -> str:
    """The latency requirement as typed: ``--max-tpot 0.03 and --max-ttft 1``."""
    return " and ".join(
        f"{flag} {value:g}"
        for flag, value in (("--max-tpot", c.max_tpot), ("--max-ttft", c.max_ttft))
        if value is not None
    )


def _latency_ways_out(c: Constraints) -> list[str]:
    """Flag changes that lower the latency of every plan."""
    ways = []
    if c.concurrency:
        ways.append(f"--concurrency {max(c.concurrency // 2, 1)}")
    ways.append("more or faster GPUs (--gpus, --gpu)")
    if c.max_ttft is not None and c.input_len > 256:
        ways.append(f"--input-len {c.input_len // 2} (a shorter prompt, for --max-ttft)")
    return ways
