"""The ``oominfer`` command line: a thin layer over the Python API."""

from oominfer.cli.app import main

__all__ = ["main"]
