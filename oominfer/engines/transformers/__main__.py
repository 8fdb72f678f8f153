"""``python -m oominfer.engines.transformers``: the transformers engine's OpenAI server."""

from __future__ import annotations

import sys

from oominfer.engines.amx import apply_in_process

if __name__ == "__main__":
    # Started by hand on a host whose CPU traps AMX: start without it, before torch loads.
    if note := apply_in_process():
        print(note, file=sys.stderr, flush=True)
    from oominfer.engines.transformers.cli import main

    sys.exit(main())
