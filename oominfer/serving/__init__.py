"""Serving a plan: the engine's command, checked extra flags, signals and the exit status."""
