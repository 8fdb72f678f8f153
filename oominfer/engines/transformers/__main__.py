"""``python -m oominfer.engines.transformers``: the transformers engine's OpenAI server."""

from __future__ import annotations

import sys

from oominfer.engines.transformers.cli import main

if __name__ == "__main__":
    sys.exit(main())
