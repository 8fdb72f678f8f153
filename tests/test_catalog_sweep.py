"""Every catalog model through the CLI on two GPUs, with the flags operators reach for first:
no traceback, an exit code from the documented set, one JSON document, finite speed figures
where a plan fits and a way out where it does not. (A sweep like this found
``estimate --max-model-len auto`` exiting 2 on every model, and sliding-window plans on the
transformers engine promising 0 requests.)"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner

from oominfer.cli import main
from oominfer.model.catalog import catalog_ids

GPUS = ("L4", "H100")
RUNS = (
    ("estimate",),
    ("estimate", "--max-model-len", "auto"),
    ("estimate", "--engine", "transformers"),
    ("fit", "--no-verify"),
    ("fit", "--no-verify", "--max-tpot", "0.05"),
)


def _speed_is_finite(perf: dict[str, Any]) -> bool:
    keys = ("ttft_s", "tpot_s", "output_tokens_per_s", "requests_per_s")
    return all(math.isfinite(perf[k]) and perf[k] > 0 for k in keys)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("run", RUNS, ids=" ".join)
def test_every_catalog_model_gets_a_clear_answer(run: tuple[str, ...], gpu: str) -> None:
    command, *flags = run
    runner = CliRunner()
    for model in catalog_ids():
        args = [command, model, "--gpu", gpu, "--json", *flags]
        result = runner.invoke(main, args)
        where = " ".join(args)
        assert result.exit_code in (0, 2, 3), f"{where}: exit {result.exit_code}\n{result.output}"
        assert "Traceback" not in result.output, where
        doc = json.loads(result.stdout)
        if result.exit_code == 0:
            perf = doc["performance"]
            assert perf is None or _speed_is_finite(perf), f"{where}: {perf}"
            if command == "fit":
                assert perf is not None, f"{where}: a plan on a catalog GPU without a speed"
                if "--max-tpot" in flags:
                    assert perf["tpot_s"] <= 0.05, where
        else:
            assert doc["message"], where
            if result.exit_code == 3 and not (doc["hint"] or doc["ways_out"]):
                # No way out only where `fit` itself refuses the checkpoint there.
                engine = flags[flags.index("--engine") + 1] if "--engine" in flags else "vllm"
                fit = runner.invoke(
                    main, ["fit", model, "--gpu", gpu, "--engine", engine, "--no-verify"]
                )
                assert fit.exit_code == 2, f"{where}: no way out\n{doc['message']}"
