"""oominfer: make a large language model fit the GPU you have, prove it, serve it, deploy it."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
