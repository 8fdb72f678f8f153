"""The speed model: how fast a plan serves, predicted from a roofline of its GPU."""

from oominfer.speed.performance import Performance, predict
from oominfer.speed.workload import Workload

__all__ = ["Performance", "Workload", "predict"]
