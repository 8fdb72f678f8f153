"""The transformers engine with an out-of-memory fault injected: a test's engine, not the product's.

    python tests/oom_fault.py AT [server flags...]

Runs ``python -m oominfer.engines.transformers [server flags...]`` after adding a forward
pre-hook (torch's own mechanism) to the loaded model, so the AT-th forward pass with a batch of
two or more sequences raises ``torch.OutOfMemoryError``, once. The product carries no hook:
what runs is the real server, scheduler and out-of-memory guard, with a model that fails where
a real one would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# This file's folder is on sys.path, not the repository: import the checkout's oominfer.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The package first: it sets the OpenMP wait policy before torch loads.
from oominfer.engines.transformers import cli, runner


def install(at: int) -> None:
    """Make the ``at``-th forward pass with batch size > 1 raise torch.OutOfMemoryError."""
    import torch

    load = runner.ModelRunner.load.__func__  # type: ignore[attr-defined]
    count = 0

    def fail(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        nonlocal count
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[0] < 2:
            return
        count += 1
        if count == at:
            raise torch.OutOfMemoryError(
                f"injected out-of-memory error at forward pass {at} with batch size "
                f"{ids.shape[0]} (tests/oom_fault.py)"
            )

    def load_failing(cls: type[runner.ModelRunner], config: Any) -> runner.ModelRunner:
        engine: runner.ModelRunner = load(cls, config)
        engine.model.register_forward_pre_hook(fail, with_kwargs=True)
        return engine

    runner.ModelRunner.load = classmethod(load_failing)  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    install(int(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
