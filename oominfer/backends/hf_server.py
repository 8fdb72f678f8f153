"""``python -m oominfer.backends.hf_server``: the transformers backend's server.

The code lives in the package ``oominfer.backends.hf`` (see its docstring); this module keeps
the name that ``oominfer.probe`` and ``oominfer.serve`` launch.
"""

from __future__ import annotations

import sys

from oominfer.backends.hf import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
