"""The speed model: how fast a plan serves, predicted from a roofline of its GPU."""

from oominfer.speed.measured import Measured, calibrated
from oominfer.speed.performance import Performance, predict
from oominfer.speed.workload import Workload

__all__ = ["Measured", "Performance", "Workload", "calibrated", "predict"]
