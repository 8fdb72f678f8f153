"""``python -m oominfer.engines.transformers``: the transformers engine's OpenAI server."""

from __future__ import annotations

import sys

from oominfer.engines.transformers.cli import main
from oominfer.runtime.amx import apply_in_process

if __name__ == "__main__":
    # Started by hand on a host whose CPU traps AMX: run without it (oneDNN reads the setting
    # at its first kernel, so after torch is imported is still in time).
    if note := apply_in_process():
        print(note, file=sys.stderr, flush=True)
    sys.exit(main())
