"""The objective: which of the configurations that fit is best for what the user prefers."""

from __future__ import annotations

import math
from typing import Final

from oominfer.planning.constraints import Prefer
from oominfer.planning.search import Candidate

# Quality cost of each weight format, lower is better (the planner prefers the cheapest).
_QUANT_RANK: Final = {None: 0, "fp8_per_tensor": 1, "int8": 2, "bitsandbytes": 3}


def sort_key(cand: Candidate, prefer: Prefer) -> tuple[float, ...]:
    """Sort key: smaller is better."""
    s, b = cand.settings, cand.breakdown
    quant = _QUANT_RANK.get(s.quantization, 1)
    kv = 1 if s.kv_cache_dtype != "auto" else 0
    gpus = s.world_size
    pp = s.pipeline_parallel_size  # within a node tensor parallel beats pipeline stages
    seqs = min(s.max_num_seqs or 1, math.floor(max(b.max_concurrency, 0)))
    batched = -(s.max_num_batched_tokens or 1 << 30)
    match prefer:
        case "throughput":
            return (-seqs, int(s.enforce_eager), gpus, pp, quant, kv, batched, -cand.context)
        case "quality":
            return (quant, kv, gpus, pp, -cand.context, int(s.enforce_eager), -seqs, batched)
        case _:
            return (-cand.context, quant, kv, gpus, pp, -seqs, int(s.enforce_eager), batched)
