"""oominfer: make a large language model fit the GPU you have, prove it, serve it, deploy it.

The Python API (see ``oominfer.api``)::

    import oominfer

    model = oominfer.load_model("meta-llama/Llama-3.1-8B-Instruct")
    hardware = oominfer.Hardware.from_gpu("L4")
    breakdown = oominfer.estimate(model, hardware)          # vLLM's defaults
    plan = oominfer.plan(model, hardware, oominfer.Constraints(prefer="quality"))
    plan = oominfer.fit(model, oominfer.Hardware.cpu(6 * 2**30), verify=True)
"""

from __future__ import annotations

from oominfer.api import FitListener, can_verify, estimate, fit, load_model, plan
from oominfer.base.version import __version__
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Plan
from oominfer.settings import EngineSettings

__all__ = [
    "Constraints",
    "EngineSettings",
    "FitListener",
    "Hardware",
    "MemoryBreakdown",
    "ModelSpec",
    "Plan",
    "__version__",
    "can_verify",
    "estimate",
    "fit",
    "load_model",
    "plan",
]
