"""oominfer's version, in one place (the plan files and the manifests record it)."""

__version__ = "0.1.0"
